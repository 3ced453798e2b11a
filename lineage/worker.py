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

import argparse
import json
import logging
import os
import signal
import sys
import threading
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from catalog import CatalogService
from catalog.object_storage import S3Options
from catalog.processes import SupervisedProcess
from catalog.warehouses import Warehouse, open_warehouses, read_metadata
from lineage.config import build_client
from lineage.mapping import LineageMapper, LineageNames
from lineage.outbox import CURSOR, LineageOutbox, OutboxStatus, start_from_now

log = logging.getLogger(__name__)
STATUS_FILE = "lineage-status.json"
# The environment variable carrying the delivery settings (JSON: url and api_key, or transport).
DELIVERY_ENV = "ISBRE_LINEAGE_DELIVERY"


def status_path(store: Path) -> Path:
    """Beside the store: the status of the worker following that store's log."""
    return store.parent / STATUS_FILE


def read_status(store: Path) -> tuple[OutboxStatus, int | None] | None:
    """The worker's last status and its process id."""
    try:
        found = json.loads(status_path(store).read_text())
        pid = found.pop("pid", None)
        return OutboxStatus(**found), pid
    except (OSError, ValueError, TypeError):
        return None


def _write_status(store: Path, status: OutboxStatus) -> None:
    path = status_path(store)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({"pid": os.getpid(), **asdict(status)}))
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lineage.worker")
    parser.add_argument("--store", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.nice(19)

    delivery: dict[str, Any] = json.loads(os.environ.pop(DELIVERY_ENV, "{}"))
    transport = json.loads(delivery["transport"]) if "transport" in delivery else None
    client = build_client(delivery.get("url"), delivery.get("api_key"), transport)
    if client is None:
        log.error("no OpenLineage transport is configured")
        return 2
    parent = os.getppid()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    # The warehouses' storage settings hold the server's own credentials: they come in the
    # environment too. The worker reads table metadata through them.
    warehouses = [
        Warehouse(w["name"], w["root"], S3Options(**(w["s3"] or {}))) for w in delivery["warehouses"]
    ]
    services = open_warehouses(args.store, warehouses)
    service = services[0]
    outbox = LineageOutbox(
        service,
        client,
        LineageMapper(LineageNames(**delivery["names"]), partial(read_metadata, services)),
        idle_wait=0.05,
    )
    outbox.start()
    try:
        # Commits happen in the server's process: nothing here wakes the outbox but its own polling.
        while not stopping.is_set() and os.getppid() == parent:
            _write_status(args.store, outbox.status)
            stopping.wait(0.25)
    finally:
        outbox.stop()
        _write_status(args.store, outbox.status)
        service.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


class LineageWorker(SupervisedProcess):
    """The server's handle on the worker process: start, restart when it dies, stop, status."""

    def __init__(
        self,
        service: CatalogService,
        store: Path,
        warehouses: list[Warehouse],
        names: LineageNames,
        delivery: dict[str, str],
    ) -> None:
        self._service = service
        self._store = store
        worker_settings = {
            **delivery,
            "warehouses": [asdict(w) for w in warehouses],
            "names": asdict(names),
        }
        super().__init__(
            "lineage worker",
            [sys.executable, "-m", "lineage.worker", "--store", str(store)],
            {**os.environ, DELIVERY_ENV: json.dumps(worker_settings)},
        )

    def start(self) -> None:
        start_from_now(self._service)  # before any request: the worker takes a moment to start
        super().start()

    @property
    def status(self) -> OutboxStatus:
        return observed_status(self._service, self._store)

    def backlog(self) -> int:
        return backlog(self._service)


def observed_status(service: CatalogService, store: Path) -> OutboxStatus:
    delivered = service.consumer_cursor(CURSOR) or 0
    found = read_status(store)
    status = found[0] if found else OutboxStatus()
    status.delivered_seq = max(status.delivered_seq, delivered)
    return status


def backlog(service: CatalogService) -> int:
    return service.commit_seq() - (service.consumer_cursor(CURSOR) or 0)


class LineageObserver:
    """The lineage worker as a server's worker process sees it: the supervisor runs it; its status
    file and the store's cursor say how it does."""

    def __init__(self, service: CatalogService, store: Path) -> None:
        self._service = service
        self._store = store

    @property
    def pid(self) -> int | None:
        found = read_status(self._store)
        pid = found[1] if found else None
        if pid is None:
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return pid

    @property
    def status(self) -> OutboxStatus:
        return observed_status(self._service, self._store)

    def backlog(self) -> int:
        return backlog(self._service)
