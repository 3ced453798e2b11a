"""The one place isbre reaches into uvicorn's supervisor of several workers: `Multiprocess`, its
`keep_subprocess_alive`, its workers' `ping`, and the multiprocessing context it starts them in
(`uvicorn._subprocess.spawn`); tests/test_upstream_seams.py fails when they change.

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
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.util
import os
import signal
import socket
import threading
import time
from typing import Any

import uvicorn._subprocess
from uvicorn.config import Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process

log = logging.getLogger(__name__)

# How often the log names a worker that is still starting.
STARTING_NOTICE_SECONDS = 30.0


# What the worker processes' server imports before it forks any: the application.
PRELOADED = ["isbre.rest.workers", "isbre.rest.app"]


def leave_the_forkserver() -> None:
    """In a worker: close this process's end of the pipe by which the forkserver knows that the
    supervisor lives. multiprocessing hands it to every process forked so, and while a worker holds
    it a forkserver outlives a supervisor killed with SIGKILL, and its workers with it; closed, the
    forkserver ends with the supervisor, and the workers end with the forkserver, their parent."""
    server: Any = multiprocessing.forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None


def fork_the_forkserver() -> bool:
    """Start multiprocessing's forkserver for the workers as a fork of this process, where this
    process runs no other thread yet (a fork keeps only the thread that forks, and a lock another
    thread held would stay held in the child); False, leaving multiprocessing to start it as a new
    interpreter when a worker is first started, where it does. The child keeps only its standard
    streams and the forkserver's two descriptors (not the state directory's lock), and runs
    multiprocessing's own forkserver loop, which ends with this process as before."""
    if threading.active_count() > 1:
        return False
    server: Any = multiprocessing.forkserver._forkserver
    address = multiprocessing.connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        if not multiprocessing.util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _run_the_forkserver(listener.fileno(), alive_r)
        os.close(alive_r)
    server._preload_modules = PRELOADED
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    return True


def _run_the_forkserver(listener: int, alive_r: int) -> None:
    """In the forked child: multiprocessing's forkserver loop, then the end of the process (never
    the supervisor's code after the fork, nor its exit handlers)."""
    code = 1
    try:
        keep = sorted({0, 1, 2, listener, alive_r})
        for low, high in zip(keep, [*keep[1:], os.sysconf("SC_OPEN_MAX")], strict=True):
            os.closerange(low + 1, high)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        multiprocessing.forkserver.main(listener, alive_r, PRELOADED)  # type: ignore[attr-defined]
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:
        log.exception("the workers' forkserver failed")
    finally:
        os._exit(code)


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
