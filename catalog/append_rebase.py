"""Which stale commits the catalog makes again on the branch's head instead of refusing them.

A commit whose only failed requirement is its branch's snapshot (another commit landed since its
writer loaded the table) is refused with 409, and the writer makes it again on the new head: a
round trip, a manifest list and a metadata file per attempt, and with eight writers on one table
most attempts lose again. When the commit is a fast append (one `append` snapshot set as the
branch's head, nothing else changed), the catalog does that redo itself (catalog/rebase.py),
once, where the commit is staged, and answers with the metadata it committed.

Not rebased, so refused as before:

- a table, namespace or warehouse that says `isbre.commit.rebase-appends=false`;
- a snapshot whose summary carries an exactly-once committer's marker (`EXACTLY_ONCE_MARKERS`):
  such a writer relies on the stale-branch refusal to fence a zombie instance;
- a sink's snapshot declaring source offsets the table already holds (its writer re-reads the
  coverage on the refusal and drops them);
- anything else: a merge-append (its manifests rewrite existing entries), an overwrite, a delete,
  a row delta, a commit that also changes the schema, spec, sort order or properties, a
  transaction of several tables (one table's commit sent as a transaction is rebased like any).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from isbre.catalog.coverage import Coverage, snapshot_spans
from isbre.catalog.identifiers import Identifier
from isbre.catalog.manifest_cache import ManifestCache
from isbre.catalog.places import Places
from isbre.catalog.rebase import NotRebasedError, Remembered, appended_again
from isbre.catalog.requirements import check_requirement
from isbre.catalog.store import TABLE, Store
from isbre.catalog.table_properties import REBASE_APPENDS
from isbre.catalog.table_staging import TableChange
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate

log = logging.getLogger(__name__)

# Summary properties of committers that fence their zombies with the stale-branch refusal: Flink's
# Iceberg sink (the last checkpoint it committed) and Iceberg's Kafka Connect sink (its commit id,
# and its consumer offsets under `kafka.connect.offsets.<control topic>.<group>`).
EXACTLY_ONCE_MARKERS = ("flink.max-committed-checkpoint-id", "kafka.connect.commit-id")
EXACTLY_ONCE_PREFIXES = ("kafka.connect.offsets.",)
# How many times one commit is made again, each lost to yet another commit, before it is refused.
MAX_REBASES = 8

# What became of a stale commit, as /metrics counts it.
COMMITTED = "committed"
GAVE_UP = "gave-up"
TURNED_OFF = "turned-off"
EXACTLY_ONCE = "exactly-once-writer"
OFFSETS_HELD = "offsets-already-held"
NOT_A_FAST_APPEND = "not-a-fast-append"
OUTCOMES = (COMMITTED, GAVE_UP, TURNED_OFF, EXACTLY_ONCE, OFFSETS_HELD, NOT_A_FAST_APPEND)


class _Declined(Exception):
    def __init__(self, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome = outcome


@dataclass(frozen=True)
class Rebased:
    change: TableChange
    manifest_list: str  # written for it: removed again if the commit does not land


def rebase_enabled(properties: Mapping[str, str], defaults: Mapping[str, str]) -> bool:
    """The table's own setting, else its namespace's or warehouse's default (table_defaults)."""
    return properties.get(REBASE_APPENDS, defaults.get(REBASE_APPENDS, "true")).lower() != "false"


def _fast_append(change: TableChange) -> tuple[Snapshot, str]:
    """The append snapshot and branch of a commit that is one fast append, else _Declined."""
    if change.job is not None or len(change.updates) != 2:
        raise _Declined(NOT_A_FAST_APPEND, "it changes more than a branch's head")
    added, moved = change.updates
    if not isinstance(added, AddSnapshotUpdate) or not isinstance(moved, SetSnapshotRefUpdate):
        raise _Declined(NOT_A_FAST_APPEND, "it changes more than a branch's head")
    snapshot = added.snapshot
    if snapshot.summary is None or snapshot.summary.operation != Operation.APPEND:
        raise _Declined(NOT_A_FAST_APPEND, "its snapshot is no append")
    if moved.type != SnapshotRefType.BRANCH or moved.snapshot_id != snapshot.snapshot_id:
        raise _Declined(NOT_A_FAST_APPEND, "it does not make its snapshot a branch's head")
    asserted = [r for r in change.requirements if isinstance(r, AssertRefSnapshotId)]
    if [(r.ref, r.snapshot_id) for r in asserted] != [(moved.ref_name, snapshot.parent_snapshot_id)]:
        raise _Declined(NOT_A_FAST_APPEND, "its requirements are not its branch's parent snapshot alone")
    summary = snapshot.summary.additional_properties
    if any(key in summary for key in EXACTLY_ONCE_MARKERS) or any(
        key.startswith(EXACTLY_ONCE_PREFIXES) for key in summary
    ):
        raise _Declined(EXACTLY_ONCE, "its writer commits exactly once and fences on the branch")
    return snapshot, moved.ref_name


class RebaseCore(Protocol):
    """What making an append again reads of its warehouse (catalog/service_core.py has it)."""

    store: Store
    scope: str
    places: Places

    def defaults_for(self, namespace: tuple[str, ...]) -> dict[str, str]: ...


class AppendRebase:
    """Makes a stale fast append again on its branch's head; counts what became of each."""

    def __init__(self, core: RebaseCore, manifests: ManifestCache) -> None:
        """`manifests`: the process's decoded manifest lists, which the lists made again join."""
        self._core = core
        self._lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        self._remembered = Remembered(manifests)

    def _coverage(self, ident: Identifier) -> Coverage:
        """The source offsets the table's commits hold (a span's append is not made twice)."""
        with self._core.store.read(self._core.scope) as view:
            pointer = view.pointer(TABLE, ident)
            if pointer is None:
                raise NoSuchTableError(f"Table does not exist: {ident}")
            return view.coverage(pointer.uuid)

    def count(self, outcome: str) -> None:
        with self._lock:
            self.outcomes[outcome] += 1

    def again(
        self, change: TableChange, head: TableMetadata, refused: CommitFailedException, attempt: int
    ) -> Rebased:
        """`change` made again on `head`, the table's metadata it was refused on (`refused`); raises
        `refused` when it is not rebased, and a CommitFailedException saying so once it has been
        made again `MAX_REBASES` times."""
        try:
            snapshot, branch = _fast_append(change)
            if not rebase_enabled(head.properties, self._core.defaults_for(change.ident.namespace)):
                raise _Declined(TURNED_OFF, f"{REBASE_APPENDS} is false")
            for requirement in change.requirements:
                if not isinstance(requirement, AssertRefSnapshotId):
                    check_requirement(requirement, head)  # another refusal: answered as it is
            spans = snapshot_spans(snapshot)
            if spans:
                held = self._coverage(change.ident)
                if any(held.overlaps(span) for span in spans):
                    raise _Declined(OFFSETS_HELD, "the table already holds some of its source offsets")
            if attempt >= MAX_REBASES:
                self.count(GAVE_UP)
                raise CommitFailedException(
                    f"{refused} (isbre made the append again on the new head of {branch} {attempt} times "
                    "and each time another commit landed first; it gave up: commit again)"
                ) from refused
            try:
                io = self._core.places.confined_io(head)
                made = appended_again(head, io, snapshot, branch, self._remembered)
            except NotRebasedError as exc:
                raise _Declined(NOT_A_FAST_APPEND, str(exc)) from exc
        except _Declined as declined:
            self.count(declined.outcome)
            log.info("%s: a stale commit is not rebased (%s): %s", change.ident, declined, refused)
            raise refused from None
        moved = made.snapshot
        assert moved.parent_snapshot_id is not None
        requirements = tuple(
            AssertRefSnapshotId(ref=branch, snapshot_id=moved.parent_snapshot_id)
            if isinstance(requirement, AssertRefSnapshotId)
            else requirement
            for requirement in change.requirements
        )
        updates = (AddSnapshotUpdate(snapshot=moved), change.updates[1])
        return Rebased(TableChange(change.ident, requirements, updates, change.job), moved.manifest_list)
