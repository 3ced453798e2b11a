"""The Iceberg sink: Arrow batches into an Iceberg table, each offset exactly once.

`IcebergSink` is the `BatchSink` over a `TableWriter` (table_writer.py), which does the work for
one table; the ack lane (lane.py) drives the same writer from a background thread.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from isbre.sinks.contract import CommitInfo, OffsetSpan, OneStreamSink, SourceFields, continue_span
from isbre.sinks.quality import Rule, judged
from isbre.sinks.quarantine_lane import QUARANTINE_BUFFER_ROWS, QUARANTINE_DRAIN_S
from isbre.sinks.table_writer import TableWriter
from pyiceberg.catalog import Catalog


class IcebergSink(OneStreamSink):
    """`BatchSink` for one stream: push its spans in order, `finish()` commits them together.

    With `rules`, each batch is judged by them first and `enforcement` (`strict`, `quarantine`
    with a `quarantine` sink, or `annotate`) says what becomes of failing rows; an `audit` sink
    gets one row per record per rule (sinks/quality.py). The quarantine is written on a lane of
    its own, holding at most `quarantine_buffer_rows` rows, that `finish()` waits for at most
    `quarantine_drain_s` (sinks/quarantine_lane.py).

    With `key` (column names), a keyed sink: a row pushed replaces the row of its key, and
    `delete(keys, span)` deletes by key, each commit one equality delete file beside its rows
    (sinks/upserts.py)."""

    def __init__(
        self,
        catalog: Catalog,
        identifier: str,
        *,
        rules: Sequence[Rule] = (),
        enforcement: str = "strict",
        quarantine: IcebergSink | None = None,
        audit: IcebergSink | None = None,
        quarantine_buffer_rows: int = QUARANTINE_BUFFER_ROWS,
        quarantine_drain_s: float = QUARANTINE_DRAIN_S,
        **options: object,
    ) -> None:
        self.writer = TableWriter(catalog, identifier, **options)  # type: ignore[arg-type]
        self.quality = judged(
            self.writer, rules, enforcement, quarantine, audit, quarantine_buffer_rows, quarantine_drain_s
        )

    def delete(
        self, keys: pa.Table | pa.RecordBatch, span: OffsetSpan, offsets: np.ndarray | None = None
    ) -> None:
        """Delete the row of each key of `keys` in the next commit (a keyed sink's: `key=[...]`),
        the keys at the offsets of `span` as a batch's rows are: a replay deletes nothing again."""
        extended = continue_span(self._span, span)
        self.writer.delete(keys, span, offsets)
        self._span = extended

    def _take(
        self, batch: pa.RecordBatch, span: OffsetSpan, source: SourceFields | None, offsets: np.ndarray | None
    ) -> None:
        if self.quality is None:
            self.writer.add(batch, span, source, offsets)
        else:
            self.quality.take(self.writer, batch, span, source, offsets)

    def _commit(self, span: OffsetSpan) -> CommitInfo:
        if self.quality is not None:
            self.quality.commit(self.writer)
        return self.writer.commit()

    def close(self) -> None:
        """Drop whatever was pushed and not finished (its files are removed), here and in the
        quarantine and audit sinks."""
        self.writer.close()
        if self.quality is not None:
            self.quality.close()

    def __enter__(self) -> IcebergSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
