"""The one place isbre reaches into uvicorn's supervisor of several workers: `Multiprocess`, its
`keep_subprocess_alive`, its workers' `ping`, and the multiprocessing context it starts them in
(`uvicorn._subprocess.spawn`); tests/test_upstream_seams.py fails when they change. The forkserver
itself is catalog/forkserver.py's.

Workers are forked from a server process that has imported the application once (multiprocessing's
`forkserver`, clean of the supervisor's threads and open store), instead of each starting a new
interpreter that imports it all again: on two cores a worker spawned that way took two seconds of
CPU before it could answer, sixteen of them half a minute. That forkserver is itself a fork of the
supervisor taken before the supervisor starts any thread or opens its store, not a new interpreter:
what the supervisor has imported already (all of it, where the supervisor was itself forked from a
process that had) is not imported again, 1.3 s of CPU per server start on two cores.

uvicorn pings each worker every half second and takes one that does not answer within
`timeout_worker_healthcheck` seconds for hung: it kills it and starts another. On a machine busy
with other work a worker may take longer than that to start, and was killed while it started, and
started again, forever. Here a worker is checked as uvicorn checks it only once it has answered a
first time; until then it is waited for while its process lives, and the log says so when it
takes long.
"""

from __future__ import annotations

import logging
import multiprocessing
import socket
import time

import uvicorn._subprocess
from isbre.catalog.forkserver import fork_the_forkserver
from uvicorn.config import Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process

log = logging.getLogger(__name__)

# How often the log names a worker that is still starting.
STARTING_NOTICE_SECONDS = 30.0


# What the worker processes' server imports before it forks any: the application.
PRELOADED = ["isbre.rest.workers", "isbre.rest.app"]


def fork_the_workers_forkserver() -> bool:
    """The workers' forkserver as a fork of this process, which has not started a thread yet."""
    return fork_the_forkserver(PRELOADED)


class PatientSupervisor(Multiprocess):
    """uvicorn's supervisor, its workers forked from a server that has imported the application,
    and patient with workers that have not answered yet."""

    def __init__(self, config: Config, sockets: list[socket.socket]) -> None:
        forked = multiprocessing.get_context("forkserver")
        forked.set_forkserver_preload(PRELOADED)
        uvicorn._subprocess.spawn = forked  # type: ignore[assignment]
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
