"""Delete files that apply to no data file any more, dropped by the compaction that made them so.

Compaction rewrites a format v2 table's files with their deletes applied, into files whose
sequence number is above every delete's: the deletes that applied only to the files it replaced
then apply to nothing. Readers that plan by sequence numbers skip them, but every reader still
lists them, and an engine that does not reads each one. Here the `replace` snapshot compaction
staged is made again with them marked DELETED in its delete manifests (as Java's
`RemoveDanglingDeleteFiles` does, in the same snapshot): which delete applies to which data file is
decided as the planner decides it (catalog/scan_planning.py's DeleteIndex), on the snapshot's own
files, so a delete that still applies to any file stays. PyIceberg's producer cannot do it: it
rewrites a manifest that holds a removed file with its data manifest writer.
"""

from __future__ import annotations

from isbre.catalog.manifest_entries import read_entries
from isbre.catalog.manifest_lists import read_manifests
from isbre.catalog.manifest_merge import new_manifest
from isbre.catalog.pyiceberg_internals import DeleteManifestWriterV2, Staging
from isbre.catalog.rebase import made_again, on_main
from isbre.catalog.scan_planning import DeleteIndex
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotSummaryCollector, Summary
from pyiceberg.table.update import AddSnapshotUpdate


def without_dangling(metadata: TableMetadata, io: FileIO, staging: Staging) -> Staging:
    """`staging`, a `replace` snapshot of a v2 table staged on `metadata`'s head, made again with
    the delete files that apply to none of its data files marked DELETED; as it is when there are
    none."""
    staged = next(u.snapshot for u in staging[1] if isinstance(u, AddSnapshotUpdate))
    current = metadata.current_snapshot()
    if current is None or metadata.format_version != 2:
        return staging
    version = metadata.format_version
    manifests = read_manifests(io, staged.manifest_list, version)
    deletes = {
        m.manifest_path: read_entries(io, m, version)
        for m in manifests
        if m.content == ManifestContent.DELETES
    }
    if not deletes:
        return staging
    index = DeleteIndex(metadata)
    for entries in deletes.values():
        for entry in entries:
            index.add(entry)
    applying = {
        delete_file.file_path
        for manifest in manifests
        if manifest.content == ManifestContent.DATA
        for entry in read_entries(io, manifest, version)
        for delete_file in index.of(entry)
    }
    dangling = [
        e.data_file for entries in deletes.values() for e in entries if e.data_file.file_path not in applying
    ]
    if not dangling:
        return staging
    kept: list[ManifestFile] = []
    for manifest in manifests:
        held = deletes.get(manifest.manifest_path)
        if held is None or all(e.data_file.file_path in applying for e in held):
            kept.append(manifest)
        else:
            kept.append(_rewritten(metadata, io, staged, manifest, held, applying))
    made = made_again(
        metadata,
        io,
        _counted(metadata, staged, dangling),
        current,
        kept,
        Operation.REPLACE,
        Operation.OVERWRITE,
        {},
    )
    return on_main(metadata, made.snapshot)


def _rewritten(
    metadata: TableMetadata,
    io: FileIO,
    staged: Snapshot,
    manifest: ManifestFile,
    entries: list[ManifestEntry],
    applying: set[str],
) -> ManifestFile:
    """`manifest` written again: the deletes in `applying` EXISTING, the others DELETED."""
    output, codec = new_manifest(metadata, io)
    spec = metadata.specs()[manifest.partition_spec_id]
    with DeleteManifestWriterV2(spec, metadata.schema(), output, staged.snapshot_id, codec) as writer:  # type: ignore[arg-type]
        for entry in entries:
            stays = entry.data_file.file_path in applying
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.EXISTING if stays else ManifestEntryStatus.DELETED,
                    snapshot_id=entry.snapshot_id if stays else staged.snapshot_id,
                    sequence_number=entry.sequence_number,
                    file_sequence_number=entry.file_sequence_number,
                    data_file=entry.data_file,
                )
            )
    return writer.to_manifest_file()


def _counted(metadata: TableMetadata, staged: Snapshot, dangling: list[DataFile]) -> Snapshot:
    """`staged` with the removed delete files counted in its summary (beside the data files it
    removed: the counts both name are added up)."""
    assert staged.summary is not None
    collector = SnapshotSummaryCollector()
    for delete_file in dangling:
        collector.remove_file(delete_file, metadata.schema(), metadata.specs()[delete_file.spec_id])
    found = dict(staged.summary.additional_properties)
    for key, value in collector.build().items():
        if key.startswith("removed-"):
            found[key] = str(int(found.get(key, "0")) + int(value))
    return staged.model_copy(update={"summary": Summary(staged.summary.operation, **found)})
