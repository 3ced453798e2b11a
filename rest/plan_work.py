"""The scan plans one server process works on: a bounded pool, a wait, and what is left over.

A plan request waits up to `wait_seconds` for its plan; one that takes longer is answered
`submitted` and keeps running, its future kept under its plan id until the client fetches it
(or cancels it). Nothing here is needed for correctness across workers: a plan id carries its
whole scan, so a worker that does not hold the future plans it again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from isbre.catalog.lru import Lru

# Plans queued or running per worker for each one that may run at once.
QUEUED_PER_SLOT = 4
# Submitted plans whose answers are kept until fetched; the oldest is forgotten first (a fetch then
# plans it again).
MAX_KEPT = 256


class PlansBusyError(Exception):
    """Every planning slot of this process is taken."""


# What a client that plans on the server is told: the spec's setting (PyIceberg 0.12, Java 1.11)
# and the Java client's flag before it (Iceberg 1.10).
SERVER_PLANNING = {"scan-planning-mode": "server", "rest-scan-planning-enabled": "true"}


class PlanWork:
    def __init__(
        self, concurrent: int, wait_seconds: float, key: bytes, server_planned: frozenset[str] = frozenset()
    ) -> None:
        """`key`: what plan ids and plan tasks are signed with (the store's, rest/scan_json.py);
        `server_planned`: the warehouses whose clients are told to plan on the server."""
        self.key = key
        self.wait_seconds = wait_seconds
        self.server_planned = server_planned
        self._pool = ThreadPoolExecutor(concurrent, thread_name_prefix="isbre-plan")
        self._slots = threading.BoundedSemaphore(concurrent * QUEUED_PER_SLOT)
        self._kept: OrderedDict[str, Future[Any]] = OrderedDict()
        self._cancelled: Lru[str, bool] = Lru(MAX_KEPT)
        self._lock = threading.Lock()

    def client_config(self, warehouse: str) -> dict[str, str]:
        """What `/v1/config` and a loaded table's `config` tell clients about planning."""
        return dict(SERVER_PLANNING) if warehouse in self.server_planned else {}

    def run(self, plan_id: str, work: Callable[[], Any]) -> Any | None:
        """What `work` answers, or None when it is not done within the wait (it goes on, kept
        under `plan_id`). PlansBusyError when too many plans are queued."""
        with self._lock:
            future = self._kept.pop(plan_id, None)
        fresh = future is None
        if future is None:
            future = self._submit(work)
        try:
            if fresh and self.wait_seconds == 0:  # no wait at all: every new plan is `submitted`
                raise FutureTimeout
            return future.result(timeout=self.wait_seconds)
        except FutureTimeout:
            with self._lock:
                self._kept[plan_id] = future
                while len(self._kept) > MAX_KEPT:
                    self._kept.popitem(last=False)[1].cancel()
            return None

    def bounded(self, work: Callable[[], Any]) -> Any:
        """What `work` answers, run in a planning slot however long it takes."""
        return self._submit(work).result()

    def cancel(self, plan_id: str) -> None:
        with self._lock:
            future = self._kept.pop(plan_id, None)
        if future is not None:
            future.cancel()  # one already running finishes, and its answer is dropped
        self._cancelled.put(plan_id, True)

    def cancelled(self, plan_id: str) -> bool:
        return self._cancelled.peek(plan_id) is not None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _submit(self, work: Callable[[], Any]) -> Future[Any]:
        if not self._slots.acquire(blocking=False):
            raise PlansBusyError("Too many scan plans in progress on this server: retry shortly")
        try:
            future = self._pool.submit(work)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        return future
