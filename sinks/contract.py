"""The contract every isbre sink implements.

A sink takes Arrow record batches together with the span of source offsets
they came from, and reports back only what is durable: a `BatchSink` returns
it from `finish()`, an async `Sink` in the receipts `send()` resolves to.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa
from isbre.catalog.coverage import Span, SpanKey, check_span


@dataclass(frozen=True, order=True)
class OffsetSpan:
    """Offsets `[start, end)` of one partition of one topic of one source."""

    source_id: str
    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        check_span(self.source_id, self.topic, self.partition, self.start, self.end)

    @property
    def key(self) -> SpanKey:
        return SpanKey(self.source_id, self.topic, self.partition)

    def __len__(self) -> int:
        return self.end - self.start

    def as_span(self) -> Span:
        return Span(self.key, self.start, self.end)


def continue_span(previous: OffsetSpan | None, span: OffsetSpan) -> OffsetSpan:
    """The span from `previous`'s start to `span`'s end; `span` must follow `previous` directly."""
    if previous is None:
        return span
    if span.key != previous.key or span.start != previous.end:
        raise SinkError(f"A BatchSink takes one stream in order: {span} does not continue {previous}")
    return OffsetSpan(span.source_id, span.topic, span.partition, previous.start, span.end)


def row_offsets(rows: int, span: OffsetSpan, offsets: np.ndarray | None) -> np.ndarray:
    """One source offset per row: `span.start, span.start + 1, …` unless a source that skips offsets
    gives them (ascending, inside the span)."""
    if offsets is None:
        if rows != len(span):
            raise SinkError(f"{span}: {rows} rows for {len(span)} offsets")
        return np.arange(span.start, span.end, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    if len(offsets) != rows:
        raise SinkError(f"{span}: {len(offsets)} offsets for {rows} rows")
    outside = len(offsets) and (offsets[0] < span.start or offsets[-1] >= span.end)
    if outside or np.any(np.diff(offsets) <= 0):
        raise SinkError(f"{span}: offsets must ascend strictly and lie inside the span")
    return offsets


@dataclass(frozen=True)
class CommitInfo:
    """The commit that made a span durable.

    `snapshot_id` is None when every offset was already covered and nothing
    was written; `commit_seq` is known only when the catalog is isbre.
    """

    table: str
    snapshot_id: int | None
    commit_seq: int | None = None


@dataclass(frozen=True)
class SourceFields:
    """Per-record values a source supplies, one entry per row of the batch (each optional).

    `keys`: binary; `timestamps`: timestamp with time zone; `headers`: list of
    {key: string, value: binary} in arrival order, duplicates and nulls kept;
    `ingest_ts`: when the source read the record (default: when the batch was pushed).
    """

    keys: pa.Array | None = None
    timestamps: pa.Array | None = None
    headers: pa.Array | None = None
    ingest_ts: pa.Array | None = None

    @property
    def columns(self) -> tuple[pa.Array | None, ...]:
        return (self.keys, self.timestamps, self.headers, self.ingest_ts)

    def check(self, rows: int) -> None:
        for name, column in zip(("keys", "timestamps", "headers", "ingest_ts"), self.columns, strict=True):
            if column is not None and len(column) != rows:
                raise SinkError(f"SourceFields.{name} has {len(column)} values for {rows} rows")

    def filter(self, keep: pa.Array) -> SourceFields:
        return SourceFields(*(None if c is None else c.filter(keep) for c in self.columns))


@dataclass(frozen=True)
class Receipt:
    """A durable acknowledgement: `span` is in the table, through `commit`."""

    span: OffsetSpan
    commit: CommitInfo


@dataclass
class Watermarks:
    """Per stream: the end of the highest span accepted (submitted) and confirmed durable (delivered)."""

    submitted: dict[SpanKey, int] = field(default_factory=dict)
    delivered: dict[SpanKey, int] = field(default_factory=dict)


class SinkError(Exception):
    """A sink refused a batch or lost its destination; the message names what and why."""


class SchemaDriftError(SinkError):
    """The batch does not fit the table and the sink's evolution rules do not allow the change."""


class PoisonedError(SinkError):
    """The sink's commit lane hit a permanent error; nothing sent after it is accepted."""


class BatchSink(Protocol):
    """Push many batches of one stream, then `finish()` once.

    `push` requires the spans of one `(source_id, topic, partition)`, in
    ascending order. `finish` makes everything pushed durable in one commit
    and returns it with the span it covers (rows already covered before are
    skipped, not written twice).
    """

    def push(self, batch: pa.RecordBatch, span: OffsetSpan, source: SourceFields | None = None) -> None: ...

    def finish(self) -> tuple[CommitInfo, OffsetSpan]: ...


class OneStreamSink(ABC):
    """What every `BatchSink` does alike: spans of one stream, in order, then one `finish()`."""

    _span: OffsetSpan | None = None

    def push(
        self,
        batch: pa.RecordBatch,
        span: OffsetSpan,
        source: SourceFields | None = None,
        offsets: np.ndarray | None = None,
    ) -> None:
        extended = continue_span(self._span, span)
        self._take(batch, span, source, offsets)
        self._span = extended

    def finish(self) -> tuple[CommitInfo, OffsetSpan]:
        if self._span is None:
            raise SinkError("finish() without a push")
        span, self._span = self._span, None
        return self._commit(span), span

    @abstractmethod
    def _take(
        self, batch: pa.RecordBatch, span: OffsetSpan, source: SourceFields | None, offsets: np.ndarray | None
    ) -> None: ...

    @abstractmethod
    def _commit(self, span: OffsetSpan) -> CommitInfo: ...


class Sink(Protocol):
    """The pipelined form: `send` queues a batch and returns a future receipt."""

    async def send(
        self, batch: pa.RecordBatch, span: OffsetSpan, source: SourceFields | None = None
    ) -> Awaitable[Receipt]: ...

    async def flush(self) -> list[Receipt]: ...
