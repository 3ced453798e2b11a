"""What a server process runs while it serves, typed: the warehouses' catalogs, the events ring and
its fan-out, the lineage outbox, the relays and the shared counters of workers. rest/startup.py's `running`
makes it; the routes read it through `runtime(request)`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request
from isbre.rest.shared_counters import Counts

# Imported for their types only: what the routes need of a runtime costs them no import.
if TYPE_CHECKING:
    from isbre.catalog import CatalogService
    from isbre.catalog.maintainer import Maintainer
    from isbre.events.broadcast import Broadcaster
    from isbre.events.fanout import FanoutChannel, FanoutProcess
    from isbre.events.relay_handle import RelayObserver, RelayProcess
    from isbre.lineage.handle import LineageObserver, LineageWorker
    from isbre.rest.delegation import Delegation
    from isbre.rest.plan_work import PlanWork
    from isbre.rest.settings import Settings
    from isbre.rest.shared_counters import SharedCounters


class KeyLocks:
    """One lock per Idempotency-Key in use (rest/idempotency.py), so that requests with one key wait
    for each other in this process and requests with different keys never do."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held: dict[str, tuple[threading.Lock, int]] = {}

    @contextmanager
    def holding(self, key: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._held.get(key) or (threading.Lock(), 0)
            self._held[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._held[key]
                if users == 1:
                    del self._held[key]
                else:
                    self._held[key] = (lock, users - 1)

    def __len__(self) -> int:
        """How many keys are held or waited for."""
        return len(self._held)


@dataclass
class RequestCounters:
    """What the middleware and the routes count from the first request on (before start-up ends)."""

    http_requests: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    metrics_reports: Counter[str] = field(default_factory=Counter)
    event_streams: int = 0  # served in this process


@dataclass
class Runtime:
    """What one server process holds while it serves."""

    settings: Settings
    counters: RequestCounters
    services: dict[str, CatalogService]
    delegation: dict[str, Delegation]
    broadcaster: Broadcaster
    outbox: LineageWorker | LineageObserver | None
    relays: RelayProcess | RelayObserver | None
    fanout: FanoutProcess | FanoutChannel | None
    shared_counters: SharedCounters | None
    maintainer: Maintainer | None
    planning: PlanWork
    key_locks: KeyLocks = field(default_factory=KeyLocks)

    @property
    def service(self) -> CatalogService:
        """The first warehouse's catalog: its writer and store are every warehouse's."""
        return next(iter(self.services.values()))

    @property
    def open_streams(self) -> int:
        """Event streams served in this process and by the fan-out process."""
        return self.counters.event_streams + (self.fanout.streams if self.fanout is not None else 0)

    def own_counts(self) -> Counts:
        """What this process counted (with several workers, /metrics adds up every worker's)."""
        counters = self.counters
        rebases: Counter[str] = Counter()
        for service in self.services.values():
            rebases.update(service.tables.rebase.outcomes)
        writer = self.service.core.writer
        return Counts(
            writer.stats,
            counters.http_requests,
            counters.metrics_reports,
            self.open_streams,
            rebases,
            writer.queue_depth(),
            writer.committing,
        )


def runtime(request: Request) -> Runtime:
    found: Runtime = request.app.state.runtime
    return found
