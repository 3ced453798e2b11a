"""Row lineage carried through a rewrite of a format v3 table's data files.

A v3 row has an id and the sequence number of the snapshot that last changed it. Both are
inherited unless a data file holds them: `_row_id` is the file's `first_row_id` plus the row's
position, `_last_updated_sequence_number` the file's data sequence number. A rewrite that moves
rows into new files (compaction) writes both out as columns of the new files, as the spec's row
lineage says, so that every row keeps its id and its sequence number: the new files' own
`first_row_id` and sequence number then name no row of theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

# The spec's reserved field ids of the two row lineage columns.
ROW_ID = NestedField(2147483540, "_row_id", LongType(), required=False)
LAST_UPDATED_SEQUENCE_NUMBER = NestedField(
    2147483539, "_last_updated_sequence_number", LongType(), required=False
)
_FIELD_ID = b"PARQUET:field_id"


@dataclass(frozen=True)
class Inherited:
    """What a data file's rows inherit where the file does not hold their lineage."""

    first_row_id: int | None
    sequence_number: int | None


def with_lineage_columns(schema: Schema) -> Schema:
    """`schema` with the two lineage columns after its own, what a rewrite writes."""
    return _appended(schema, ROW_ID, LAST_UPDATED_SEQUENCE_NUMBER)


def with_row_id_column(schema: Schema) -> Schema:
    """`schema` with `_row_id` after its own columns: a scan of it reads the ids a file holds
    (null where it holds none)."""
    return _appended(schema, ROW_ID)


def _appended(schema: Schema, *fields: NestedField) -> Schema:
    return Schema(
        *schema.fields, *fields, schema_id=schema.schema_id, identifier_field_ids=schema.identifier_field_ids
    )


def with_lineage(rows: pa.Table, io: FileIO, path: str, inherited: Inherited) -> pa.Table:
    """The rows of the data file at `path` (all of them, in the file's order) with their lineage
    columns: what the file holds of them, else what they inherit (null where nothing is)."""
    held = _held(io, path)
    count = rows.num_rows
    ids = row_ids(held.get(ROW_ID.field_id), count, inherited.first_row_id)
    sequence_numbers = pa.array([inherited.sequence_number] * count, pa.int64())
    if LAST_UPDATED_SEQUENCE_NUMBER.field_id in held:
        sequence_numbers = pc.coalesce(held[LAST_UPDATED_SEQUENCE_NUMBER.field_id], sequence_numbers)
    return rows.append_column(ROW_ID.name, ids).append_column(
        LAST_UPDATED_SEQUENCE_NUMBER.name, sequence_numbers
    )


def row_ids(
    held: pa.ChunkedArray | pa.Array | None, count: int, first_row_id: int | None
) -> pa.ChunkedArray | pa.Array:
    """The `_row_id` of each of a data file's `count` rows, in the file's order: what the file
    holds of it (`held`, null where it holds none), else the file's `first_row_id` plus the row's
    position; null where neither is known."""
    inherited = (
        pa.nulls(count, pa.int64())
        if first_row_id is None
        else pc.add(pa.array(range(count), pa.int64()), first_row_id)
    )
    return inherited if held is None else pc.coalesce(held, inherited)


def _held(io: FileIO, path: str) -> dict[int, pa.ChunkedArray]:
    """The lineage columns the Parquet file at `path` holds, by field id."""
    wanted = {ROW_ID.field_id, LAST_UPDATED_SEQUENCE_NUMBER.field_id}
    with io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        names = {
            field.name: int(field.metadata[_FIELD_ID])
            for field in parquet.schema_arrow
            if field.metadata and _FIELD_ID in field.metadata and int(field.metadata[_FIELD_ID]) in wanted
        }
        if not names:
            return {}
        table = parquet.read(columns=list(names))
    return {field_id: table.column(name) for name, field_id in names.items()}
