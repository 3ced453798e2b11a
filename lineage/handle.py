"""The server's side of the lineage worker process (lineage/worker.py): starting it, restarting it,
and reading how it does."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from isbre.catalog.commit_log import CommitLog
from isbre.catalog.processes import SupervisedProcess
from isbre.catalog.stores import helper_environment
from isbre.catalog.warehouse_config import Warehouse
from isbre.lineage.names import LineageNames
from isbre.lineage.status import CURSOR, OutboxStatus, read_status, start_from_now

# The environment variable carrying the delivery settings (JSON: url and api_key, or transport).
DELIVERY_ENV = "ISBRE_LINEAGE_DELIVERY"


class LineageObserver:
    """The lineage worker as the server's processes see it: its status file in the server's state
    directory and the store's cursor say how it does."""

    def __init__(self, commit_log: CommitLog, state: Path) -> None:
        self._log = commit_log
        self._state = state

    @property
    def status(self) -> OutboxStatus:
        delivered = self._log.consumer_cursor(CURSOR) or 0
        found = read_status(self._state)
        status = found[0] if found else OutboxStatus()
        status.delivered_seq = max(status.delivered_seq, delivered)
        return status

    @property
    def delivering(self) -> bool:
        """This server's worker holds the lineage lease (another server's may, on a shared store)."""
        found = read_status(self._state)
        return found is not None and found[2]

    @property
    def pid(self) -> int | None:
        found = read_status(self._state)
        pid = found[1] if found else None
        if pid is None:
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return pid

    def backlog(self) -> int:
        return self._log.commit_seq() - (self._log.consumer_cursor(CURSOR) or 0)


class LineageWorker(SupervisedProcess, LineageObserver):
    """The server's handle on the worker process: start, restart when it dies, stop, status."""

    def __init__(
        self,
        commit_log: CommitLog,
        store: str,
        state: Path,
        warehouses: list[Warehouse],
        names: LineageNames,
        delivery: dict[str, str],
    ) -> None:
        LineageObserver.__init__(self, commit_log, state)
        worker_settings = {
            **delivery,
            "warehouses": [w.for_helper() for w in warehouses],
            "names": asdict(names),
        }
        SupervisedProcess.__init__(
            self,
            "lineage worker",
            [sys.executable, "-m", "isbre.lineage.worker", "--state", str(state)],
            helper_environment(store, **{DELIVERY_ENV: json.dumps(worker_settings)}),
        )

    def start(self) -> None:
        start_from_now(self._log)  # before any request: the worker takes a moment to start
        super().start()
