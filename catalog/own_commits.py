"""The catalog's own commits of maintenance jobs: how each job's change is made on a table's head,
with the rules it must pass there (Iceberg's, catalog/conflicts.py, checked where the commit is
staged), and committed through the tables' one commit loop (catalog/table_commit.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from isbre.catalog.confined_io import ConfinedIO
from isbre.catalog.conflicts import check_expiry, check_rewrite_files, check_rewrite_manifests
from isbre.catalog.dangling_deletes import without_dangling
from isbre.catalog.identifiers import Identifier
from isbre.catalog.maintenance import (
    COMPACT_DATA_FILES,
    JOB_PROPERTY,
    REWRITE_MANIFESTS,
    ExpiryPlan,
    plan_expiry,
)
from isbre.catalog.manifest_lists import read_manifests
from isbre.catalog.manifest_merge import merged_v3, replaced_v3
from isbre.catalog.pyiceberg_internals import Staging, merged_manifests, replace_files
from isbre.catalog.rebase import rebased
from isbre.catalog.request_context import RequestContext
from isbre.catalog.table_commit import MAX_COMMIT_ATTEMPTS, TableCommits, TableState, load_table
from isbre.catalog.table_staging import TableChange
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import AddSnapshotUpdate, AssertTableUUID

log = logging.getLogger(__name__)
# What a commit of a job's must pass on the head it is staged on (catalog/conflicts.py).
Rules = Callable[[TableMetadata], None]


def commit_rewrite(
    commits: TableCommits,
    ident: Identifier,
    state: TableState,
    job: str,
    make: Callable[[TableState], tuple[Staging, Rules]],
    io: ConfinedIO,
    context: RequestContext,
) -> TableState | None:
    """Commit the replace snapshot `make` stages on the table's head, with the rules it must pass
    there (catalog/conflicts.py, checked where the commit is staged); None if it changes no
    manifest (nothing to commit). When a commit lands first, the snapshot is moved onto it if
    only appends landed (catalog/rebase.py), else made again. Raises CommitFailedException
    after MAX_COMMIT_ATTEMPTS lost races, ConflictError when the rules refuse it, and what
    `make` raises."""
    staged: tuple[Snapshot, int] | None = None  # the snapshot made, and the head it was made on
    rules: Rules | None = None
    for _ in range(MAX_COMMIT_ATTEMPTS):
        moved = rebased(state.metadata, io, *staged) if staged is not None else None
        if moved is not None:
            requirements, updates = moved
        else:
            (requirements, updates), rules = make(state)
            made = next(u.snapshot for u in updates if isinstance(u, AddSnapshotUpdate))
            head = state.metadata.current_snapshot()
            if (
                head is not None
                and made.manifest_list
                and _same_manifests(io, made, head, state.metadata.format_version)
            ):
                return None
            staged = (made, state.metadata.current_snapshot_id or 0)
        change = TableChange(
            ident,
            (AssertTableUUID(uuid=state.metadata.table_uuid), *requirements),
            updates,
            job=job,
            validate=rules,
        )
        try:
            return commits.commit([change], None, context)[0]
        except CommitFailedException as exc:
            lost_to = load_table(commits.core, ident)  # a commit landed first: build on it
            log.info(
                "%s on %s: the table moved while it ran (%s), from snapshot %s to %s",
                job,
                ident,
                exc,
                state.metadata.current_snapshot_id,
                lost_to.metadata.current_snapshot_id,
            )
            state = lost_to
    raise CommitFailedException(f"Gave up {job} after {MAX_COMMIT_ATTEMPTS} lost races")


def _same_manifests(io: FileIO, made: Snapshot, head: Snapshot, format_version: int) -> bool:
    # Not through PyIceberg's reader: it caches each manifest by path with the sequence number the
    # list gives it, and a snapshot made again (catalog/rebase.py) gives its manifests a new one.
    return {m.manifest_path for m in read_manifests(io, made.manifest_list, format_version)} == {
        m.manifest_path for m in read_manifests(io, head.manifest_list, format_version)
    }


def replacing(
    ident: Identifier,
    io: ConfinedIO,
    starting: Snapshot,
    removed: list[DataFile],
    added: list[DataFile],
) -> Callable[[TableState], tuple[Staging, Rules]]:
    """How compaction stages its replace on a head: checked against what was committed since the
    files were read at `starting` (an error naming the files that conflict), then made. The new
    files take `starting`'s sequence number, as Java's rewrite with the starting sequence number
    does: an equality delete committed since (of a newer one) still applies to their rows."""
    starting_snapshot_id = starting.snapshot_id
    sequence_number = starting.sequence_number or 0

    def rules(head: TableMetadata) -> None:
        check_rewrite_files(head, io, starting_snapshot_id, removed)

    def make(state: TableState) -> tuple[Staging, Rules]:
        assert state.metadata_location is not None
        rules(state.metadata)  # before PyIceberg's producer, which would refuse a missing file unnamed
        summary = {JOB_PROPERTY: COMPACT_DATA_FILES}
        if state.metadata.format_version >= 3:  # PyIceberg writes no v3 manifest
            return replaced_v3(state.metadata, io, removed, added, summary, sequence_number), rules
        staging = replace_files(
            ident.parts, state.metadata, state.metadata_location, io, removed, added, summary, sequence_number
        )
        return without_dangling(state.metadata, io, staging), rules

    return make


def merging(ident: Identifier, io: ConfinedIO) -> Callable[[TableState], tuple[Staging, Rules]]:
    """How a manifest rewrite stages its replace on a head, and the rule it must pass there: every
    manifest it replaces is still the head's."""

    def make(state: TableState) -> tuple[Staging, Rules]:
        assert state.metadata_location is not None
        summary = {JOB_PROPERTY: REWRITE_MANIFESTS}
        if state.metadata.format_version >= 3:  # PyIceberg writes no v3 manifest
            staging = merged_v3(state.metadata, io, summary)
        else:
            staging = merged_manifests(ident.parts, state.metadata, state.metadata_location, io, summary)
        made = next(u.snapshot for u in staging[1] if isinstance(u, AddSnapshotUpdate))
        version = state.metadata.format_version
        base = state.metadata.current_snapshot()
        kept = {m.manifest_path for m in read_manifests(io, made.manifest_list, version)}
        listed = read_manifests(io, base.manifest_list, version) if base is not None else []
        replaced = [m for m in listed if m.manifest_path not in kept]
        return staging, lambda head: check_rewrite_manifests(head, io, replaced)

    return make


def expiring(plan: ExpiryPlan, now_ms: int, held: frozenset[int]) -> Rules:
    """The rule an expiry's commit must pass on the head it is staged on: the head's own plan
    removes at least what `plan` removes."""

    def rules(head: TableMetadata) -> None:
        again = plan_expiry(head, now_ms, held)
        check_expiry(plan.snapshot_ids, plan.refs, again.snapshot_ids, again.refs)

    return rules
