"""The rows compaction reads from a group of small data files (with the deletes that apply to them
applied), and the files it writes them to.

On a format v3 table the rows carry their lineage (catalog/row_lineage.py): they are read one
file at a time, a row's position in its file being part of its id, and written with the two
lineage columns after the table's own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

import pyarrow as pa
from isbre.catalog.compaction import WRITE_TARGET_FILE_SIZE, LiveFiles, target_file_size
from isbre.catalog.equality_deletes import DeletedKeys
from isbre.catalog.pyiceberg_internals import data_files_of, rows_at_positions
from isbre.catalog.row_lineage import with_lineage, with_lineage_columns
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import FileScanTask
from pyiceberg.table.metadata import TableMetadata


def live_rows(
    metadata: TableMetadata, io: FileIO, files: Sequence[tuple[DataFile, Iterable[DataFile]]]
) -> list[tuple[pa.Table, pa.Array]]:
    """The rows of each data file with the delete files given with it applied (position deletes,
    deletion vectors and equality deletes), in the table's current schema, and each row's position
    in its file."""
    schema = metadata.schema()
    scan = ArrowScan(metadata, io, schema, AlwaysTrue())
    equality = [[d for d in deletes if d.content == DataFileContent.EQUALITY_DELETES] for _, deletes in files]
    tasks = [
        FileScanTask(data_file, delete_files={d for d in deletes if d not in found})
        for (data_file, deletes), found in zip(files, equality, strict=True)
    ]
    keys = DeletedKeys(io, schema)
    read = []
    for (rows, positions), found in zip(rows_at_positions(scan, io, tasks), equality, strict=True):
        if found:
            kept = pa.array(~keys.matched(rows, [(d.file_path, d.equality_ids or []) for d in found]))
            rows, positions = rows.filter(kept), positions.filter(kept)
        read.append((rows, positions))
    return read


def read_group(metadata: TableMetadata, group: list[DataFile], io: FileIO, live: LiveFiles) -> pa.Table:
    """The rows of `group`'s files, in the table's current schema, with the deletes that apply to
    them applied (on v3, with their lineage)."""
    if metadata.format_version < 3:
        read = live_rows(metadata, io, [(f, live.deletes.get(f.file_path, ())) for f in group])
        return pa.concat_tables([rows for rows, _ in read], promote_options="permissive")
    scan = ArrowScan(metadata, io, metadata.schema(), AlwaysTrue())
    return pa.concat_tables(
        with_lineage(scan.to_table([FileScanTask(f)]), io, f.file_path, live.inherited[f.file_path])
        for f in group
    )


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
