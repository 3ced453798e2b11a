"""A replace snapshot made again on top of appends that landed after it was planned, without
reading or writing any manifest but a manifest list.

Compaction plans and writes against the table's head; on a table that a sink appends to many
times a second, another commit lands before the job's does nearly every time, and making the whole
snapshot again (reading the manifests, rewriting those that held the replaced files) takes longer
than the gap between two appends. But appends only add manifests: the replace's own manifests
stay right, and its snapshot on the new head is those plus the manifests the appends added, under
a new manifest list. When something else happened meanwhile (an overwrite, a delete, a merge of
manifests), this gives up and the job makes the snapshot again from the manifests.
"""

from __future__ import annotations

import uuid
from copy import copy

from isbre.catalog.table_properties import location_provider
from pyiceberg.io import FileIO
from pyiceberg.manifest import UNASSIGNED_SEQ, ManifestFile, write_manifest_list
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

# The summary's totals, worked out again from the new head's; the rest says what the replace did.
_TOTALS = (
    "total-data-files",
    "total-delete-files",
    "total-records",
    "total-files-size",
    "total-position-deletes",
    "total-equality-deletes",
)


def rebased(
    head: TableMetadata, io: FileIO, staged: Snapshot, base_id: int
) -> tuple[tuple[TableRequirement, ...], tuple[TableUpdate, ...]] | None:
    """The requirements and updates of `staged` (a replace snapshot planned on the snapshot
    `base_id`) on `head`'s main branch instead, or None when what landed since the base is not
    appends of new manifests alone."""
    current, main = head.current_snapshot(), head.refs.get(MAIN_BRANCH)
    if current is None or main is None or staged.summary is None or current.summary is None:
        return None
    landed: list[Snapshot] = []
    walked: Snapshot | None = current
    while walked is not None and walked.snapshot_id != base_id:
        if walked.summary is None or walked.summary.operation != Operation.APPEND:
            return None
        landed.append(walked)
        walked = (
            head.snapshot_by_id(walked.parent_snapshot_id) if walked.parent_snapshot_id is not None else None
        )
    if walked is None:
        return None  # the base is no ancestor of the head any more
    base = walked
    base_manifests = {m.manifest_path for m in base.manifests(io)}
    head_manifests = current.manifests(io)
    if not base_manifests <= {m.manifest_path for m in head_manifests}:
        return None  # an append merged manifests the replace may have rewritten
    added = [m for m in head_manifests if m.manifest_path not in base_manifests]
    if any(m.existing_files_count or m.deleted_files_count for m in added):
        return None
    ours = [_unassigned(m, staged) for m in staged.manifests(io)]
    sequence_number = head.next_sequence_number()
    location = location_provider(head.location, head.properties).new_metadata_location(
        f"snap-{staged.snapshot_id}-{len(landed)}-{uuid.uuid4()}.avro"
    )
    compression = head.properties.get(
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    with write_manifest_list(
        format_version=head.format_version,
        output_file=io.new_output(location),
        snapshot_id=staged.snapshot_id,
        parent_snapshot_id=current.snapshot_id,
        sequence_number=sequence_number,
        avro_compression=compression,  # type: ignore[arg-type]
    ) as writer:
        writer.add_manifests(added + ours)
    done = {k: v for k, v in staged.summary.additional_properties.items() if k not in _TOTALS}
    summary = update_snapshot_summaries(
        Summary(Operation.OVERWRITE, **done), current.summary.additional_properties
    )
    snapshot = staged.model_copy(
        update={
            "parent_snapshot_id": current.snapshot_id,
            "sequence_number": sequence_number,
            "manifest_list": location,
            "summary": Summary(Operation.REPLACE, **summary.additional_properties),
        }
    )
    updates: tuple[TableUpdate, ...] = (
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(
            snapshot_id=snapshot.snapshot_id,
            parent_snapshot_id=current.snapshot_id,
            ref_name=MAIN_BRANCH,
            type=SnapshotRefType.BRANCH,
            # The branch keeps its own retention, if it has one.
            max_ref_age_ms=main.max_ref_age_ms,
            max_snapshot_age_ms=main.max_snapshot_age_ms,
            min_snapshots_to_keep=main.min_snapshots_to_keep,
        ),
    )
    return (AssertRefSnapshotId(ref=MAIN_BRANCH, snapshot_id=current.snapshot_id),), updates


def _unassigned(manifest: ManifestFile, staged: Snapshot) -> ManifestFile:
    """A manifest of the staged replace, its sequence numbers to be assigned again by the new
    manifest list; one the replace kept from before it, as it is."""
    if manifest.added_snapshot_id != staged.snapshot_id:
        return manifest
    moved = copy(manifest)  # PyIceberg caches the manifests it read: change a copy
    moved.sequence_number = UNASSIGNED_SEQ
    if manifest.min_sequence_number == staged.sequence_number:
        moved.min_sequence_number = UNASSIGNED_SEQ
    return moved
