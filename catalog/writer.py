"""The commit chokepoint: one thread applies every durable mutation, in batches.

Requests queue up while a transaction is being synced; the writer then takes
all of them (up to `max_batch`) into the next LMDB write transaction, runs each
in its own savepoint so that one failure does not spoil the others, stamps a
`commit_seq` on every record it appends, and commits once: one fsync for the
whole batch. Callers are answered only after that commit has returned.
"""

from __future__ import annotations

import bisect
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from isbre.catalog.identifiers import Identifier
from isbre.catalog.records import RECORD_KINDS, CommitRecord, now_us
from isbre.catalog.store import FIRST_WAREHOUSE, Store, StoreGrowthError, StoreUnavailableError, WriteView

log = logging.getLogger(__name__)

T = TypeVar("T")

_KINDS = frozenset(RECORD_KINDS)


@dataclass(frozen=True)
class Origin:
    """Whose mutation it is: the warehouse it sees (`scope` in the store, `warehouse` its name in
    the records it logs; None: the store's first, untagged) and who asked for it (`actor`)."""

    scope: str = FIRST_WAREHOUSE
    warehouse: str | None = None
    actor: str | None = None


class Batch:
    """What a mutation sees: the transaction and a way to log its records."""

    def __init__(self, view: WriteView, last_ts: int) -> None:
        self.view = view
        self.last_ts = last_ts
        self.logged: list[CommitRecord] = []
        self.origin = Origin()

    def log(self, record: CommitRecord) -> CommitRecord:
        if record.kind not in _KINDS:
            raise ValueError(f"Not a kind of commit record: {record.kind!r}")
        if record.warehouse is None:
            record.warehouse = self.origin.warehouse
        if record.actor is None:
            record.actor = self.origin.actor
        # Keep `ts` from going backwards if the wall clock does.
        self.last_ts = max(now_us(), self.last_ts)
        record.stamp(self.view.commit_seq() + 1, self.last_ts)
        self.view.append(record)
        self.logged.append(record)
        return record


Mutation = Callable[[Batch], T]
# (kind, warehouse scope, identifier) of the pointers a mutation reads first.
Prefetch = Sequence[tuple[str, str, Identifier]]
# Called on the writer thread with each committed batch's records, in commit_seq order.
# It must return quickly: the next batch waits for it.
Listener = Callable[[list[CommitRecord]], None]


class Executes(Protocol):
    """What runs a mutation and answers once it is durable: a `Writer`, or a worker's end of the
    server's shared one (catalog/shared_writer.py)."""

    def execute(self, mutation: Mutation[T], prefetch: Prefetch = (), origin: Origin = ...) -> T: ...


@dataclass
class _Request(Generic[T]):
    mutation: Mutation[T]
    future: Future[T]
    prefetch: Prefetch = ()
    origin: Origin = Origin()
    source: int | None = None  # the worker process that handed it over (catalog/shared_writer.py)
    queued: float = field(default_factory=time.monotonic)


@dataclass
class Histogram:
    """Observations counted into cumulative-histogram buckets: `counts[i]` holds those up to
    `bounds[i]` (and above the one before); the last count, those above every bound."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.total += value
        self.counts[bisect.bisect_left(self.bounds, value)] += 1

    def add(self, other: Histogram) -> None:
        self.total += other.total
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]


def _latencies() -> Histogram:
    return Histogram((0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))


def _batch_sizes() -> Histogram:
    return Histogram((1, 2, 4, 8, 16, 32, 64, 128, 256, 512))


@dataclass
class WriterStats:
    batches: int = 0
    mutations: int = 0
    # Seconds from submitting a mutation to its durable answer.
    latency: Histogram = field(default_factory=_latencies)
    # Mutations per write transaction: how much group commit shares one sync.
    batch_size: Histogram = field(default_factory=_batch_sizes)
    # Transactions that held the commits of more than one worker process.
    shared_batches: int = 0

    def add(self, other: WriterStats) -> None:
        self.batches += other.batches
        self.mutations += other.mutations
        self.shared_batches += other.shared_batches
        self.latency.add(other.latency)
        self.batch_size.add(other.batch_size)


class WriterClosedError(RuntimeError):
    pass


class WriterOverloadedError(RuntimeError):
    """The queue of pending mutations is full: the caller should retry later."""


_STOP: Any = object()


class Writer:
    def __init__(
        self,
        store: Store,
        max_batch: int = 512,
        max_queue: int = 10_000,
        on_fatal: Callable[[BaseException], None] | None = None,
        group_wait_s: float = 0.0,
    ) -> None:
        """`on_fatal` is called, once, if the writer itself breaks: the process cannot commit any more
        (a server then shuts down rather than hang every later commit). `group_wait_s`: how long a
        transaction waits for more requests to join it, counted from its oldest request's arrival
        (requests that waited for the transaction before do not wait again)."""
        self._group_wait_s = group_wait_s
        self._store = store
        self._on_fatal = on_fatal
        self.failure: BaseException | None = None
        self._max_batch = max_batch
        self._max_queue = max_queue
        self._queue: queue.SimpleQueue[_Request[Any]] = queue.SimpleQueue()
        self._closed = False
        self._close_lock = threading.Lock()
        self._last_ts = 0
        self.stats = WriterStats()
        # The mutations of the transaction under way (one waiting for the store's write lock, held
        # by another process, shows here).
        self.committing = 0
        self._listeners: list[Listener] = []
        self._thread = threading.Thread(target=self._run, name="isbre-writer", daemon=True)
        self._thread.start()

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def submit(
        self,
        mutation: Mutation[T],
        prefetch: Prefetch = (),
        origin: Origin = Origin(),
        source: int | None = None,
    ) -> Future[T]:
        """`source`: the worker process that handed `mutation` over, counted in `stats.shared_batches`."""
        future: Future[T] = Future()
        with self._close_lock:
            if self._closed:
                raise WriterClosedError("the catalog is shutting down")
            if self._queue.qsize() >= self._max_queue:
                # Refuse rather than let memory and every caller's wait grow without bound.
                raise WriterOverloadedError(f"{self._max_queue} mutations are already waiting; retry shortly")
            self._queue.put(_Request(mutation, future, prefetch, origin, source))
        return future

    def execute(self, mutation: Mutation[T], prefetch: Prefetch = (), origin: Origin = Origin()) -> T:
        """Run `mutation` in the next batch, seeing the warehouse `origin` names, and return its
        result once it is durable; `prefetch` names the pointers it reads first, which a database
        store then reads for the whole batch in one query."""
        started = time.perf_counter()
        try:
            return self.submit(mutation, prefetch, origin).result()
        finally:
            self.stats.latency.observe(time.perf_counter() - started)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed and self.failure is None

    def queue_depth(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        """Finish every request already queued, then stop."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        batch: list[_Request[Any]] = []
        try:
            stopping = False
            while not stopping:
                batch = self._gather()
                if batch[-1] is _STOP:
                    batch.pop()
                    stopping = True
                if batch:
                    self._commit(batch)
        except BaseException as exc:  # the writer itself broke: never leave a caller waiting
            self._fail(exc, batch)

    def _gather(self) -> list[_Request[Any]]:
        """The next transaction's requests: all those waiting, and those that come while its oldest
        has waited less than `group_wait_s`; up to `max_batch`, and none after a stop."""
        batch = [self._queue.get()]
        deadline = batch[0].queued + self._group_wait_s if batch[0] is not _STOP else 0.0
        while len(batch) < self._max_batch and batch[-1] is not _STOP:
            try:
                batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return batch

    def _fail(self, exc: BaseException, batch: list[_Request[Any]]) -> None:
        self.failure = exc
        log.critical("the writer stopped (%s: %s): no commit can be made any more", type(exc).__name__, exc)
        with self._close_lock:
            self._closed = True
        closed = WriterClosedError(f"the writer has stopped: {type(exc).__name__}")
        pending = list(batch)
        while True:
            try:
                pending.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for request in pending:
            if request is not _STOP and not request.future.done():
                request.future.set_exception(closed)
        if self._on_fatal is not None:
            self._on_fatal(exc)

    def _commit(self, batch: list[_Request[Any]]) -> None:
        batch = [request for request in batch if request.future.set_running_or_notify_cancel()]
        outcomes: list[tuple[_Request[Any], Any, Exception | None]] = []
        committed: list[CommitRecord] = []

        def run(view: WriteView) -> Batch:
            # The store may run this again from the start (LMDB, after growing its map).
            outcomes.clear()
            committed.clear()
            context = Batch(view, self._last_ts)
            for kind in {kind for request in batch for kind, _, _ in request.prefetch}:
                view.prefetch(kind, [(s, i) for r in batch for k, s, i in r.prefetch if k == kind])
            for request in batch:
                context.logged, context.origin = [], request.origin
                try:
                    with view.savepoint() as savepoint:
                        context.view = savepoint.scoped(request.origin.scope)
                        outcomes.append((request, request.mutation(context), None))
                    committed.extend(context.logged)
                except Exception as exc:  # this request's own failure, e.g. a conflict
                    outcomes.append((request, None, exc))
            return context

        self.committing = len(batch)
        try:
            context = self._store.transact(run)
        except Exception as exc:  # the commit itself failed: no mutation of the batch landed
            if isinstance(exc, StoreUnavailableError):  # expected while a database is down: no trace
                log.warning("%s; answering %d request(s) with 503", exc, len(batch))
            elif not isinstance(exc, StoreGrowthError):  # the store said why already
                log.exception("write transaction failed; answering %d request(s) with the error", len(batch))
            for request in batch:
                request.future.set_exception(exc)
            return
        finally:
            self.committing = 0
        self._last_ts = context.last_ts
        self.stats.batches += 1
        self.stats.mutations += len(batch)
        self.stats.batch_size.observe(len(batch))
        if len({request.source for request in batch if request.source is not None}) > 1:
            self.stats.shared_batches += 1
        for request, result, error in outcomes:
            if error is None:
                request.future.set_result(result)
            else:
                request.future.set_exception(error)
        if committed:
            for listener in self._listeners:
                try:
                    listener(committed)
                except Exception:
                    log.exception("commit listener %r failed; the commits themselves are durable", listener)
