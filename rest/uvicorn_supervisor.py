"""The one place isbre reaches into uvicorn's supervisor of several workers: `Multiprocess`, its
`keep_subprocess_alive` and its workers' `ping` (tests/test_upstream_seams.py fails when they
change).

uvicorn pings each worker every half second and takes one that does not answer within
`timeout_worker_healthcheck` seconds for hung: it kills it and starts another. A worker answers
once its process has imported uvicorn and unpickled its configuration; on a machine busy with
other work, or with many workers starting on few cores, that takes longer than the check waits,
so every worker was killed while it started, and started again, forever. Here a worker is checked
as uvicorn checks it only once it has answered a first time; until then it is waited for while
its process lives, and the log says so when it takes long.
"""

from __future__ import annotations

import logging
import time
from socket import socket

from uvicorn.config import Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process

log = logging.getLogger(__name__)

# How often the log names a worker that is still starting.
STARTING_NOTICE_SECONDS = 30.0


class PatientSupervisor(Multiprocess):
    """uvicorn's supervisor, patient with workers that have not answered yet."""

    def __init__(self, config: Config, sockets: list[socket]) -> None:
        super().__init__(config, sockets)
        self._answered: set[Process] = set()
        self._since: dict[Process, float] = {}  # a worker not yet answered: when it was first asked
        self._noticed: dict[Process, float] = {}  # and when the log last named it

    def keep_subprocess_alive(self) -> None:
        starting = [process for process in self.processes if self._starting(process)]
        self.processes = [process for process in self.processes if process not in starting]
        try:
            super().keep_subprocess_alive()  # the ones that answered once, as uvicorn checks them
        finally:
            self.processes += starting
        self._answered &= set(self.processes)  # forget the workers uvicorn replaced

    def _starting(self, process: Process) -> bool:
        """Whether `process` is alive and has never answered a ping (asked once more now)."""
        if process in self._answered or not process.process.is_alive():
            return False  # dead: uvicorn starts another
        now = time.monotonic()
        if process.ping(timeout=0.05):
            self._answered.add(process)
            self._since.pop(process, None)
            self._noticed.pop(process, None)
            return False
        first = self._since.setdefault(process, now)
        if now - self._noticed.get(process, first) >= STARTING_NOTICE_SECONDS:
            self._noticed[process] = now
            log.warning("worker [%s] is still starting after %.0f s", process.pid, now - first)
        return True
