"""Merging a format v3 table's manifests, its rows keeping their ids.

PyIceberg 0.12 writes no v3 manifest, so its merging append cannot rewrite a v3 table's
manifests. Here the data manifests of each partition spec are merged into one, written as v3:
every entry EXISTING, with its sequence numbers and its data file's `first_row_id` written out
(inherited from its manifest until now: in a new manifest it would inherit another). Delete
manifests are kept as they are. The snapshot is a `replace` of the same files, made as the
catalog makes any snapshot again (catalog/rebase.py's `made_again`).
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

from isbre.catalog.manifest_entries import inherit_first_row_ids, read_entries
from isbre.catalog.manifest_lists import first_row_id, read_manifests
from isbre.catalog.pyiceberg_internals import ManifestWriterV3, Staging
from isbre.catalog.rebase import made_again, on_main
from isbre.catalog.table_properties import location_provider
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot, Summary


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
    staged = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=current.snapshot_id,
        sequence_number=metadata.next_sequence_number(),
        timestamp_ms=int(time.time() * 1000),
        manifest_list="",  # made_again writes it
        summary=Summary(Operation.REPLACE, **snapshot_properties),
        schema_id=metadata.current_schema_id,
    )
    # An append that adds nothing: the totals stay the parent's.
    made = made_again(metadata, io, staged, current, merged + kept, Operation.REPLACE, Operation.APPEND, {})
    return on_main(metadata, made.snapshot)


def _merged(
    metadata: TableMetadata, io: FileIO, snapshot_id: int, spec_id: int, manifests: list[ManifestFile]
) -> ManifestFile:
    codec = metadata.properties.get(
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    location = location_provider(metadata.location, metadata.properties).new_metadata_location(
        f"{uuid.uuid4()}-m0.avro"
    )
    writer = ManifestWriterV3(
        metadata.specs()[spec_id],
        metadata.schema(),
        io.new_output(location),
        snapshot_id,
        codec,  # type: ignore[arg-type]
    )
    with writer:
        for manifest in manifests:
            entries = read_entries(io, manifest, metadata.format_version)
            inherit_first_row_ids(entries, first_row_id(manifest))
            for entry in entries:
                writer.add_entry(
                    ManifestEntry.from_args(
                        3,
                        status=ManifestEntryStatus.EXISTING,
                        snapshot_id=entry.snapshot_id,
                        sequence_number=entry.sequence_number,
                        file_sequence_number=entry.file_sequence_number,
                        data_file=entry.data_file,
                    )
                )
    return writer.to_manifest_file()
