"""The pipelined ack lane: `send` returns once a batch is queued; a background lane commits.

The lane takes everything queued since its last commit (a burst), makes it
one commit, and only then confirms each span, in offset order. A full queue
makes `send` wait: that is the backpressure. Transient failures are retried
with backoff (a retry re-reads coverage, so rows that did land are not
written again); a permanent one poisons the lane: every queued and later
send fails with the cause, and nothing that did not land is confirmed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import requests
from isbre.catalog.coverage import SpanKey
from isbre.sinks.contract import (
    CommitInfo,
    OffsetSpan,
    PoisonedError,
    Receipt,
    SinkError,
    SourceFields,
    Watermarks,
)
from isbre.sinks.iceberg import IcebergSink
from isbre.sinks.quality import Rule, judged
from isbre.sinks.quarantine_lane import QUARANTINE_BUFFER_ROWS, QUARANTINE_DRAIN_S
from isbre.sinks.table_writer import CommitOutcomeUnknownError, TableWriter
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitStateUnknownException, ServiceUnavailableError

log = logging.getLogger(__name__)

TRANSIENT = (
    CommitOutcomeUnknownError,
    CommitStateUnknownException,
    ServiceUnavailableError,
    requests.ConnectionError,
    requests.Timeout,
    TimeoutError,
    ConnectionError,
)


@dataclass
class _Queued:
    batch: pa.RecordBatch | pa.Table
    span: OffsetSpan
    source: SourceFields | None
    offsets: np.ndarray | None
    receipt: asyncio.Future[Receipt]
    deletes: bool = False  # `batch` holds keys to delete (a keyed sink's)


@dataclass
class LaneStats:
    commits: int = 0
    batches: int = 0
    rows_written: int = 0
    retries: int = 0
    largest_burst: int = 0


class PipelinedSink:
    """The async `Sink` over a `TableWriter`; use `async with` or call `close()`. `rules`,
    `enforcement`, `quarantine` and `audit` are IcebergSink's (sinks/quality.py)."""

    def __init__(
        self,
        catalog: Catalog,
        identifier: str,
        *,
        queue_size: int = 256,
        max_burst: int = 10_000,
        max_retries: int = 8,
        max_backoff_s: float = 5.0,
        rules: Sequence[Rule] = (),
        enforcement: str = "strict",
        quarantine: IcebergSink | None = None,
        audit: IcebergSink | None = None,
        quarantine_buffer_rows: int = QUARANTINE_BUFFER_ROWS,
        quarantine_drain_s: float = QUARANTINE_DRAIN_S,
        **writer_options: object,
    ) -> None:
        self.writer = TableWriter(catalog, identifier, **writer_options)  # type: ignore[arg-type]
        self.quality = judged(
            self.writer, rules, enforcement, quarantine, audit, quarantine_buffer_rows, quarantine_drain_s
        )
        self._queue: asyncio.Queue[_Queued] = asyncio.Queue(queue_size)
        self.max_burst = max_burst
        self.max_retries = max_retries
        self.max_backoff_s = max_backoff_s
        self._submitted: dict[SpanKey, int] = {}
        self._delivered: dict[SpanKey, int] = {}
        self._outstanding: list[asyncio.Future[Receipt]] = []
        self._poison: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self.stats = LaneStats()

    # -- the caller's side

    async def send(
        self,
        batch: pa.RecordBatch,
        span: OffsetSpan,
        source: SourceFields | None = None,
        offsets: np.ndarray | None = None,
    ) -> asyncio.Future[Receipt]:
        """Queue `batch` (waits while the queue is full); the returned future resolves once it is durable."""
        return await self._queued(_Queued(batch, span, source, offsets, self._receipt()))

    async def delete(
        self, keys: pa.RecordBatch | pa.Table, span: OffsetSpan, offsets: np.ndarray | None = None
    ) -> asyncio.Future[Receipt]:
        """Queue the deletion of the rows of `keys` (a keyed sink's: `key=[...]`), the keys at the
        offsets of `span`; the returned future resolves once it is durable."""
        if self.writer.keyed is None:
            raise SinkError(f"{self.writer.identifier}: only a keyed sink deletes by key (key=[...])")
        return await self._queued(_Queued(keys, span, None, offsets, self._receipt(), deletes=True))

    def _receipt(self) -> asyncio.Future[Receipt]:
        return asyncio.get_running_loop().create_future()

    async def _queued(self, item: _Queued) -> asyncio.Future[Receipt]:
        self._raise_if_poisoned()
        span, receipt = item.span, item.receipt
        if span.start < self._submitted.get(span.key, 0):
            raise SinkError(f"{span} goes back before offset {self._submitted[span.key]} already sent")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="isbre-ack-lane")
        await self._queue.put(item)
        self._raise_if_poisoned()
        self._submitted[span.key] = span.end
        self._outstanding.append(receipt)
        return receipt

    async def flush(self) -> list[Receipt]:
        """Wait until everything sent so far is durable; its receipts, in send order."""
        outstanding, self._outstanding = self._outstanding, []
        if not outstanding:
            self._raise_if_poisoned()
            return []
        return list(await asyncio.gather(*outstanding))

    def watermarks(self) -> Watermarks:
        """Per stream: the end of what was sent, and of what is durable (delivered never leads)."""
        return Watermarks(dict(self._submitted), dict(self._delivered))

    async def close(self) -> None:
        try:
            if self._poison is None:
                await self.flush()
        finally:
            if self._task is not None:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
            await asyncio.to_thread(self.writer.close)
            if self.quality is not None:
                await asyncio.to_thread(self.quality.close)

    async def __aenter__(self) -> PipelinedSink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _raise_if_poisoned(self) -> None:
        if self._poison is not None:
            raise PoisonedError(f"the sink's lane stopped: {self._poison}") from self._poison

    # -- the lane

    async def _run(self) -> None:
        while True:
            burst = [await self._queue.get()]
            while len(burst) < self.max_burst and not self._queue.empty():
                burst.append(self._queue.get_nowait())
            try:
                info = await self._commit_with_retries(burst)
            except BaseException as e:
                self._poison_with(e, burst)
                if not isinstance(e, Exception):
                    raise
                return
            self.stats.largest_burst = max(self.stats.largest_burst, len(burst))
            for item in sorted(burst, key=lambda q: (q.span.key, q.span.start)):
                self._delivered[item.span.key] = item.span.end
                if not item.receipt.done():
                    item.receipt.set_result(Receipt(item.span, info))

    async def _commit_with_retries(self, burst: list[_Queued]) -> CommitInfo:
        delay = 0.05
        for attempt in range(self.max_retries + 1):
            try:
                return await asyncio.to_thread(self._commit, burst)
            except TRANSIENT as e:
                if attempt == self.max_retries:
                    raise
                self.stats.retries += 1
                log.warning("%s: commit failed (%s); retrying in %.2f s", self.writer.identifier, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
        raise AssertionError("unreachable")

    def _commit(self, burst: list[_Queued]) -> CommitInfo:
        rows = 0
        for item in burst:
            if item.deletes:
                self.writer.delete(item.batch, item.span, item.offsets)
            elif self.quality is None:
                rows += self.writer.add(item.batch, item.span, item.source, item.offsets)
            else:
                rows += self.quality.take(self.writer, item.batch, item.span, item.source, item.offsets)
        if self.quality is not None:
            self.quality.commit(
                self.writer
            )  # first: once the table covers a span, its quarantine and audit do
        info = self.writer.commit()
        self.stats.batches += len(burst)
        self.stats.rows_written += rows
        self.stats.commits += info.snapshot_id is not None
        return info

    def _poison_with(self, cause: BaseException, burst: list[_Queued]) -> None:
        self._poison = cause
        log.error("%s: the ack lane is poisoned: %s", self.writer.identifier, cause)
        error = PoisonedError(f"the sink's lane stopped: {cause}")
        error.__cause__ = cause
        pending = list(burst)
        while not self._queue.empty():
            pending.append(self._queue.get_nowait())
        for item in pending:
            if not item.receipt.done():
                item.receipt.set_exception(error)
