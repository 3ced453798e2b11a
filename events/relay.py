"""One relay: the commit log after its position, filtered, sent to its target in commit order.

A relay reads the log from its position, sends the records its filters pass a batch at a time, in
order (events/relay_targets.py: the target acknowledges each), and moves its position past each
one acknowledged and every one filtered out. The worker (events/relay_worker.py) writes positions
to the store. Nothing is skipped: a failed send is tried again, after a wait that doubles up to a
cap, for as long as it takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from isbre.catalog.backoff import Backoff
from isbre.catalog.commit_log import CommitLog
from isbre.catalog.records import CommitRecord
from isbre.events.cloudevents import EventSource
from isbre.events.filters import EventFilter
from isbre.events.relay_status import RelayStatus
from isbre.events.relay_targets import Target

log = logging.getLogger(__name__)

# Records read from the log at once, and sent at once (the relay checks between two sends whether
# it is told to stop).
CHUNK = 500
SEND_BATCH = 64
# How long a relay that found commits waits before it reads the log again: while commits keep
# coming, each read and each batch carries more of them, for less work per commit.
GATHER_S = 0.02
# How long an idle relay waits for word of a commit before it reads the log anyway.
IDLE_WAIT_S = 1.0
# The first wait after a failed send (it doubles up to the relay's cap).
FIRST_RETRY_S = 0.25


class Relay:
    def __init__(
        self,
        name: str,
        target: Target,
        filters: list[EventFilter],
        commit_log: CommitLog,
        source: EventSource,
        position: int,
        max_retry_s: float,
    ) -> None:
        self.name = name
        self._target = target
        self._filters = filters
        self._log = commit_log
        self._source = source
        self._retries = Backoff(FIRST_RETRY_S, max_retry_s)
        self.status = RelayStatus(position=position)

    async def run(self, stopping: asyncio.Event, committed: asyncio.Event) -> None:
        """Relay until `stopping` is set; `committed` is set when the log may have grown."""
        status = self.status
        while not stopping.is_set():
            try:
                if not status.connected:
                    held = await self._target.open()
                    status.connected = True
                    if held is not None and held > status.position:
                        log.info(
                            "relay %s: its target holds commit %s already; going on after it", self.name, held
                        )
                        status.position = held
                committed.clear()  # before reading: a commit after the read sets it again
                records = await self._read(status.position)
                if not records:
                    await _wait(committed, IDLE_WAIT_S)
                    continue
                for start in range(0, len(records), SEND_BATCH):
                    if stopping.is_set():
                        return
                    batch = records[start : start + SEND_BATCH]
                    passed = [r for r in batch if all(each.matches(r) for each in self._filters)]
                    if passed:
                        await self._target.send(
                            [(r, self._source.cloud_event(r)) for r in passed], self._sent
                        )
                    status.position = batch[-1].commit_seq  # and past those filtered out
                self._retries.reset()
                if len(records) < CHUNK:
                    await _wait(stopping, GATHER_S)
            except Exception as exc:
                status.failed(exc)
                delay = self._retries.next()
                log.warning(
                    "relay %s: %s; trying commit %s again in %.2f s",
                    self.name,
                    status.last_error,
                    status.position + 1,
                    delay,
                )
                await _close_quietly(self._target)
                await _wait(stopping, delay)
        await _close_quietly(self._target)

    def _sent(self, record: CommitRecord) -> None:
        status = self.status
        status.position = record.commit_seq
        status.messages += 1
        status.last_sent_at = time.time()

    async def _read(self, position: int) -> list[CommitRecord]:
        if self._log.store.reads_in_process:  # microseconds from memory: not worth a thread
            return self._log.commits_since(position, CHUNK)
        return await asyncio.to_thread(self._log.commits_since, position, CHUNK)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


async def _close_quietly(target: Target) -> None:
    try:
        await target.close()
    except Exception as exc:  # a connection that broke may fail to close: it is dropped all the same
        log.debug("closing a relay's target: %s", exc)
