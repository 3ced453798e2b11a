"""The catalog's own `replace` snapshots of a format v3 table, its rows keeping their ids.

PyIceberg 0.12 writes no v3 manifest, so neither its merging append nor its overwrite can
rewrite a v3 table's manifests. Here they are written as v3: an entry kept is EXISTING, with its
sequence numbers and its data file's `first_row_id` written out (inherited from its manifest
until now: in a new manifest it would inherit another). A merge puts the data manifests of each
partition spec into one; a rewrite of data files (compaction) marks the files it replaces
DELETED in the manifests that held them and adds its new files in a manifest of their own. Delete
manifests are kept as they are. The snapshot is made as the catalog makes any snapshot again
(catalog/rebase.py's `made_again`).
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

from isbre.catalog.manifest_entries import as_v3, inherit_first_row_ids, read_entries
from isbre.catalog.manifest_lists import first_row_id, read_manifests
from isbre.catalog.pyiceberg_internals import ManifestWriterV3, Staging
from isbre.catalog.rebase import made_again, on_main
from isbre.catalog.table_properties import location_provider
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotSummaryCollector, Summary


def merged_v3(metadata: TableMetadata, io: FileIO, snapshot_properties: dict[str, str]) -> Staging:
    """The requirements and updates of a `replace` snapshot on the main branch whose data
    manifests are the current snapshot's, merged into one per partition spec."""
    current = metadata.current_snapshot()
    assert current is not None, "a table with manifests to merge"
    snapshot_id = metadata.new_snapshot_id()
    listed = read_manifests(io, current.manifest_list, metadata.format_version)
    by_spec: dict[int, list[ManifestFile]] = defaultdict(list)
    for manifest in listed:
        if manifest.content == ManifestContent.DATA:
            by_spec[manifest.partition_spec_id].append(manifest)
    merged = [
        _merged(metadata, io, snapshot_id, spec_id, manifests)
        for spec_id, manifests in by_spec.items()
        if len(manifests) > 1
    ]
    kept = [m for m in listed if m.content != ManifestContent.DATA or len(by_spec[m.partition_spec_id]) == 1]
    staged = _staged(metadata, current, snapshot_id, snapshot_properties)
    # An append that adds nothing: the totals stay the parent's.
    made = made_again(metadata, io, staged, current, merged + kept, Operation.REPLACE, Operation.APPEND, {})
    return on_main(metadata, made.snapshot)


def replaced_v3(
    metadata: TableMetadata,
    io: FileIO,
    removed: list[DataFile],
    added: list[DataFile],
    snapshot_properties: dict[str, str],
    data_sequence_number: int,
) -> Staging:
    """The requirements and updates of a `replace` snapshot on the main branch that removes the
    data files `removed` and adds `added`, the same rows (their lineage written in them:
    catalog/row_lineage.py) of the data sequence number `data_sequence_number`. Raises ValueError
    when a file of `removed` is no longer live."""
    current = metadata.current_snapshot()
    assert current is not None, "a table with files to replace"
    snapshot_id = metadata.new_snapshot_id()
    gone = {data_file.file_path for data_file in removed}
    manifests: list[ManifestFile] = []
    for manifest in read_manifests(io, current.manifest_list, metadata.format_version):
        entries = _live_entries(metadata, io, manifest) if manifest.content == ManifestContent.DATA else []
        if not any(entry.data_file.file_path in gone for entry in entries):
            manifests.append(manifest)
            continue
        with _writer(metadata, io, snapshot_id, manifest.partition_spec_id) as writer:
            for entry in entries:
                if entry.data_file.file_path in gone:
                    gone.discard(entry.data_file.file_path)
                    writer.add_entry(_entry(entry, ManifestEntryStatus.DELETED, snapshot_id))
                else:
                    writer.add_entry(_entry(entry, ManifestEntryStatus.EXISTING, entry.snapshot_id))
        manifests.append(writer.to_manifest_file())
    if gone:
        raise ValueError(f"Cannot replace files that are not in the table: {sorted(gone)}")
    new = [as_v3(data_file, metadata.default_spec_id) for data_file in added]  # as they were written
    with _writer(metadata, io, snapshot_id, metadata.default_spec_id) as writer:
        for data_file in new:
            writer.add_entry(
                ManifestEntry.from_args(
                    3,
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=snapshot_id,
                    sequence_number=data_sequence_number,
                    data_file=data_file,
                )
            )
    collected = SnapshotSummaryCollector()
    for data_file in new:
        collected.add_file(data_file, metadata.schema(), metadata.spec())
    for data_file in removed:
        collected.remove_file(data_file, metadata.schema(), metadata.specs()[data_file.spec_id])
    staged = _staged(metadata, current, snapshot_id, {**collected.build(), **snapshot_properties})
    # Counted as the overwrite it is (PyIceberg's totals refuse the name `replace`).
    made = made_again(
        metadata,
        io,
        staged,
        current,
        [writer.to_manifest_file(), *manifests],
        Operation.REPLACE,
        Operation.OVERWRITE,
        {},
    )
    return on_main(metadata, made.snapshot)


def _staged(
    metadata: TableMetadata, current: Snapshot, snapshot_id: int, summary: dict[str, str]
) -> Snapshot:
    return Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=current.snapshot_id,
        sequence_number=metadata.next_sequence_number(),
        timestamp_ms=int(time.time() * 1000),
        manifest_list="",  # made_again writes it
        summary=Summary(Operation.REPLACE, **summary),
        schema_id=metadata.current_schema_id,
    )


def _live_entries(metadata: TableMetadata, io: FileIO, manifest: ManifestFile) -> list[ManifestEntry]:
    entries = read_entries(io, manifest, metadata.format_version)
    inherit_first_row_ids(entries, first_row_id(manifest))
    return entries


def _entry(entry: ManifestEntry, status: ManifestEntryStatus, snapshot_id: int | None) -> ManifestEntry:
    return ManifestEntry.from_args(
        3,
        status=status,
        snapshot_id=snapshot_id,
        sequence_number=entry.sequence_number,
        file_sequence_number=entry.file_sequence_number,
        data_file=entry.data_file,
    )


def new_manifest(metadata: TableMetadata, io: FileIO) -> tuple[OutputFile, str]:
    """Where the catalog writes a new manifest of the table, and the Avro codec the table asks for."""
    codec = metadata.properties.get(
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    location = location_provider(metadata.location, metadata.properties).new_metadata_location(
        f"{uuid.uuid4()}-m0.avro"
    )
    return io.new_output(location), codec


def _writer(metadata: TableMetadata, io: FileIO, snapshot_id: int, spec_id: int) -> ManifestWriterV3:
    output, codec = new_manifest(metadata, io)
    return ManifestWriterV3(
        metadata.specs()[spec_id],
        metadata.schema(),
        output,
        snapshot_id,
        codec,  # type: ignore[arg-type]
    )


def _merged(
    metadata: TableMetadata, io: FileIO, snapshot_id: int, spec_id: int, manifests: list[ManifestFile]
) -> ManifestFile:
    with _writer(metadata, io, snapshot_id, spec_id) as writer:
        for manifest in manifests:
            for entry in _live_entries(metadata, io, manifest):
                writer.add_entry(_entry(entry, ManifestEntryStatus.EXISTING, entry.snapshot_id))
    return writer.to_manifest_file()
