"""The one place isbre reaches into multiprocessing's forkserver (tests/test_upstream_seams.py
fails when what it uses changes).

A server forks its workers, and each process that runs maintenance forks its jobs, from a
forkserver: a process that has imported their code once, so that each of them starts in
milliseconds instead of importing PyArrow and PyIceberg again (a second of CPU on two cores).
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
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)


def leave_the_forkserver() -> None:
    """In a process forked from a forkserver: close this process's end of the pipe by which the
    forkserver knows that the process that started it lives. multiprocessing hands it to every
    process forked so, and while one holds it the forkserver outlives its starter killed with
    SIGKILL, and the forked processes with it; closed, the forkserver ends with its starter, and
    the processes it forked end with it, their parent (`die_with_parent`)."""
    server: Any = multiprocessing.forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None


def fork_the_forkserver(preload: Sequence[str]) -> bool:
    """Start this process's forkserver as a fork of it, where it runs no other thread yet (a fork
    keeps only the thread that forks, and a lock another thread held would stay held in the
    child): what this process has imported is not imported again. False where other threads run,
    leaving multiprocessing to start it as a new interpreter when it is first used. The child
    keeps only its standard streams and the forkserver's two descriptors (no lock or store of
    this process), imports `preload`, and runs multiprocessing's own forkserver loop, which ends
    with this process."""
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
            _run_the_forkserver(listener.fileno(), alive_r, list(preload))
        os.close(alive_r)
    server._preload_modules = list(preload)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    return True


def _run_the_forkserver(listener: int, alive_r: int, preload: list[str]) -> None:
    """In the forked child: multiprocessing's forkserver loop, then the end of the process (never
    the starter's code after the fork, nor its exit handlers)."""
    code = 1
    try:
        keep = sorted({0, 1, 2, listener, alive_r})
        for low, high in zip(keep, [*keep[1:], os.sysconf("SC_OPEN_MAX")], strict=True):
            os.closerange(low + 1, high)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        multiprocessing.forkserver.main(listener, alive_r, preload)  # type: ignore[attr-defined]
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:
        log.exception("the forkserver failed")
    finally:
        os._exit(code)
