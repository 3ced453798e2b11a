"""The live fan-out: a bounded ring of recent records that subscribers read at their own pace.

The writer thread appends each committed batch and wakes the waiting
subscribers; it never waits for them. There are no per-subscriber queues: a
subscriber keeps only its cursor, takes what the ring holds after it, and
when it has fallen behind the ring (its cursor is older than the oldest
record kept), it reads the commit log instead until it catches up. Memory is
the ring's size, however many subscribers there are and however slow.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Protocol

from isbre.catalog.commit_log import CommitLog
from isbre.catalog.records import CommitRecord
from isbre.events.filters import EventFilter
from isbre.events.frames import sse_frame

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    record: CommitRecord
    frame: bytes  # encoded once, shared by every subscriber

    @classmethod
    def of(cls, record: CommitRecord) -> Entry:
        return cls(record, sse_frame(record))

    @property
    def size(self) -> int:
        """About what the entry holds in memory: its frame, and the record the frame was made from."""
        return 2 * len(self.frame)


class Stop(Protocol):
    """Anything with an awaitable wait(): asyncio's or anyio's Event."""

    def is_set(self) -> bool: ...

    async def wait(self) -> Any: ...


@dataclass(eq=False)
class Waiter:
    """A subscriber's place in line, made once and reused for every wait: `cursor` moves past
    records it skips while waiting; `stopped` ends the subscription (server shutdown)."""

    event_filter: EventFilter
    cursor: int = 0
    stopped: bool = False
    event: asyncio.Event = field(default_factory=asyncio.Event)


class Broadcaster:
    def __init__(self, commit_log: CommitLog, capacity: int = 4096, max_bytes: int = 64 << 20) -> None:
        """The ring holds at most `capacity` records and about `max_bytes` of them (a record and its
        frame); the oldest go first."""
        self._log = commit_log
        self._ring: deque[Entry] = deque(maxlen=capacity)
        self._max_bytes = max_bytes
        self.ring_bytes = 0
        self._lock = threading.Lock()
        self._high = commit_log.commit_seq()
        self._waiters: dict[asyncio.AbstractEventLoop, set[Waiter]] = {}
        self._lag: dict[asyncio.AbstractEventLoop, float] = {}
        commit_log.writer.add_listener(self.publish)

    def close(self) -> None:
        self._log.writer.remove_listener(self.publish)

    @property
    def high(self) -> int:
        return self._high

    def subscribers_waiting(self) -> int:
        with self._lock:
            return sum(len(events) for events in self._waiters.values())

    # -- the writer side

    def publish(self, records: list[CommitRecord]) -> None:
        """Called on the writer thread after each committed batch."""
        if records[0].commit_seq > self._high + 1:
            # Another process committed to this store in between: keep the ring gap-free.
            records = self._log.commits_since(self._high, records[0].commit_seq - self._high - 1) + records
        self._append([Entry.of(r) for r in records if r.commit_seq > self._high])

    def publish_from_log(self) -> None:
        """Publish what the commit log gained since the last call: in a process other than the
        writer's, and for commits other processes made. Only the newest ring's worth is kept;
        older subscribers read the log."""
        high = self._log.commit_seq()
        if high <= self._high:
            return
        start = max(self._high, high - (self._ring.maxlen or 0))
        self._append([Entry.of(r) for r in self._log.commits_since(start, high - start)])

    def _append(self, entries: list[Entry]) -> None:
        with self._lock:
            # The writer's listener and the commit feed may both publish a record: once is enough.
            entries = [entry for entry in entries if entry.record.commit_seq > self._high]
            if not entries:
                return
            if entries[0].record.commit_seq != self._high + 1:
                self._ring.clear()  # the ring holds consecutive records only
                self.ring_bytes = 0
            for entry in entries:
                if len(self._ring) == self._ring.maxlen:
                    self.ring_bytes -= self._ring[0].size
                self._ring.append(entry)
                self.ring_bytes += entry.size
            while self.ring_bytes > self._max_bytes and self._ring:
                self.ring_bytes -= self._ring.popleft().size
            self._high = entries[-1].record.commit_seq
            loops = list(self._waiters)
        for loop in loops:
            try:
                loop.call_soon_threadsafe(self._notify, loop, entries, time.monotonic())
            except RuntimeError:  # that loop has closed; its subscribers are gone
                continue

    def lag(self, loop: asyncio.AbstractEventLoop) -> float:
        """Seconds a notification recently waited for `loop` to run it: how busy the loop is."""
        return self._lag.get(loop, 0.0)

    def _notify(self, loop: asyncio.AbstractEventLoop, entries: list[Entry], published: float) -> None:
        """On the subscribers' loop: wake those with something to send, move the others' cursors on.

        Checking a filter here costs a fraction of waking a subscriber to find
        nothing to send, which is most of them when each follows a few tables.
        """
        self._lag[loop] = 0.8 * self._lag.get(loop, 0.0) + 0.2 * (time.monotonic() - published)
        with self._lock:
            waiters = list(self._waiters.get(loop, ()))
        for waiter in waiters:
            if waiter.event.is_set():
                continue
            fresh = [e.record for e in entries if e.record.commit_seq > waiter.cursor]
            if not fresh:
                continue
            if waiter.event_filter.everything or any(map(waiter.event_filter.matches, fresh)):
                waiter.event.set()
            else:
                waiter.cursor = fresh[-1].commit_seq

    # -- the subscriber side

    def since(self, cursor: int) -> list[Entry] | None:
        """Entries after `cursor` from the ring; None when the ring no longer reaches back that far."""
        with self._lock:
            if cursor >= self._high:
                return []
            if not self._ring or cursor < self._ring[0].record.commit_seq - 1:
                return None
            return list(islice(self._ring, cursor - self._ring[0].record.commit_seq + 1, None))

    async def wait(self, waiter: Waiter, cursor: int) -> int | None:
        """Wait until a record after `cursor` that the waiter's filter matches has been published.

        Returns the cursor to read on from: past every record skipped meanwhile; None once the
        waiter was stopped (the server is shutting down).
        """
        # One event per subscription, not a task or two per wait: with a hundred subscribers,
        # per-wait futures cost the event loop as much as sending the events did.
        loop = asyncio.get_running_loop()
        waiter.cursor = cursor
        waiter.event.clear()
        with self._lock:
            if waiter.stopped:
                return None
            if self._high > cursor:
                return cursor
            self._waiters.setdefault(loop, set()).add(waiter)
        try:
            await waiter.event.wait()
        finally:
            with self._lock:
                waiting = self._waiters.get(loop)
                if waiting is not None:
                    waiting.discard(waiter)
                    if not waiting:
                        del self._waiters[loop]
        return None if waiter.stopped else waiter.cursor

    @staticmethod
    def stop(waiter: Waiter) -> None:
        """End `waiter`'s subscription; called on its event loop."""
        waiter.stopped = True
        waiter.event.set()
