"""The lineage outbox's own process: `python -m lineage.worker`, started and stopped by `isbre serve`.

Delivering lineage costs about as much CPU as the commit it describes (two
HTTP requests, serialization). In the server's process that work would
compete with commits for the interpreter lock; in a process of its own, at
the lowest scheduling priority, the operating system gives it only what the
catalog leaves idle. It reads the commit log from the shared LMDB file, keeps
its cursor there, and writes its status to a small file the server reports.
The server restarts it when it dies. Where to deliver (a URL and key, or a
whole transport) and the warehouses' storage settings come in the environment,
never on the command line, where any user of the machine could read them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from isbre.catalog.commit_log import CommitLog
from isbre.catalog.processes import start_helper, take_lease
from isbre.catalog.store import Lease
from isbre.catalog.stores import helper_store
from isbre.catalog.warehouse_config import Warehouse
from isbre.catalog.warehouses import open_warehouses, read_metadata
from isbre.lineage.config import build_client
from isbre.lineage.handle import DELIVERY_ENV
from isbre.lineage.mapping import LineageMapper
from isbre.lineage.names import LineageNames
from isbre.lineage.outbox import LineageOutbox
from isbre.lineage.status import OutboxStatus, write_status

log = logging.getLogger("isbre.lineage.worker")  # by name: the module runs as __main__


LEASE = "lineage"


def _take_lease(commit_log: CommitLog, state: Path, keep_waiting: Callable[[], bool]) -> Lease | None:
    """Wait for the store's lineage lease, saying so in the status file; None when told to stop first."""
    waiting = OutboxStatus(delivered_seq=0)

    def note(error: Exception | None) -> None:
        if error is not None:
            waiting.failed(error)
        write_status(state, waiting, delivering=False)

    return take_lease(commit_log.store, LEASE, keep_waiting, note)


def main(argv: list[str] | None = None) -> int:
    state = start_helper("isbre.lineage.worker", argv)

    delivery: dict[str, Any] = json.loads(os.environ.pop(DELIVERY_ENV, "{}"))
    transport = json.loads(delivery["transport"]) if "transport" in delivery else None
    client = build_client(delivery.get("url"), delivery.get("api_key"), transport)
    if client is None:
        log.error("no OpenLineage transport is configured")
        return 2
    parent = os.getppid()
    stopping = threading.Event()
    # The warehouses' storage settings hold the server's own credentials: they come in the
    # environment too. The worker reads table metadata through them.
    warehouses = [Warehouse.in_helper(found) for found in delivery["warehouses"]]
    services = open_warehouses(helper_store(), warehouses)
    service = services[0]

    def serving() -> bool:
        return not stopping.is_set() and os.getppid() == parent

    def why() -> str:
        return "the server asked" if stopping.is_set() else f"the server (process {parent}) has gone"

    lease = _take_lease(service.core.commit_log, state, serving)
    # Only a worker that holds the lease has something to hand back when told to stop. Until then
    # SIGTERM's default action ends it at once, where a handler would wait for the main thread,
    # which at the lowest priority on a busy machine got no CPU for 30 s after its server died.
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    if lease is None:
        log.info("stopping before delivering: %s", why())
        service.close()
        return 0
    outbox = LineageOutbox(
        service.core.commit_log,
        client,
        LineageMapper(LineageNames(**delivery["names"]), partial(read_metadata, services)),
        idle_wait=0.05,
    )
    outbox.start()
    code = 0
    try:
        # Commits happen in the server's process: nothing here wakes the outbox but its own polling.
        while serving():
            write_status(state, outbox.status, delivering=True)
            if not lease.held() or not outbox.alive:
                # Another worker may hold the lease now: stop at once; the server starts this again.
                log.error("the lineage lease is lost or the outbox stopped: exiting to start again")
                code = 3
                break
            stopping.wait(0.25)
        else:
            log.info("stopping: %s", why())
    finally:
        outbox.stop()
        write_status(state, outbox.status, delivering=False)
        lease.release()
        service.close()
    # With the time of the line above, how long a stop took: a stop is slow on a busy machine,
    # as this process runs at the lowest priority.
    log.info("stopped")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
