"""The rows compaction reads from a group of small data files (with the deletes that apply to them
applied), and the files it writes them to.

On a format v3 table the rows carry their lineage (catalog/row_lineage.py): they are read one
file at a time, a row's position in its file being part of its id, and written with the two
lineage columns after the table's own.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
from isbre.catalog.compaction import WRITE_TARGET_FILE_SIZE, LiveFiles, target_file_size
from isbre.catalog.equality_deletes import any_matched, deleted_keys
from isbre.catalog.pyiceberg_internals import data_files_of
from isbre.catalog.row_lineage import with_lineage, with_lineage_columns
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import FileScanTask
from pyiceberg.table.metadata import TableMetadata


def read_group(metadata: TableMetadata, group: list[DataFile], io: FileIO, live: LiveFiles) -> pa.Table:
    """The rows of `group`'s files, in the table's current schema, with the deletes that apply to
    them applied (on v3, with their lineage)."""
    scan = ArrowScan(metadata, io, metadata.schema(), AlwaysTrue())
    if metadata.format_version < 3:
        plain = [FileScanTask(f) for f in group if not live.deletes.get(f.file_path)]
        parts = [scan.to_table(plain)]
        keys: dict[str, pa.Table] = {}  # each equality delete file's rows, read once
        for data_file in group:
            if deletes := live.deletes.get(data_file.file_path):
                parts.append(_without_deleted(metadata, io, scan, data_file, deletes, keys))
        return pa.concat_tables(parts, promote_options="permissive")
    return pa.concat_tables(
        with_lineage(scan.to_table([FileScanTask(f)]), io, f.file_path, live.inherited[f.file_path])
        for f in group
    )


def _without_deleted(
    metadata: TableMetadata,
    io: FileIO,
    scan: ArrowScan,
    data_file: DataFile,
    deletes: tuple[DataFile, ...],
    keys: dict[str, pa.Table],
) -> pa.Table:
    """The rows of `data_file` that its `deletes` leave (position deletes by PyIceberg's reader,
    equality deletes here: catalog/equality_deletes.py)."""
    positional = {d for d in deletes if d.content != DataFileContent.EQUALITY_DELETES}
    rows = scan.to_table([FileScanTask(data_file, delete_files=positional)])
    equality = [d for d in deletes if d.content == DataFileContent.EQUALITY_DELETES]
    for delete_file in equality:
        if delete_file.file_path not in keys:
            ids = list(delete_file.equality_ids or [])
            keys[delete_file.file_path] = deleted_keys(io, metadata.schema(), delete_file.file_path, ids)
    if not equality:
        return rows
    return rows.filter(pa.array(~any_matched(rows, [keys[d.file_path] for d in equality])))


def write_rows(metadata: TableMetadata, rows: pa.Table, io: FileIO) -> list[DataFile]:
    """`rows` written as the table's data files, of the compaction's target size (on v3, with
    their lineage columns)."""
    aimed: dict[str, object] = {
        "properties": {
            **metadata.properties,
            WRITE_TARGET_FILE_SIZE: str(target_file_size(metadata.properties)),
        }
    }
    if metadata.format_version >= 3:
        aimed["schemas"] = [
            with_lineage_columns(schema) if schema.schema_id == metadata.current_schema_id else schema
            for schema in metadata.schemas
        ]
    return list(data_files_of(metadata.model_copy(update=aimed), rows, io, uuid.uuid4()))
