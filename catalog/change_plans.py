"""Change plans: what each commit after a cursor did to a table's rows, as file scan tasks.

A snapshot's changes are found from its own manifests alone (its parent may be expired): the data
files it added, the data files it removed (their deleted entries), and, where it added or removed
delete files, the data files it kept whose deletes changed. Each is a task a reader reads with
the file's own deletes (`ChangeTask`); the rows read are inserted or deleted. A copy-on-write
rewrite removes a file and adds one that carries most of its rows over: the catalog nets those
out (catalog/carried_rows.py), its position delete files among the tasks' deletes, so that a
reader reads the changed rows only. `replace` snapshots (compaction, manifest rewrites) change no
row and contribute nothing.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Literal

from isbre.catalog.carried_rows import CarriedRows, Side
from isbre.catalog.manifest_entries import first_row_id, with_first_row_id
from isbre.catalog.scan_planning import DeleteIndex, Planner
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.table.snapshots import Operation, Snapshot

ChangeKind = Literal["added-rows", "deleted-data-file", "deleted-rows"]


@dataclass(frozen=True)
class ChangeTask:
    """`added-rows`: the rows of `data_file` read with `deletes` were inserted by the commit;
    `deleted-data-file`: they were deleted (the file was removed); `deleted-rows`: the rows read
    with `existing` deletes and not with `deletes` were deleted (and any read with `deletes` and
    not with `existing`, a delete file removed alone, inserted). Of those, the ones `residual`
    matches are the changes the plan asked for."""

    kind: ChangeKind
    commit_seq: int
    snapshot_id: int
    data_file: DataFile
    deletes: tuple[DataFile, ...]
    existing: tuple[DataFile, ...] = ()
    # What is left of the plan's filter for the file's rows: a reader keeps the rows it matches.
    residual: BooleanExpression = field(default_factory=AlwaysTrue)
    # The rows the commit carried over unchanged are read too (it held more rows than the catalog
    # nets): a reader nets them out itself.
    carried_included: bool = False


@dataclass(frozen=True)
class ChangePlan:
    tasks: list[ChangeTask]
    # The commit the plan covers up to: the cursor to plan from next.
    commit_seq: int


@dataclass(frozen=True)
class Netting:
    """How a plan nets the rows copy-on-write commits carried over: up to `max_rows` rows a commit."""

    carried: CarriedRows
    max_rows: int


def plan_changes(
    planner: Planner, commits: list[tuple[Snapshot, int]], max_tasks: int, netting: Netting
) -> ChangePlan | None:
    """The changes of `commits` (snapshots oldest first, each with its commit), whole commits
    until they make `max_tasks` tasks (at least one commit); None when there are no commits."""
    if not commits:
        return None
    tasks: list[ChangeTask] = []
    for commit_seq, grouped in itertools.groupby(commits, key=lambda each: each[1]):
        if tasks and len(tasks) >= max_tasks:
            break
        covered = commit_seq
        tasks += commit_changes(planner, [snapshot for snapshot, _ in grouped], commit_seq, netting)
    return ChangePlan(tasks, covered)


def commit_changes(
    planner: Planner, snapshots: list[Snapshot], commit_seq: int, netting: Netting
) -> list[ChangeTask]:
    """The tasks that read what one commit's `snapshots` inserted and deleted. A commit may remove
    a file in one snapshot and write its rows again in another (PyIceberg's overwrite deletes,
    then appends): the rows it carried over are netted over all of them."""
    tasks = [task for snapshot in snapshots for task in snapshot_changes(planner, snapshot, commit_seq)]
    removing = next((t.snapshot_id for t in tasks if t.kind == "deleted-data-file"), None)
    if removing is not None and any(t.kind == "added-rows" for t in tasks):
        by_id = {snapshot.snapshot_id: snapshot for snapshot in snapshots}
        tasks = _carried_netted(planner, by_id[removing], tasks, netting)
    # A filter prunes both sides of a commit alike: the rows of a file it leaves out match it on
    # neither side, so what is left is the change of the rows that match.
    return [replace(t, residual=planner.residual(t.data_file)) for t in tasks if planner.keeps(t.data_file)]


@dataclass
class _Entries:
    live_data: list[ManifestEntry]
    live_deletes: list[ManifestEntry]
    added_data: list[ManifestEntry]
    removed_data: list[ManifestEntry]
    added_deletes: list[ManifestEntry]
    removed_deletes: list[ManifestEntry]


def _entries(planner: Planner, snapshot: Snapshot) -> _Entries:
    """The snapshot's entries a change plan needs. Its own manifests hold what it added and
    removed; the others are read only when the changes depend on them: the live delete files when
    it removed data files or changed delete files, the live data files when it changed delete
    files. An append reads its own manifests only, whatever the table's size."""
    found = _Entries([], [], [], [], [], [])
    own = snapshot.snapshot_id
    manifests = planner.manifests(snapshot)
    others = []
    for manifest in manifests:
        if manifest.added_snapshot_id != own:
            others.append(manifest)
            continue
        data = manifest.content == ManifestContent.DATA
        for entry in planner.entries(manifest, deleted=True):
            if entry.status != ManifestEntryStatus.DELETED:
                (found.live_data if data else found.live_deletes).append(entry)
            if entry.snapshot_id != own or entry.status == ManifestEntryStatus.EXISTING:
                continue
            if entry.status == ManifestEntryStatus.ADDED:
                (found.added_data if data else found.added_deletes).append(entry)
            else:
                (found.removed_data if data else found.removed_deletes).append(entry)
    deletes_changed = bool(found.added_deletes or found.removed_deletes)
    for manifest in others:
        if manifest.content == ManifestContent.DATA and deletes_changed:
            found.live_data += planner.entries(manifest)
        elif manifest.content == ManifestContent.DELETES and (found.removed_data or deletes_changed):
            found.live_deletes += planner.entries(manifest)
    return found


def snapshot_changes(planner: Planner, snapshot: Snapshot, commit_seq: int) -> list[ChangeTask]:
    """The tasks that read what `snapshot` inserted and deleted, whatever the plan's filter."""
    if snapshot.summary is not None and snapshot.summary.operation == Operation.REPLACE:
        return []
    found = _entries(planner, snapshot)
    # A file the snapshot added has its sequence number: only deletes it added can apply to it.
    added = _index(planner, found.added_deletes)
    added_paths = {entry.data_file.file_path for entry in found.added_deletes}
    before = _index(
        planner,
        [e for e in found.live_deletes + found.removed_deletes if e.data_file.file_path not in added_paths],
    )
    own = snapshot.snapshot_id

    def task(kind: ChangeKind, entry: ManifestEntry, deletes: DeleteIndex) -> ChangeTask:
        return ChangeTask(kind, commit_seq, own, entry.data_file, tuple(deletes.of(entry)))

    tasks = [task("added-rows", entry, added) for entry in found.added_data]
    row_ids = _removed_row_ids(planner, snapshot, found.removed_data)
    for entry in found.removed_data:
        removed = task("deleted-data-file", entry, before)
        if (row_id := row_ids.get(entry.data_file.file_path)) is not None:
            removed = replace(removed, data_file=with_first_row_id(entry.data_file, row_id))
        tasks.append(removed)
    if found.added_deletes or found.removed_deletes:
        after = _index(planner, found.live_deletes)
        added_data = {entry.data_file.file_path for entry in found.added_data}
        for entry in found.live_data:
            if entry.data_file.file_path in added_data:
                continue
            existing = tuple(before.of(entry))
            now = tuple(after.of(entry))
            if {d.file_path for d in existing} != {d.file_path for d in now}:
                tasks.append(ChangeTask("deleted-rows", commit_seq, own, entry.data_file, now, existing))
    return tasks


def _carried_netted(
    planner: Planner, snapshot: Snapshot, tasks: list[ChangeTask], netting: Netting
) -> list[ChangeTask]:
    """`tasks` (of a commit that removed and added data files, `snapshot` the first that removed
    one: what the catalog keeps goes by it) with the position delete files that name the rows it
    carried over among their deletes; or, where those were not worked out, each task that reads
    whole files marked as reading them."""
    whole = [t for t in tasks if t.kind != "deleted-rows"]
    sides = [Side(t.data_file, t.deletes, t.kind == "added-rows") for t in whole]
    carried = netting.carried.deletes(planner.io, planner.metadata, snapshot, sides, netting.max_rows)
    if carried is None:
        return [replace(t, carried_included=True) if t.kind != "deleted-rows" else t for t in tasks]
    return [
        replace(t, deletes=(*t.deletes, carried[t.data_file.file_path]))
        if t.kind != "deleted-rows" and t.data_file.file_path in carried
        else t
        for t in tasks
    ]


def _removed_row_ids(planner: Planner, snapshot: Snapshot, removed: list[ManifestEntry]) -> dict[str, int]:
    """The first row ids, in the snapshot's parent, of the data files it removed whose deleted
    entries lack them (a writer that reads manifests without the spec's row id inheritance
    writes them so, PyIceberg's among them): a reader finds the removed rows' ids from them.
    Empty on a table before format v3, and where the parent was expired."""
    missing = {e.data_file.file_path for e in removed if first_row_id(e.data_file) is None}
    parent_id = snapshot.parent_snapshot_id
    if planner.metadata.format_version < 3 or not missing or parent_id is None:
        return {}
    parent = planner.metadata.snapshot_by_id(parent_id)
    if parent is None:
        return {}
    found = {}
    for manifest in planner.manifests(parent):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in planner.entries(manifest):
            path = entry.data_file.file_path
            if path in missing and (row_id := first_row_id(entry.data_file)) is not None:
                found[path] = row_id
    return found


def _index(planner: Planner, entries: list[ManifestEntry]) -> DeleteIndex:
    found = DeleteIndex(planner.metadata)
    for entry in entries:
        found.add(entry)
    return found


__all__ = [
    "ChangeKind",
    "ChangePlan",
    "ChangeTask",
    "Netting",
    "commit_changes",
    "plan_changes",
]
