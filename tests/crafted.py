"""Hand-built snapshots, as a hostile engine would commit them: a manifest list and a manifest whose
paths are whatever the test says, written with PyIceberg's own Avro writers."""

from __future__ import annotations

import random
import time
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record


def manifest_naming(
    metadata: TableMetadata, manifest_path: str, data_paths: list[str], snapshot_id: int, io: FileIO
) -> Any:
    """Write a manifest at `manifest_path` naming `data_paths` as added data files."""
    writer = write_manifest(
        2, metadata.spec(), metadata.schema(), io.new_output(manifest_path), snapshot_id, "null"
    )
    with writer:
        for path in data_paths:
            data_file = DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=path,
                file_format=FileFormat.PARQUET,
                partition=Record(),
                record_count=1,
                file_size_in_bytes=1,
            )
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, data_file=data_file
                )
            )
    return writer.to_manifest_file()


def crafted_snapshot(
    metadata: TableMetadata,
    manifest_list: str,
    manifests: list[tuple[str, list[str]]],
    write_list_at: str | None = None,
    io: FileIO | None = None,
) -> list[dict[str, Any]]:
    """The updates of a commit adding a snapshot whose manifest list (at `manifest_list`, written at
    `write_list_at` when the path itself cannot be written) holds `manifests`: (path, data paths);
    written through `io` (local disk by default)."""
    io = io or PyArrowFileIO()
    snapshot_id = random.getrandbits(62)
    sequence = metadata.last_sequence_number + 1
    files = [manifest_naming(metadata, path, data, snapshot_id, io) for path, data in manifests]
    parent = metadata.current_snapshot_id
    output = io.new_output(write_list_at or manifest_list)
    with write_manifest_list(2, output, snapshot_id, parent, sequence, "null") as writer:
        writer.add_manifests(files)
    return snapshot_updates(metadata, snapshot_id, parent, sequence, manifest_list)


def snapshot_updates(
    metadata: TableMetadata, snapshot_id: int, parent: int | None, sequence: int, manifest_list: str
) -> list[dict[str, Any]]:
    """Add an append snapshot and point main at it."""
    snapshot: dict[str, Any] = {
        "snapshot-id": snapshot_id,
        "sequence-number": sequence,
        "timestamp-ms": int(time.time() * 1000),
        "manifest-list": manifest_list,
        "summary": {"operation": "append"},
        "schema-id": metadata.current_schema_id,
    }
    if parent is not None:
        snapshot["parent-snapshot-id"] = parent
    return [
        {"action": "add-snapshot", "snapshot": snapshot},
        {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": snapshot_id},
    ]
