"""The lineage outbox's own process: `python -m lineage.worker`, started and stopped by `isbre serve`.

Delivering lineage costs about as much CPU as the commit it describes (two
HTTP requests, serialization). In the server's process that work would
compete with commits for the interpreter lock; in a process of its own, at
the lowest scheduling priority, the operating system gives it only what the
catalog leaves idle. It reads the commit log from the shared LMDB file, keeps
its cursor there, and writes its status to a small file the server reports.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path

from catalog import CatalogService
from lineage.config import build_client
from lineage.mapping import LineageMapper, LineageNames
from lineage.outbox import CURSOR, LineageOutbox, OutboxStatus, start_from_now

log = logging.getLogger(__name__)
STATUS_FILE = "lineage-status.json"


def status_path(warehouse: Path) -> Path:
    return warehouse / STATUS_FILE


def read_status(warehouse: Path) -> OutboxStatus | None:
    try:
        return OutboxStatus(**json.loads(status_path(warehouse).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write_status(warehouse: Path, status: OutboxStatus) -> None:
    path = status_path(warehouse)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(asdict(status)))
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lineage.worker")
    parser.add_argument("--warehouse", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--url")
    parser.add_argument("--api-key")
    parser.add_argument("--transport", help="an openlineage-python transport configuration, as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.nice(19)

    client = build_client(args.url, args.api_key, json.loads(args.transport) if args.transport else None)
    if client is None:
        log.error("no OpenLineage transport is configured")
        return 2
    parent = os.getppid()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    service = CatalogService.open(args.warehouse)
    outbox = LineageOutbox(
        service,
        client,
        LineageMapper(LineageNames(args.namespace), service.table_metadata_or_none),
        idle_wait=0.05,
    )
    outbox.start()
    try:
        # Commits happen in the server's process: nothing here wakes the outbox but its own polling.
        while not stopping.is_set() and os.getppid() == parent:
            _write_status(args.warehouse, outbox.status)
            stopping.wait(0.25)
    finally:
        outbox.stop()
        _write_status(args.warehouse, outbox.status)
        service.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


class LineageWorker:
    """The server's handle on the worker process: start, stop, status."""

    def __init__(self, service: CatalogService, warehouse: Path, namespace: str, options: list[str]) -> None:
        self._service = service
        self._warehouse = warehouse
        self._command = [sys.executable, "-m", "lineage.worker", "--warehouse", str(warehouse)]
        self._command += ["--namespace", namespace, *options]
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        start_from_now(self._service)  # before any request: the worker takes a moment to start
        self._process = subprocess.Popen(self._command)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()

    @property
    def status(self) -> OutboxStatus:
        delivered = self._service.consumer_cursor(CURSOR) or 0
        status = read_status(self._warehouse) or OutboxStatus()
        status.delivered_seq = max(status.delivered_seq, delivered)
        return status

    def backlog(self) -> int:
        return self._service.commit_seq() - (self._service.consumer_cursor(CURSOR) or 0)

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None
