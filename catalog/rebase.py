"""A snapshot made again on the current head of its branch after another commit landed first,
writing no manifest but a manifest list.

Two kinds of snapshot only add manifests to what they were made on, so that on a newer head the
same manifests still say what they did:

- compaction's replace, when what landed meanwhile only added manifests of added files (appends,
  an upsert sink's rows and equality deletes): its own manifests plus the ones those commits
  added. Its new files keep the data sequence number they were written with (the starting
  snapshot's), so an equality delete among them applies to them; a position delete or deletion
  vector on a file it replaces is refused by the rules it is staged with (catalog/conflicts.py).
  The job makes the snapshot again from the manifests when anything else landed: a commit that
  removed files or rewrote or merged manifests;
- a client's fast append, whatever landed: its new manifests (of added data files only) plus every
  manifest of the head, exactly what the client's own retry would commit (the Java `FastAppend`
  and PyIceberg's retry re-apply an append to the refreshed table without validating anything).

The snapshot keeps its id and its own manifests; it gets a new manifest list, the next sequence
number (its new manifests' entries inherit it), summary totals worked out from the head's, and on
a v3 table the head's next row id as its `first-row-id` (catalog/manifest_lists.py assigns its
manifests' row ids).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from isbre.catalog.confined_io import ConfinedIO
from isbre.catalog.conflicts import ConflictError, check_added_entries
from isbre.catalog.deletion import OutsideTableError
from isbre.catalog.lru import Lru
from isbre.catalog.manifest_cache import ManifestCache
from isbre.catalog.manifest_entries import read_entries
from isbre.catalog.manifest_lists import Encodings, read_manifests, without_first_row_id, write_manifests
from isbre.catalog.table_properties import location_provider
from pyiceberg.avro.codecs import CODEC_MAPPING_ICEBERG_TO_AVRO, KNOWN_CODECS
from pyiceberg.io import FileIO
from pyiceberg.manifest import UNASSIGNED_SEQ, ManifestContent, ManifestEntryStatus, ManifestFile
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary, update_snapshot_summaries
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)

# A snapshot the catalog made again says on which parent its writer had made it.
REBASED_FROM_PARENT = "isbre.rebased-from-parent"

# The summary's totals, worked out again from the new head's; the rest says what the snapshot did.
_TOTALS = (
    "total-data-files",
    "total-delete-files",
    "total-records",
    "total-files-size",
    "total-position-deletes",
    "total-equality-deletes",
)


class NotRebasedError(Exception):
    """The snapshot cannot be made again on the head: the commit keeps its refusal."""


def rebased(
    head: TableMetadata, io: FileIO, staged: Snapshot, base_id: int
) -> tuple[tuple[TableRequirement, ...], tuple[TableUpdate, ...]] | None:
    """The requirements and updates of `staged` (a replace snapshot planned on the snapshot
    `base_id`) on `head`'s main branch instead, or None when what landed since the base did more
    than add manifests of added files."""
    current, main = head.current_snapshot(), head.refs.get(MAIN_BRANCH)
    if current is None or main is None or staged.summary is None or current.summary is None:
        return None
    if _compression(head) is None:
        return None
    walked: Snapshot | None = current
    while walked is not None and walked.snapshot_id != base_id:
        walked = (
            head.snapshot_by_id(walked.parent_snapshot_id) if walked.parent_snapshot_id is not None else None
        )
    if walked is None:
        return None  # the base is no ancestor of the head any more
    base_manifests = {m.manifest_path for m in read_manifests(io, walked.manifest_list, head.format_version)}
    head_manifests = read_manifests(io, current.manifest_list, head.format_version)
    if not base_manifests <= {m.manifest_path for m in head_manifests}:
        return None  # a commit removed files or merged manifests the replace may have rewritten
    added = [m for m in head_manifests if m.manifest_path not in base_manifests]
    if any(m.existing_files_count or m.deleted_files_count for m in added):
        return None
    # The counters are the writer's word; the entries are what a reader reads (a file listed again
    # as EXISTING would keep a replaced file live beside its rows' new file).
    for manifest in added:
        entries = read_entries(io, manifest, head.format_version, discard_deleted=False, inherit=False)
        if any(entry.status != ManifestEntryStatus.ADDED for entry in entries):
            return None
    ours = [_unassigned(m, staged) for m in read_manifests(io, staged.manifest_list, head.format_version)]
    made = made_again(head, io, staged, current, added + ours, Operation.REPLACE, Operation.OVERWRITE, {})
    return on_main(head, made.snapshot)


def on_main(
    head: TableMetadata, snapshot: Snapshot
) -> tuple[tuple[TableRequirement, ...], tuple[TableUpdate, ...]]:
    """The requirements and updates that make `snapshot`, a child of the main branch's head in
    `head`, the branch's head: the branch must still be where `head` has it."""
    main = head.refs[MAIN_BRANCH]
    assert snapshot.parent_snapshot_id == main.snapshot_id
    updates: tuple[TableUpdate, ...] = (
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(
            snapshot_id=snapshot.snapshot_id,
            parent_snapshot_id=main.snapshot_id,
            ref_name=MAIN_BRANCH,
            type=SnapshotRefType.BRANCH,
            # The branch keeps its own retention, if it has one.
            max_ref_age_ms=main.max_ref_age_ms,
            max_snapshot_age_ms=main.max_snapshot_age_ms,
            min_snapshots_to_keep=main.min_snapshots_to_keep,
        ),
    )
    return (AssertRefSnapshotId(ref=MAIN_BRANCH, snapshot_id=main.snapshot_id),), updates


# What the manifest lists of appends made again may take in memory, decoded, where no process-wide
# cache is given (catalog/manifest_cache.py's measure), and how many entries' encodings are kept.
REMEMBERED_LISTS_BYTES = 32 << 20
REMEMBERED_ENCODINGS = 1 << 16


class Remembered:
    """The manifest lists made again, decoded (in the process's one manifest cache), and their
    entries' encodings: on a hot table the head an append is made again on is most often the last
    list made, so it is neither read back nor its entries encoded again."""

    def __init__(self, lists: ManifestCache | None = None) -> None:
        self.lists = lists or ManifestCache(REMEMBERED_LISTS_BYTES)
        self.encodings: Encodings = Lru(REMEMBERED_ENCODINGS)


@dataclass(frozen=True)
class Made:
    snapshot: Snapshot
    manifests: tuple[ManifestFile, ...]  # as its new manifest list holds them


def appended_again(
    head: TableMetadata,
    io: ConfinedIO,
    staged: Snapshot,
    branch: str,
    remembered: Remembered | None = None,
) -> Made:
    """`staged`, an append snapshot made on an older snapshot of `branch`, made again on the
    branch's head in `head`; NotRebasedError unless its new manifests hold added data files only
    (not a merge-append's, which carry existing entries) and are the table's files."""
    if head.snapshot_by_id(staged.snapshot_id) is not None:
        raise NotRebasedError(f"snapshot {staged.snapshot_id} is already committed")
    if _compression(head) is None:
        raise NotRebasedError(
            f"the table's {TableProperties.WRITE_AVRO_COMPRESSION} names no codec isbre writes"
        )
    ref = head.refs.get(branch)
    tip = head.snapshot_by_id(ref.snapshot_id) if ref is not None else None
    if ref is None or ref.snapshot_ref_type != SnapshotRefType.BRANCH or tip is None:
        raise NotRebasedError(f"{branch} is no branch of the table any more")
    try:
        theirs = read_manifests(io, staged.manifest_list, head.format_version)
    except Exception as exc:  # the writer's file: whatever it holds, the commit keeps its refusal
        raise NotRebasedError(f"its manifest list cannot be read: {type(exc).__name__}: {exc}") from exc
    own = [m for m in theirs if m.added_snapshot_id == staged.snapshot_id]
    for manifest in own:
        if manifest.content != ManifestContent.DATA or manifest.existing_files_count != 0:
            raise NotRebasedError(f"manifest {manifest.manifest_path} holds more than added data files")
        if manifest.deleted_files_count != 0:
            raise NotRebasedError(f"manifest {manifest.manifest_path} removes files")
        try:
            io.check(manifest.manifest_path)
        except OutsideTableError as exc:
            raise NotRebasedError(str(exc)) from exc
    remembered = remembered or Remembered()
    try:
        # The counters are the writer's word; the entries are what a reader reads.
        check_added_entries(io, own, staged.snapshot_id, head.format_version)
    except ConflictError as exc:
        raise NotRebasedError(str(exc)) from exc
    except Exception as exc:  # the writer's file: whatever it holds, the commit keeps its refusal
        raise NotRebasedError(f"its manifests cannot be read: {type(exc).__name__}: {exc}") from exc
    kept = remembered.lists.manifests(io, tip.manifest_list, head.format_version)
    parent = "null" if staged.parent_snapshot_id is None else str(staged.parent_snapshot_id)
    manifests = [_unassigned(m, staged) for m in own] + list(kept)
    made = made_again(
        head,
        io,
        staged,
        tip,
        manifests,
        Operation.APPEND,
        Operation.APPEND,
        {REBASED_FROM_PARENT: parent},
        remembered.encodings,
    )
    remembered.lists.keep(made.snapshot.manifest_list, head.format_version, made.manifests)
    return made


def made_again(
    head: TableMetadata,
    io: FileIO,
    staged: Snapshot,
    tip: Snapshot,
    manifests: list[ManifestFile],
    operation: Operation,
    counted_as: Operation,
    marked: dict[str, str],
    encodings: Encodings | None = None,
) -> Made:
    """`staged` with `manifests` under a new manifest list, as the child of `tip`; its summary's
    totals worked out as for a `counted_as` snapshot (`manifests` the list assigns sequence
    numbers and v3 row ids to are those that have none yet)."""
    assert staged.summary is not None
    sequence_number = head.next_sequence_number()
    location = location_provider(head.location, head.properties).new_metadata_location(
        f"snap-{staged.snapshot_id}-{uuid.uuid4()}.avro"
    )
    compression = _compression(head)
    assert compression is not None
    next_row_id: int | None = getattr(head, "next_row_id", None)
    written = write_manifests(
        io,
        location,
        head.format_version,
        staged.snapshot_id,
        tip.snapshot_id,
        sequence_number,
        next_row_id,
        compression,
        manifests,
        encodings,
    )
    done = {k: v for k, v in staged.summary.additional_properties.items() if k not in _TOTALS}
    summary = update_snapshot_summaries(
        Summary(counted_as, **done, **marked), tip.summary.additional_properties if tip.summary else None
    )
    changed: dict[str, object] = {
        "parent_snapshot_id": tip.snapshot_id,
        "sequence_number": sequence_number,
        "manifest_list": location,
        "summary": Summary(operation, **summary.additional_properties),
        # Snapshots follow one another in time (Java refuses one a minute older than the last).
        "timestamp_ms": max(staged.timestamp_ms, head.last_updated_ms),
    }
    if head.format_version >= 3:
        changed |= {"first_row_id": next_row_id, "added_rows": written.assigned_rows}
    return Made(staged.model_copy(update=changed), written.manifests)


def _compression(head: TableMetadata) -> str | None:
    """The Avro codec the table's properties name for its manifest lists; None when it is none that
    can be written (the property is the table writer's to set, to anything)."""
    codec = head.properties.get(
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    return codec if CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec, codec) in KNOWN_CODECS else None


def _unassigned(manifest: ManifestFile, staged: Snapshot) -> ManifestFile:
    """A manifest the staged snapshot wrote, its sequence numbers (and v3 row ids) to be assigned
    again by the new manifest list; one it kept from before it, as it is."""
    if manifest.added_snapshot_id != staged.snapshot_id:
        return manifest
    moved = without_first_row_id(manifest)  # a copy: the manifest read is left as it was
    moved.sequence_number = UNASSIGNED_SEQ
    if manifest.min_sequence_number == staged.sequence_number:
        moved.min_sequence_number = UNASSIGNED_SEQ
    return moved
