"""Scan plans of one warehouse's tables: what a plan request asks for, resolved against the table
as it stands (`resolve`), and the tasks of any range of the scan's manifests (`planner`).

A plan from a commit cursor (`after_commit_seq`) reads the files that the table's commits after
the cursor appended, found by walking back from the current snapshot until a snapshot that a
commit at or before the cursor added: it costs what the new commits cost, whatever the table's
history. Snapshots that add no rows (`replace`: compaction, manifest rewrites) are skipped; those
that rewrite rows (`overwrite`, `delete`) are reported, never dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from isbre.catalog.carried_rows import CarriedRows
from isbre.catalog.change_plans import ChangePlan, Netting, plan_changes
from isbre.catalog.change_types import NET_MAX_ROWS
from isbre.catalog.identifiers import Identifier
from isbre.catalog.lru import Lru
from isbre.catalog.manifest_cache import ManifestCache
from isbre.catalog.scan_planning import History, Planner, RowFilter, Scan, ScanNotPlannableError
from isbre.catalog.service_core import ServiceCore
from isbre.catalog.table_commit import load_table
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.manifest import DataFile
from pyiceberg.table.snapshots import Operation, Snapshot

# The commit that added a snapshot to the table, when the store knows it.
CommitOf = Callable[[int], int | None]


class ExpiredCommitsError(Exception):
    """Commits after the cursor added snapshots that the table has since expired."""


@dataclass(frozen=True)
class PlanRequest:
    """A plan request, in the catalog's terms (the REST route parses the wire form)."""

    snapshot_id: int | None = None
    start_snapshot_id: int | None = None
    end_snapshot_id: int | None = None
    after_commit_seq: int | None = None
    rows: RowFilter = field(default_factory=RowFilter)


@dataclass(frozen=True)
class Rewrite:
    """A snapshot after a cursor that rewrote rows: its delete files, and the commit that added it."""

    snapshot: Snapshot
    commit_seq: int | None
    delete_files: list[DataFile]


@dataclass(frozen=True)
class Resolved:
    scan: Scan
    planner: Planner
    # The commit the plan reads up to (a cursor plan: the cursor to send next), when known.
    commit_seq: int | None = None


# Tables whose snapshot index is kept (by metadata file: one never changes).
HISTORIES = 256


class Plans:
    def __init__(self, core: ServiceCore, cache: ManifestCache) -> None:
        self.core = core
        self.cache = cache
        self._histories: Lru[str, History] = Lru(HISTORIES)
        self._carried = CarriedRows()

    def resolve(self, ident: Identifier, request: PlanRequest) -> Resolved:
        """The scan `request` asks for, against the table as it stands. ScanNotPlannableError for
        snapshots the table does not hold, ExpiredCommitsError for a cursor it can no longer serve."""
        history = self._history(ident)
        metadata, table_uuid = history.metadata, str(history.metadata.table_uuid)
        rows = request.rows
        with self.core.store.read(self.core.scope) as view:

            def commit_of(snapshot_id: int) -> int | None:
                return view.snapshot_commit(table_uuid, snapshot_id)

            if request.after_commit_seq is not None:
                _check_cursor(view, request.after_commit_seq)
                first_parent = _FirstParents(view, table_uuid)
                return self._from_cursor(history, request.after_commit_seq, commit_of, first_parent, rows)
            if request.end_snapshot_id is not None:
                scan = Scan(table_uuid, request.end_snapshot_id, True, request.start_snapshot_id, rows)
                return Resolved(scan, self._planner(history, scan), commit_of(request.end_snapshot_id))
            snapshot_id = request.snapshot_id
            if snapshot_id is None:
                snapshot_id = metadata.current_snapshot_id
            if snapshot_id is not None:
                history.snapshot(snapshot_id)
                commit_seq = commit_of(snapshot_id)
            else:
                # A table without a snapshot: whatever is appended to it comes after the log's last
                # commit, the cursor to follow it from (not 0, which names no commit of its own).
                commit_seq = view.commit_seq()
            scan = Scan(table_uuid, snapshot_id, rows=rows)
            return Resolved(scan, self._planner(history, scan), commit_seq)

    def planner(self, ident: Identifier, scan: Scan) -> Planner:
        """The planner of a scan resolved before (a later page of its plan). NoSuchTableError when
        the table is no longer the one the scan was resolved against."""
        history = self._history(ident)
        if str(history.metadata.table_uuid) != scan.table_uuid:
            raise NoSuchTableError(f"Table {ident} is not the table this plan was made for")
        return self._planner(history, scan)

    def _history(self, ident: Identifier) -> History:
        state = load_table(self.core, ident)
        key = state.metadata_location or ""
        found = self._histories.peek(key) if key else None
        if found is None or found.metadata is not state.metadata:
            found = History(state.metadata)
            if key:
                self._histories.put(key, found)
        return found

    def _planner(self, history: History, scan: Scan) -> Planner:
        return Planner(history, scan, self.core.places.confined_io(history.metadata), self.cache)

    def _from_cursor(
        self,
        history: History,
        after: int,
        commit_of: CommitOf,
        first_parent: _FirstParents,
        rows: RowFilter,
    ) -> Resolved:
        table_uuid = str(history.metadata.table_uuid)
        head = history.metadata.current_snapshot_id
        newer, start, whole = _newer(history, after, commit_of)
        if whole and newer:
            _check_not_expired(newer, after, commit_of, first_parent)
        if not newer:
            scan = Scan(table_uuid, None, True, rows=rows)
            return Resolved(scan, self._planner(history, scan), after)
        scan = Scan(table_uuid, head, True, start, rows)
        return Resolved(scan, self._planner(history, scan), max(after, newer[0][1]))

    def changes(
        self,
        ident: Identifier,
        after: int,
        max_tasks: int,
        rows: RowFilter | None = None,
        net_max_rows: int = NET_MAX_ROWS,
    ) -> tuple[Planner, ChangePlan]:
        """What the table's commits after `after` inserted and deleted (whole commits, up to about
        `max_tasks` tasks) in the files whose rows may match `rows`, with the planner that read
        them; the rows a copy-on-write commit carried over are netted out where its files hold
        `net_max_rows` rows at most. ExpiredCommitsError as `resolve`."""
        history = self._history(ident)
        table_uuid = str(history.metadata.table_uuid)
        with self.core.store.read(self.core.scope) as view:
            _check_cursor(view, after)

            def commit_of(snapshot_id: int) -> int | None:
                return view.snapshot_commit(table_uuid, snapshot_id)

            newer, start, whole = _newer(history, after, commit_of)
            if whole and newer:
                _check_not_expired(newer, after, commit_of, _FirstParents(view, table_uuid))
        scan = Scan(table_uuid, history.metadata.current_snapshot_id, True, start, rows or RowFilter())
        planner = self._planner(history, scan)
        netting = Netting(self._carried, net_max_rows)
        return planner, plan_changes(planner, newer[::-1], max_tasks, netting) or ChangePlan([], after)

    def properties(self, ident: Identifier) -> dict[str, str]:
        return dict(self._history(ident).metadata.properties)

    def since(self, ident: Identifier, after: int) -> list[tuple[Snapshot, int]]:
        """The main branch's snapshots that commits after `after` added, newest first, each with
        its commit (as far as the table still holds them)."""
        history = self._history(ident)
        table_uuid = str(history.metadata.table_uuid)
        with self.core.store.read(self.core.scope) as view:
            return _newer(history, after, lambda snapshot_id: view.snapshot_commit(table_uuid, snapshot_id))[
                0
            ]

    def rewrites(self, planner: Planner) -> list[Rewrite]:
        """The snapshots of an incremental scan that rewrote rows (`overwrite`, `delete`), oldest
        first: a reader of changes decides what to do with them."""
        scan = planner.scan
        if not scan.incremental or scan.end_snapshot_id is None:
            return []
        walked = planner.history.ancestors(scan.end_snapshot_id, scan.start_snapshot_id)
        rewriting = [
            each
            for each in walked
            if each.summary is not None and each.summary.operation in (Operation.OVERWRITE, Operation.DELETE)
        ]
        with self.core.store.read(self.core.scope) as view:
            commits = [view.snapshot_commit(scan.table_uuid, each.snapshot_id) for each in rewriting]
        return [
            Rewrite(each, commit_seq, planner.added_deletes(each))
            for each, commit_seq in reversed(list(zip(rewriting, commits, strict=True)))
        ]


def _newer(
    history: History, after: int, commit_of: CommitOf
) -> tuple[list[tuple[Snapshot, int]], int | None, bool]:
    """(the snapshots back from the head that commits after `after` added, with their commits;
    the snapshot the walk stopped at, if any; whether it went through every snapshot it could)."""
    head = history.metadata.current_snapshot_id
    newer: list[tuple[Snapshot, int]] = []
    if head is None:
        return newer, None, False
    for each in history.ancestors(head, None):
        commit_seq = commit_of(each.snapshot_id)
        if commit_seq is None or commit_seq <= after:
            return newer, each.snapshot_id, False
        newer.append((each, commit_seq))
    return newer, None, True


def _check_cursor(view: Any, after: int) -> None:
    if after > view.commit_seq():
        # As the consumer cursors and the event stream refuse it: a reader would skip every commit
        # up to it without noticing.
        raise ScanNotPlannableError(
            f"isbre-after-commit-seq {after} is ahead of the commit log "
            f"(its last commit is {view.commit_seq()})"
        )


class _FirstParents:
    """The snapshot a commit's first snapshot was made on, as its record in the log says (expiry
    takes an expired parent's id off the snapshots that remain)."""

    def __init__(self, view: Any, table_uuid: str) -> None:
        self._view = view
        self._table_uuid = table_uuid

    def of(self, commit_seq: int) -> tuple[bool, int | None]:
        """(whether the log still holds the commit, the snapshot it was made on)."""
        found = self._view.records(commit_seq - 1, 1)
        if not found or found[0].commit_seq != commit_seq or found[0].table_uuid != self._table_uuid:
            return False, None
        return True, found[0].parent_snapshot_id


def _check_not_expired(
    newer: list[tuple[Snapshot, int]], after: int, commit_of: CommitOf, first_parent: _FirstParents
) -> None:
    """The walk back from the head reached the oldest snapshot the table holds: raise when a commit
    after the cursor added a snapshot before it that the table has since expired."""
    oldest, its_commit = newer[-1]
    parent = oldest.parent_snapshot_id
    if parent is None:
        logged, parent = first_parent.of(its_commit)
        if not logged:
            raise ExpiredCommitsError(
                _RESYNC.format(after=after, commit=its_commit, why="the log no longer holds")
            )
    if parent is not None and (parent_commit := commit_of(parent)) is not None and parent_commit > after:
        raise ExpiredCommitsError(_RESYNC.format(after=after, commit=its_commit, why="expiry removed"))


_RESYNC = (
    "Commits after {after} added snapshots that {why} (the oldest snapshot left came with commit "
    "{commit}): read the table whole again, then plan from the commit cursor that answer carries"
)


__all__ = ["ExpiredCommitsError", "PlanRequest", "Plans", "Resolved", "Rewrite", "ScanNotPlannableError"]
