"""The rules a commit the catalog makes itself must pass on the table's head.

Compaction, a manifest rewrite and expiry plan from the table as it was when they started, then
commit on whatever head the table has by then: other writers commit meanwhile. Iceberg's Java core
keeps a rewrite's starting snapshot across its retries and validates every snapshot committed
since (`BaseRewriteFiles.validate`, `MergingSnapshotProducer.validateNoNewDeletesForDataFiles`),
and expiry plans again on the refreshed table. These are the same rules, in one place, checked
where the commit is staged, against the very metadata it is staged on:

- a rewrite of data files: every file it replaces is still live, and no position delete file
  or deletion vector committed since its starting snapshot applies to one of them (it names
  their rows by file and position, which the rewrite changes). An equality delete committed
  since does not conflict: the new files take the starting snapshot's sequence number (Java's
  rewrite with the starting sequence number), and a newer equality delete applies to them;
- a rewrite of manifests: every manifest it replaces is still in the head;
- expiry: every snapshot and ref it removes is one the head would expire too (a tag or branch
  made meanwhile on an old snapshot keeps it);
- a stale append the catalog makes again (catalog/rebase.py): every entry its manifests hold is a
  data file ADDED by that very snapshot, with no sequence number of its own.

A commit that breaks a rule is refused with `ConflictError`, which names the replaced files it
concerns, so that a job can drop just those and commit the rest.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from isbre.catalog.manifest_entries import read_entries, referenced_data_file
from isbre.catalog.manifest_lists import read_manifests
from pyiceberg.exceptions import ValidationException
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntryStatus, ManifestFile
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

# The reserved field id of a position delete file's `file_path` column: its bounds say which data
# files the deletes can reach.
POSITION_DELETE_FILE_PATH = 2147483546


class ConflictError(ValidationException):
    """A commit of the catalog's own that Iceberg's rules refuse on the table's head."""

    def __init__(self, message: str, files: Collection[str] = ()) -> None:
        super().__init__(message)
        self.files = frozenset(files)  # the replaced data files the conflict concerns


def committed_since(head: TableMetadata, starting_snapshot_id: int | None) -> list[Snapshot]:
    """The snapshots of the head's main branch after `starting_snapshot_id`, newest first;
    ConflictError when that snapshot is no ancestor of the head any more (a rollback, an expiry)."""
    found: list[Snapshot] = []
    walked = head.current_snapshot()
    while walked is not None and walked.snapshot_id != starting_snapshot_id:
        found.append(walked)
        parent = walked.parent_snapshot_id
        walked = head.snapshot_by_id(parent) if parent is not None else None
    if walked is None and starting_snapshot_id is not None:
        raise ConflictError(
            f"snapshot {starting_snapshot_id}, which the rewrite started from, is no ancestor of the head"
        )
    return found


@dataclass(frozen=True)
class _Delete:
    data_file: DataFile
    spec_unpartitioned: bool


def _added_deletes(head: TableMetadata, io: FileIO, snapshots: Iterable[Snapshot]) -> list[_Delete]:
    """The delete files each of `snapshots` added: entries ADDED by that snapshot in delete
    manifests (a manifest rewrite lists older delete files again as EXISTING)."""
    found: list[_Delete] = []
    for snapshot in snapshots:
        for manifest in read_manifests(io, snapshot.manifest_list, head.format_version):
            if (
                manifest.content != ManifestContent.DELETES
                or manifest.added_snapshot_id != snapshot.snapshot_id
            ):
                continue
            spec = head.specs().get(manifest.partition_spec_id)
            unpartitioned = spec is None or spec.is_unpartitioned()
            for entry in read_entries(io, manifest, head.format_version):
                if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id:
                    found.append(_Delete(entry.data_file, unpartitioned))
    return found


def _applies(delete: _Delete, data_file: DataFile) -> bool:
    """Whether `delete`, committed after `data_file`, may delete some of its rows (Java's
    DeleteFileIndex, without the column metrics it may also use: a doubt counts as a conflict)."""
    deletes = delete.data_file
    same_partition = deletes.spec_id == data_file.spec_id and deletes.partition == data_file.partition
    if deletes.content == DataFileContent.EQUALITY_DELETES:
        return delete.spec_unpartitioned or same_partition
    referenced = referenced_data_file(deletes)
    if referenced is not None:
        return referenced == data_file.file_path
    lower = (deletes.lower_bounds or {}).get(POSITION_DELETE_FILE_PATH)
    upper = (deletes.upper_bounds or {}).get(POSITION_DELETE_FILE_PATH)
    if lower is not None and upper is not None:
        path = data_file.file_path.encode()
        return lower <= path <= upper
    return same_partition


def _gone(
    head: TableMetadata, io: FileIO, start: Snapshot | None, replaced: Collection[DataFile]
) -> set[str]:
    """Which of `replaced` (live in `start`) the head no longer reads. A manifest never changes
    once written, so a file whose manifests the head still lists is live: only the manifests of
    the start that the head dropped, and those the head added, are read."""
    current = head.current_snapshot()
    if current is None:
        return {f.file_path for f in replaced}
    ours = {f.file_path for f in replaced}
    before = _data_manifests(head, io, start) if start is not None else []
    now = {m.manifest_path: m for m in _data_manifests(head, io, current)}
    dropped = [m for m in before if m.manifest_path not in now]
    if not dropped:
        return set()
    listed = {m.manifest_path for m in before}
    in_dropped = {
        e.data_file.file_path for m in dropped for e in read_entries(io, m, head.format_version)
    } & ours
    live = {
        e.data_file.file_path
        for path, m in now.items()
        if path not in listed
        for e in read_entries(io, m, head.format_version)
    }
    return in_dropped - live


def _data_manifests(head: TableMetadata, io: FileIO, snapshot: Snapshot) -> list[ManifestFile]:
    found = read_manifests(io, snapshot.manifest_list, head.format_version)
    return [m for m in found if m.content == ManifestContent.DATA]


def check_rewrite_files(
    head: TableMetadata, io: FileIO, starting_snapshot_id: int | None, replaced: Collection[DataFile]
) -> None:
    """A rewrite of `replaced` (read at `starting_snapshot_id`, written with its sequence number)
    may commit on `head`: ConflictError naming every replaced file that went meanwhile or that a
    position delete or deletion vector committed since applies to."""
    since = committed_since(head, starting_snapshot_id)
    if not since:
        return  # the head is the snapshot the files were read from
    start = head.snapshot_by_id(starting_snapshot_id) if starting_snapshot_id is not None else None
    gone = _gone(head, io, start, replaced)
    if gone:
        raise ConflictError(
            f"{len(gone)} data file(s) the rewrite replaces are no longer in the table, "
            f"first {sorted(gone)[0]}",
            gone,
        )
    deletes = [
        d for d in _added_deletes(head, io, since) if d.data_file.content == DataFileContent.POSITION_DELETES
    ]
    deleted = {f.file_path for f in replaced if any(_applies(d, f) for d in deletes)}
    if deleted:
        raise ConflictError(
            f"{len(deleted)} data file(s) the rewrite replaces have deletes committed since it started, "
            f"first {sorted(deleted)[0]}",
            deleted,
        )


def check_rewrite_manifests(head: TableMetadata, io: FileIO, replaced: Collection[ManifestFile]) -> None:
    """A rewrite of the manifests `replaced` may commit on `head`: each is still in its snapshot."""
    current = head.current_snapshot()
    present = (
        {m.manifest_path for m in read_manifests(io, current.manifest_list, head.format_version)}
        if current is not None
        else set()
    )
    missing = sorted(m.manifest_path for m in replaced if m.manifest_path not in present)
    if missing:
        raise ConflictError(f"{len(missing)} manifest(s) the rewrite replaces are gone, first {missing[0]}")


def check_expiry(
    removed_snapshots: Collection[int],
    removed_refs: Collection[str],
    expirable_snapshots: Collection[int],
    expirable_refs: Collection[str],
) -> None:
    """An expiry planned earlier may commit where the head's own plan expires at least as much."""
    kept = sorted(set(removed_snapshots) - set(expirable_snapshots))
    if kept:
        raise ConflictError(
            f"snapshot {kept[0]} is no longer expired: the table changed since expiry planned"
        )
    kept_refs = sorted(set(removed_refs) - set(expirable_refs))
    if kept_refs:
        raise ConflictError(
            f"ref {kept_refs[0]!r} is no longer past its age: the table changed since expiry planned"
        )


def check_added_entries(
    io: FileIO, manifests: Iterable[ManifestFile], snapshot_id: int, format_version: int
) -> None:
    """The manifests a stale append wrote hold only data files that append ADDED, with no sequence
    number of their own (they take the snapshot's, wherever it is made again): what its list's
    counters claim is the writer's word, the entries are what a reader reads."""
    for manifest in manifests:
        for entry in read_entries(io, manifest, format_version, discard_deleted=False, inherit=False):
            where = f"manifest {manifest.manifest_path}"
            if entry.status != ManifestEntryStatus.ADDED:
                raise ConflictError(f"{where} holds a {entry.status.name} entry, not only added files")
            if entry.snapshot_id not in (None, snapshot_id):
                raise ConflictError(
                    f"{where} holds an entry of snapshot {entry.snapshot_id}, not of the append"
                )
            if entry.data_file.content != DataFileContent.DATA:
                raise ConflictError(f"{where} holds a delete file")
            if entry.sequence_number is not None or entry.file_sequence_number is not None:
                raise ConflictError(f"{where} gives an added file a sequence number of its own")
