"""What a table writer holds between taking rows and committing them, and the offset arithmetic
it decides with: which offsets a span's coverage already holds, which spans a commit carries;
which rows the table's columns cannot hold."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from isbre.catalog.coverage import Span, SpanKey
from isbre.sinks.contract import OffsetSpan, SinkError, SourceFields
from pyiceberg.schema import Schema


@dataclass(frozen=True)
class Prepared:
    """Rows taken for the next commit, stamped when their file is written: those of `batch` that
    `keep` selects (all with None), one offset each; the copy a selection makes is left to the
    write thread, which has a core of its own."""

    batch: pa.RecordBatch
    keep: pa.Array | None
    span: OffsetSpan
    offsets: np.ndarray
    source: SourceFields | None
    received: pa.Scalar
    to_json: list[str]

    @property
    def rows(self) -> int:
        return len(self.offsets)

    @property
    def nbytes(self) -> int:
        """About the Arrow bytes of the rows taken."""
        return self.batch.nbytes * self.rows // max(1, self.batch.num_rows)

    def selected(self) -> tuple[pa.RecordBatch, SourceFields | None]:
        if self.keep is None:
            return self.batch, self.source
        return self.batch.filter(self.keep), self.source.filter(self.keep) if self.source else None


def covered_offsets(ranges: Sequence[tuple[int, int]], offsets: np.ndarray) -> np.ndarray:
    """Per offset, whether one of the sorted, disjoint `ranges` holds it."""
    if not ranges:
        return np.zeros(len(offsets), dtype=bool)
    starts = np.array([r[0] for r in ranges], dtype=np.int64)
    ends = np.array([r[1] for r in ranges], dtype=np.int64)
    index = np.searchsorted(starts, offsets, side="right") - 1
    return (index >= 0) & (offsets < ends[np.maximum(index, 0)])


def broken_rows(errors: np.ndarray, offsets: np.ndarray) -> str:
    """What `contract_errors` found, one clause per error with how many rows and their offsets."""
    said = []
    for error in dict.fromkeys(e for e in errors if e is not None):
        at = offsets[errors == error]
        shown = ", ".join(map(str, at[:5])) + (", ..." if len(at) > 5 else "")
        said.append(f"{error}: {len(at)} rows (offsets {shown})")
    return "; ".join(said)


def spans_of(key: SpanKey, ranges: Iterable[tuple[int, int]]) -> list[Span]:
    return [Span(key, s, e) for s, e in ranges]


def inside(ranges: Sequence[tuple[int, int]], start: int, end: int) -> bool:
    return start == end or any(s <= start and end <= e for s, e in ranges)


def exact_values(batch: pa.RecordBatch, exact: Mapping[str, pa.DataType], table: str) -> pa.RecordBatch:
    """`batch` with its integer columns bound for float or double columns (`exact`: the column
    names and their types) as such; SinkError for a value the column's type does not hold exactly."""
    for name, kind in exact.items():
        index = batch.schema.get_field_index(name)
        try:
            batch = batch.set_column(
                index, batch.schema.field(index).with_type(kind), batch.column(index).cast(kind)
            )
        except pa.ArrowInvalid as exc:
            raise SinkError(
                f"{table}: column {name!r}: a whole number its {kind} column cannot hold exactly: {exc}"
            ) from exc
    return batch


def contract_errors(schema: Schema, batch: pa.RecordBatch) -> np.ndarray | None:
    """Why each row of `batch` cannot be written to a table of `schema`, None for a row that can (a
    null in a required column: the table's own schema says it cannot be null); None when all can.
    The table must have been fitted to `batch`'s schema (TableWriter.fit)."""
    errors: np.ndarray | None = None
    for field in schema.fields:
        if not field.required or field.name not in batch.schema.names:
            continue
        column = batch.column(field.name)
        if not column.null_count:
            continue
        if errors is None:
            errors = np.full(batch.num_rows, None, dtype=object)
        first = np.asarray(column.is_null(), dtype=bool) & ~errors.astype(bool)  # a row's first error
        errors[first] = f"{field.name!r} is required and is null"
    return errors
