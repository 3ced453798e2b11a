"""The relays' own process: `python -m isbre.events.relay_worker`, started and stopped by `isbre serve`.

One process per server runs every relay configured, each an asyncio task reading the commit log
from the shared store; on a database that several servers share, the store's `relays` lease lets
one server's process relay at a time. Commits never wait for it: it only reads the log, and writes
the relays' positions every quarter of a second in one small transaction. It runs at a low
scheduling priority, so that the catalog's commits come first. Its settings (the relays' URLs and
secrets) come in the environment, never on the command line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from isbre.catalog.commit_log import CommitLog
from isbre.catalog.feed import CommitFeed
from isbre.catalog.processes import start_helper, take_lease
from isbre.catalog.store import Lease, StoreUnavailableError
from isbre.catalog.stores import helper_store
from isbre.catalog.writer import Batch, WriterOverloadedError
from isbre.events.cloudevents import EventSource
from isbre.events.filters import EventFilter
from isbre.events.relay import Relay
from isbre.events.relay_settings import NatsRelay, WebhookRelay
from isbre.events.relay_status import CURSOR_PREFIX, RELAYS_ENV, write_report
from isbre.events.relay_targets import target_for
from pydantic import TypeAdapter

log = logging.getLogger("isbre.events.relay_worker")  # by name: the module runs as __main__

LEASE = "relays"
# How often positions are written and the status file is updated.
TICK_S = 0.25

_SETTINGS = TypeAdapter(list[NatsRelay | WebhookRelay])


def _relays(config: dict[str, Any], commit_log: CommitLog) -> list[Relay]:
    source = EventSource(**config["source"])
    tags = {name: tuple(each) for name, each in config["tags"].items()}
    cursors = commit_log.cursors()
    relays = []
    for settings in _SETTINGS.validate_python(config["relays"]):
        name = settings.key()
        scopes = tuple(tuple(scope) for scope in config["scopes"].get(name, ()))
        filters: list[EventFilter] = settings.filters(scopes, tags)
        target = target_for(settings, source)
        position = cursors[CURSOR_PREFIX + name]
        relays.append(Relay(name, target, filters, commit_log, source, position, settings.max_retry_seconds))
    return relays


def _save(commit_log: CommitLog, positions: dict[str, int]) -> None:
    def mutation(batch: Batch) -> None:
        for name, position in positions.items():
            batch.view.put_cursor(CURSOR_PREFIX + name, position)

    commit_log.writer.execute(mutation)


async def _relay(
    relays: list[Relay], commit_log: CommitLog, lease: Lease, state: Path, serving: Callable[[], bool]
) -> int:
    stopping = asyncio.Event()
    committed = [asyncio.Event() for _ in relays]
    loop = asyncio.get_running_loop()

    def wake() -> None:
        for event in committed:
            event.set()

    def heard() -> None:  # on the feed's thread
        loop.call_soon_threadsafe(wake)

    # Commits are made in the server's processes: the feed hears of them from the store (a changed
    # LMDB file, PostgreSQL's NOTIFY), so an idle relay neither polls nor waits.
    feed = CommitFeed(commit_log)
    feed.follow(heard)
    feed.start()
    pairs = zip(relays, committed, strict=True)
    tasks = [asyncio.create_task(relay.run(stopping, event), name=relay.name) for relay, event in pairs]
    saved = {relay.name: relay.status.position for relay in relays}
    reported = ""
    code = 0
    while True:
        moved = {r.name: r.status.position for r in relays if r.status.position != saved[r.name]}
        if moved:
            try:
                await asyncio.to_thread(_save, commit_log, moved)
                saved.update(moved)
            except (StoreUnavailableError, WriterOverloadedError) as exc:
                log.warning("relay positions not written (%s): tried again shortly", exc)
        reported = write_report(state, {r.name: r.status for r in relays}, relaying=True, unless=reported)
        if stopping.is_set():
            break
        if not serving():
            stopping.set()  # one more round: the positions reached are written
        elif not lease.held() or any(task.done() for task in tasks):
            log.error("the relays lease is lost or a relay stopped: exiting to start again")
            stopping.set()
            code = 3
        else:
            await asyncio.sleep(TICK_S)
            continue
        wake()
        await asyncio.gather(*tasks, return_exceptions=True)
    feed.close()
    return code


def main(argv: list[str] | None = None) -> int:
    state = start_helper("isbre.events.relay_worker", argv)
    config: dict[str, Any] = json.loads(os.environ.pop(RELAYS_ENV))
    parent = os.getppid()
    stopping = threading.Event()
    commit_log = CommitLog.follow(helper_store())

    def serving() -> bool:
        return not stopping.is_set() and os.getppid() == parent

    def waiting(error: Exception | None) -> None:
        if error is not None:
            log.warning("waiting for the relays lease: %s", error)
        write_report(state, {}, relaying=False)

    lease = take_lease(commit_log.store, LEASE, serving, waiting)
    # As the lineage worker: a handler only once there is something to hand back on SIGTERM.
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    if lease is None:
        commit_log.close()
        return 0
    try:
        relays = _relays(config, commit_log)
        log.info("relaying to %s", ", ".join(relay.name for relay in relays))
        return asyncio.run(_relay(relays, commit_log, lease, state, serving))
    finally:
        lease.release()
        commit_log.close()
        log.info("stopped")


if __name__ == "__main__":
    raise SystemExit(main())
