"""Small builders shared by the sink tests."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from sinks.contract import CommitInfo, OffsetSpan, SourceFields
from sinks.iceberg import IcebergSink


def rows(start: int, end: int, **extra: pa.Array) -> pa.RecordBatch:
    """A payload batch whose `n` column equals the offset each row is pushed at."""
    numbers = pa.array(range(start, end), pa.int64())
    labels = pa.array([f"row {i}" for i in range(start, end)])
    return pa.RecordBatch.from_pydict({"n": numbers, "label": labels, **extra})


def span(start: int, end: int, partition: int = 0, topic: str = "orders") -> OffsetSpan:
    return OffsetSpan("kafka-1", topic, partition, start, end)


def offsets_in(table: Table, prefix: str = "_twg_") -> list[tuple[int, int]]:
    """(partition, offset) of every row, sorted (duplicates kept)."""
    columns = (f"{prefix}source_partition", f"{prefix}source_offset")
    data = table.refresh().scan(selected_fields=columns).to_arrow()
    return sorted(zip(data[columns[0]].to_pylist(), data[columns[1]].to_pylist(), strict=True))


def write_once(
    catalog: Catalog,
    ident: str,
    batch: pa.RecordBatch,
    covered: OffsetSpan,
    source: SourceFields | None = None,
    **options: object,
) -> CommitInfo:
    """One sink session: one push, one commit."""
    with IcebergSink(catalog, ident, **options) as sink:
        sink.push(batch, covered, source)
        return sink.finish()[0]
