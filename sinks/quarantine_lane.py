"""The quarantine's own lane: a thread that commits the rows a sink diverts, beside the clean path.

A sink hands each batch's diverted rows to the lane and goes on. Before the sink's own commit,
`drain()` asks the lane's thread to commit everything handed to it since its last commit to the
quarantine table (while the sink's own files are written), and waits for it for at most
`drain_s`: the quarantine never holds the clean path up for longer. The thread commits sooner
only when half its buffer is full, so a sink's commit costs one quarantine commit, not one per
batch. What the lane could not take
is shed, never the clean rows: rows handed to a lane whose buffer is full, rows still waiting
when a drain gives up, and rows of a quarantine commit that failed. Shed rows are counted by
reason and logged as warnings; the quarantine table's coverage then has a gap where they were,
and replaying that span fills it (the clean table skips what it holds).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from isbre.sinks.contract import OffsetSpan, SourceFields, continue_span

if TYPE_CHECKING:
    from isbre.sinks.table_writer import TableWriter

log = logging.getLogger(__name__)
# The defaults: a quarantine that a sink's commit waits a second for, holding up to 100,000 rows.
QUARANTINE_BUFFER_ROWS = 100_000
QUARANTINE_DRAIN_S = 1.0
# At most one warning about shed rows this often, each with the running count.
WARN_EVERY_S = 10.0


@dataclass(frozen=True)
class _Diverted:
    batch: pa.RecordBatch
    span: OffsetSpan
    source: SourceFields | None
    offsets: np.ndarray
    reasons: Counter[str]  # rows by reason


class QuarantineLane:
    def __init__(self, writer: TableWriter, buffer_rows: int, drain_s: float) -> None:
        if buffer_rows < 0 or drain_s < 0:
            raise ValueError(
                f"quarantine_buffer_rows and quarantine_drain_s must be >= 0: {buffer_rows}, {drain_s}"
            )
        self.writer = writer
        self.buffer_rows = buffer_rows
        self.drain_s = drain_s
        self.shed: Counter[str] = Counter()  # rows by reason, since the lane started
        self._unreported: Counter[str] = Counter()  # shed rows not yet taken by `take_shed`
        self._queue: list[_Diverted] = []
        self._queued_rows = 0
        self._unfinished = 0  # handed over, neither landed nor shed
        self._closed = False
        self._draining = False  # a drain waits: commit what is queued now
        self._warned_at = -WARN_EVERY_S
        self._condition = threading.Condition()
        self._thread: threading.Thread | None = None

    def offer(
        self,
        batch: pa.RecordBatch,
        span: OffsetSpan,
        source: SourceFields | None,
        offsets: np.ndarray,
        reasons: Counter[str],
    ) -> None:
        """Hand diverted rows (and their span, even with no rows) to the lane; shed them if its
        buffer cannot hold them."""
        with self._condition:
            if batch.num_rows and self._queued_rows + batch.num_rows > self.buffer_rows:
                self._shed(reasons, f"its buffer holds {self._queued_rows} of {self.buffer_rows} rows", span)
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"isbre-quarantine {self.writer.identifier}", daemon=True
                )
                self._thread.start()
            self._queue.append(_Diverted(batch, span, source, offsets, reasons))
            self._queued_rows += batch.num_rows
            self._unfinished += 1
            self._condition.notify_all()

    def drain(self) -> None:
        """Wait until everything handed over has landed or been shed, for at most `drain_s`; then
        shed what is still waiting (a commit under way is left to finish)."""
        with self._condition:
            self._draining = True
            self._condition.notify_all()
            landed = self._condition.wait_for(lambda: self._unfinished == 0, timeout=self.drain_s)
            self._draining = False
            if landed:
                return
            waiting, self._queue, self._queued_rows = self._queue, [], 0
            self._unfinished -= len(waiting)
            for item in waiting:
                self._shed(
                    item.reasons, f"it did not land within quarantine_drain_s = {self.drain_s:g}", item.span
                )

    def take_shed(self) -> Counter[str]:
        """Rows shed since the last call, by reason."""
        with self._condition:
            shed, self._unreported = self._unreported, Counter()
            return shed

    def close(self) -> None:
        """Stop the lane; whatever it has not committed is dropped (the sink's own close drops its
        unfinished rows the same way)."""
        with self._condition:
            self._closed = True
            self._queue, self._queued_rows = [], 0
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join()
        self.writer.close()

    def _shed(self, reasons: Counter[str], why: str, span: OffsetSpan) -> None:
        """Count shed rows and say so (under the lock)."""
        self.shed.update(reasons)
        self._unreported.update(reasons)
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "%s: quarantine shed %d rows of %s because %s; shed so far: %s (the clean rows are kept; "
                "replay the span to fill the quarantine's gap)",
                self.writer.identifier,
                sum(reasons.values()),
                span,
                why,
                dict(self.shed),
            )

    def _run(self) -> None:
        self._load()
        while True:
            with self._condition:
                self._condition.wait_for(
                    lambda: (
                        self._closed
                        or (self._queue and (self._draining or 2 * self._queued_rows >= self.buffer_rows))
                    )
                )
                if self._closed:
                    return
                burst, self._queue, self._queued_rows = self._queue, [], 0
            try:
                for item in _merged(burst):
                    self.writer.add(item.batch, item.span, item.source, item.offsets)
                self.writer.commit(commit_seq=False)
            except Exception as e:
                self.writer.abort()
                reasons: Counter[str] = Counter()
                for item in burst:
                    reasons.update(item.reasons)
                with self._condition:
                    self._shed(reasons, f"its commit failed: {type(e).__name__}: {e}", burst[0].span)
            finally:
                with self._condition:
                    self._unfinished -= len(burst)
                    self._condition.notify_all()

    def _load(self) -> None:
        """Load the quarantine table and what it covers while the sink still pushes, not in the
        drain its commit waits for. What fails here (a table its first rows will create, a
        catalog that does not answer) is met again where the rows are added, and handled there."""
        with contextlib.suppress(Exception):
            self.writer.coverage()


def _merged(burst: list[_Diverted]) -> list[_Diverted]:
    """`burst` with each run of items whose spans continue one another as one item: the writer
    then checks and stamps one batch, not one per push (per-batch costs are most of a small one's)."""
    runs: list[list[_Diverted]] = []
    for item in burst:
        if runs and _continues(runs[-1][-1], item):
            runs[-1].append(item)
        else:
            runs.append([item])
    return [_joined(run) if len(run) > 1 else run[0] for run in runs]


def _present(source: SourceFields | None) -> tuple[bool, ...] | None:
    return None if source is None else tuple(column is not None for column in source.columns)


def _continues(last: _Diverted, item: _Diverted) -> bool:
    return (
        item.span.key == last.span.key
        and item.span.start == last.span.end
        and item.batch.schema == last.batch.schema
        and _present(item.source) == _present(last.source)
    )


def _joined(run: list[_Diverted]) -> _Diverted:
    first = run[0]
    with_rows = [item.batch for item in run if item.batch.num_rows]
    batch = pa.Table.from_batches(with_rows).combine_chunks().to_batches()[0] if with_rows else first.batch
    source = None
    if first.source is not None:
        parts = zip(*(item.source.columns for item in run if item.source is not None), strict=True)
        source = SourceFields(*(None if part[0] is None else pa.concat_arrays(part) for part in parts))
    reasons: Counter[str] = Counter()
    for item in run:
        reasons.update(item.reasons)
    span = first.span
    for item in run[1:]:
        span = continue_span(span, item.span)
    return _Diverted(batch, span, source, np.concatenate([item.offsets for item in run]), reasons)
