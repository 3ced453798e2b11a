"""Values of another type, judged row by row: a batch column the table's column cannot take as a
whole is cast to the table's type value by value, and the values that do not cast are the rows'
contract errors (a quarantining sink diverts those rows and writes the others).

Only top-level columns of primitive types are judged so; a struct, list or map of another shape,
and a timestamp of the other time-zone kind, stay a refusal of the batch (the sink fits the table
and names why), since no single value could fix them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from isbre.catalog.pyiceberg_internals import arrow_schema_without_ids
from isbre.sinks.contract import SchemaDriftError
from isbre.sinks.provisioning import fit_column
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, PrimitiveType, TimestampType, TimestamptzType

MAX_VALUE_CHARS = 60  # of a refused value quoted in its row's error


def _value_text(value: pa.Scalar) -> str:
    text = repr(value.as_py())
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def _cast_each(column: pa.Array, target: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """`column` cast to `target`, null where a value does not cast, and where it did not. The whole
    column is tried first, then its halves, so a few bad values among many cost a few casts (a
    column of nothing but bad values, a cast each)."""
    bad = np.zeros(len(column), dtype=bool)
    pieces: list[tuple[int, pa.Array]] = []  # each cast piece with where it starts
    pending = [(0, len(column))]
    while pending:
        start, stop = pending.pop()
        try:
            pieces.append((start, pc.cast(column.slice(start, stop - start), target)))
        except pa.ArrowInvalid:
            if stop - start == 1:
                bad[start] = True
                pieces.append((start, pa.nulls(1, target)))
            else:
                middle = (start + stop) // 2
                pending += [(start, middle), (middle, stop)]
    pieces.sort(key=lambda piece: piece[0])
    return pa.concat_arrays([piece for _, piece in pieces]), bad


def _judged(column: NestedField, have: NestedField) -> bool:
    """Whether values of `column` are judged one by one against the table's `have`."""
    kinds = {type(column.field_type), type(have.field_type)}
    if not isinstance(column.field_type, PrimitiveType) or not isinstance(have.field_type, PrimitiveType):
        return False
    return kinds != {TimestampType, TimestamptzType}


def conform(
    batch: pa.RecordBatch, table_schema: Schema, widen: bool
) -> tuple[pa.RecordBatch, np.ndarray | None]:
    """`batch` with each column the table cannot take whole cast value by value to the table's
    type, and per row the first value that did not cast (None for a row whose values all did;
    None for the whole when every row's did)."""
    errors: np.ndarray | None = None
    incoming = arrow_schema_without_ids(batch.schema)
    for index, column in enumerate(incoming.fields):
        have = next((f for f in table_schema.fields if f.name == column.name), None)
        if have is None or not _judged(column, have):
            continue
        try:
            fit_column(column, have, widen)
            continue  # the table takes the column as it is
        except SchemaDriftError:
            pass
        target = schema_to_pyarrow(Schema(have), include_field_ids=False).field(0).type
        values = batch.column(index)
        try:
            pc.cast(values.slice(0, 0), target)
        except pa.ArrowNotImplementedError:
            continue  # no value could cast: the batch is refused whole, naming the column
        cast, bad = _cast_each(values, target)
        batch = batch.set_column(index, batch.schema.field(index).with_type(target), cast)
        if not bad.any():
            continue
        if errors is None:
            errors = np.full(batch.num_rows, None, dtype=object)
        first = bad & ~errors.astype(bool)  # a row's first error is the one it is diverted for
        for row in np.flatnonzero(first):
            errors[row] = f"{column.name!r} is {have.field_type}; {_value_text(values[row])} is not"
    return batch, errors
