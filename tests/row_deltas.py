"""Row-level deletes as an engine commits them (PyIceberg writes none): position and equality
delete files in Parquet, a delete manifest and a `delete` snapshot over the table's current one,
committed through the catalog like any client's commit."""

from __future__ import annotations

import random
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestWriterV2,
    write_manifest_list,
)
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.typedef import Record

# The reserved field ids of a position delete file's columns (the spec's `file_path` and `pos`).
FILE_PATH_ID, POS_ID = 2147483546, 2147483545


class DeletesContent:
    """A manifest writer's side that says it holds delete files (PyIceberg's write data only)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}  # type: ignore[misc]


class _DeleteManifestWriter(DeletesContent, ManifestWriterV2):
    pass


def _parquet(table: Table, columns: pa.Table) -> tuple[str, int]:
    path = f"{table.metadata.location}/data/deletes-{uuid.uuid4()}.parquet"
    with table.io.new_output(path).create() as out:
        pq.write_table(columns, out)
    return path, len(table.io.new_input(path))


def _field(name: str, kind: pa.DataType, field_id: int) -> pa.Field:
    return pa.field(name, kind, nullable=False, metadata={b"PARQUET:field_id": str(field_id).encode()})


def position_deletes(table: Table, data_file: DataFile, positions: list[int]) -> DataFile:
    """A position delete file deleting `positions` of `data_file`, in its partition."""
    schema = pa.schema([_field("file_path", pa.string(), FILE_PATH_ID), _field("pos", pa.int64(), POS_ID)])
    rows = pa.table({"file_path": [data_file.file_path] * len(positions), "pos": positions}, schema=schema)
    path, size = _parquet(table, rows)
    found = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=data_file.partition,
        record_count=len(positions),
        file_size_in_bytes=size,
        # As Java's writers do: the bounds of `file_path` say which data files the deletes reach.
        lower_bounds={FILE_PATH_ID: data_file.file_path.encode()},
        upper_bounds={FILE_PATH_ID: data_file.file_path.encode()},
    )
    found.spec_id = data_file.spec_id
    return found


def equality_deletes(
    table: Table, column: str, values: list[object], partition: Record | None = None
) -> DataFile:
    """An equality delete file on `column` deleting rows holding `values` (in `partition` of the
    table's current spec, or in every partition when the spec is unpartitioned)."""
    field = table.schema().find_field(column)
    arrow_type = pa.int64() if str(field.field_type) == "long" else pa.string()
    rows = pa.table({column: values}, schema=pa.schema([_field(column, arrow_type, field.field_id)]))
    path, size = _parquet(table, rows)
    found = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition or Record(),
        record_count=len(values),
        file_size_in_bytes=size,
        equality_ids=[field.field_id],
    )
    found.spec_id = table.spec().spec_id
    return found


def commit_deletes(table: Table, delete_files: list[DataFile]) -> Table:
    """Commit a `delete` snapshot adding `delete_files` on top of the current snapshot."""
    metadata = table.metadata
    parent = metadata.current_snapshot()
    assert parent is not None, "a table with data to delete from"
    snapshot_id = random.getrandbits(62)
    sequence = metadata.next_sequence_number()
    manifest_path = f"{metadata.location}/metadata/{uuid.uuid4()}-m0.avro"
    # A manifest holds the files of one spec: the delete files', which may be an older one.
    spec = table.specs()[delete_files[0].spec_id]
    writer = _DeleteManifestWriter(
        spec, table.schema(), table.io.new_output(manifest_path), snapshot_id, "null"
    )
    with writer:
        for delete_file in delete_files:
            writer.add(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=snapshot_id,
                    sequence_number=None,
                    file_sequence_number=None,
                    data_file=delete_file,
                )
            )
    manifests = [writer.to_manifest_file(), *parent.manifests(table.io)]
    list_path = f"{metadata.location}/metadata/snap-{snapshot_id}-{uuid.uuid4()}.avro"
    output = table.io.new_output(list_path)
    with write_manifest_list(2, output, snapshot_id, parent.snapshot_id, sequence, "null") as lists:
        lists.add_manifests(manifests)
    summary = Summary(Operation.DELETE, **{"added-delete-files": str(len(delete_files))})
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id,
        sequence_number=sequence,
        timestamp_ms=int(time.time() * 1000),
        manifest_list=list_path,
        summary=summary,
        schema_id=metadata.current_schema_id,
    )
    table.catalog.commit_table(
        table,
        requirements=(AssertRefSnapshotId(ref="main", snapshot_id=parent.snapshot_id),),
        updates=(
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=snapshot_id),
        ),
    )
    return table.catalog.load_table(table.name())
