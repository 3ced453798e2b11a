"""A helper process the server keeps running: started, restarted when it dies, stopped."""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from isbre.catalog.backoff import Backoff
from isbre.catalog.store import Lease, Store, StoreUnavailableError

log = logging.getLogger(__name__)

# prctl(2)'s options: the signal this process gets when its parent ends; its name.
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


# How long a helper whose server has ended may take to end by itself before it is ended.
ORPHAN_GRACE_S = 30.0
# Its exit status then (EX_SOFTWARE).
ORPHANED_EXIT = 70


def die_with_parent(grace_s: float = ORPHAN_GRACE_S, server: int | None = None) -> None:
    """Have the kernel send this process SIGTERM when the process that started it ends (Linux),
    and end now if that has already happened: a helper or worker never outlives its server, even
    one killed with SIGKILL. `server`: the pid of the server this process works for, where its
    parent is not the server itself but a process that ends after it (a forkserver, which ends
    only once it has noticed): this process ends the moment the server does, or now if it has.
    A SIGTERM handler runs only when the main thread gets to it, which one stuck in a call that
    signals do not interrupt never does: so a thread also watches the parent, and ends the
    process `grace_s` seconds after the parent has gone."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent == 1 or os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
    if server is not None:
        _end_with(server)
    threading.Thread(
        target=_end_when_orphaned, args=(parent, grace_s), name="isbre-orphan-watch", daemon=True
    ).start()


def _end_with(server: int) -> None:
    """SIGTERM to this process the moment `server` ends, as the parent-death signal would be sent:
    a thread waits on the server's pidfd, which becomes readable when it exits."""
    try:
        handle = os.pidfd_open(server)
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGTERM)
        return
    except OSError as exc:  # a kernel before 5.3: the parent's end still ends this process
        log.warning("cannot watch the server (process %s): %s", server, exc)
        return
    threading.Thread(target=_end_when_ended, args=(handle,), name="isbre-server-watch", daemon=True).start()


def _end_when_ended(handle: int) -> None:
    select.select([handle], [], [])
    os.kill(os.getpid(), signal.SIGTERM)


def name_this_process(name: str) -> None:
    """The name `ps -o comm`, `top` and psutil's `name()` show for this process (Linux; 15 bytes
    at most), where its command line is another process's (one forked from a forkserver)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15])


def _end_when_orphaned(parent: int, grace_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    time.sleep(grace_s)
    log.error("the server (process %s) ended %g s ago and this process had not: ending it", parent, grace_s)
    logging.shutdown()
    os._exit(ORPHANED_EXIT)


def server_pid_argument() -> str:
    """The argument that tells a helper which server it works for: its parent may be gone before it
    asks for the parent-death signal, and then it would be the child of a subreaper (a service
    manager, a container's init) that it cannot tell from a server."""
    return f"--server-pid={os.getpid()}"


def add_server_pid(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server-pid", type=int, help="the server's process: end when it ends")


def start_helper(prog: str, argv: list[str] | None = None) -> Path:
    """The start of a helper's `main`: its arguments (the server's state directory, the server's
    process), an end with its server, a log, and the lowest scheduling priority, so that commits
    come first."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--state", type=Path, required=True, help="the server's state directory")
    add_server_pid(parser)
    args = parser.parse_args(argv)
    state: Path = args.state
    die_with_parent(server=args.server_pid)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.nice(19)
    return state


@dataclass
class HelperStatus:
    """What a helper that delivers somewhere reports of its failures."""

    failures: int = 0
    last_error: str | None = None
    last_failure_at: float | None = None
    recent_failures: list[str] = field(default_factory=list)

    def failed(self, error: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{type(error).__name__}: {error}"
        self.last_failure_at = time.time()
        self.recent_failures = [*self.recent_failures[-9:], self.last_error]


# How often a helper waiting for its store's lease asks for it.
LEASE_RETRY_S = 1.0


def take_lease(
    store: Store, name: str, keep_waiting: Callable[[], bool], waiting: Callable[[Exception | None], None]
) -> Lease | None:
    """Wait for the store's lease `name` (another server's helper may hold it); None when told to
    stop first. `waiting` hears of each wait, with the store's error when it could not be asked."""
    while keep_waiting():
        try:
            lease = store.try_lease(name)
        except StoreUnavailableError as exc:
            waiting(exc)
            lease = None
        else:
            if lease is None:
                waiting(None)
        if lease is not None:
            return lease
        time.sleep(LEASE_RETRY_S)
    return None


# A process that keeps dying is restarted ever more slowly; one that ran a minute counts as healthy.
RESTART_DELAY_S = 1.0
MAX_RESTART_DELAY_S = 60.0


def restart_delays() -> Backoff:
    return Backoff(RESTART_DELAY_S, MAX_RESTART_DELAY_S)


def terminate(process: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM, and SIGKILL if the process has not ended within `timeout` seconds."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class SupervisedProcess:
    """A helper in a process group of its own: a signal to the server's group (Ctrl-C in a terminal,
    `timeout`) reaches the server, which stops its helpers in order, instead of each helper at
    once; the kernel's parent-death signal still ends a helper whose server is killed."""

    def __init__(self, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        self._name = name
        self._command = command
        self._env = env
        self._process: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name=f"isbre-{name}-watch", daemon=True)

    def start(self) -> None:
        self._spawn()
        self._watcher.start()

    def _spawn(self) -> None:
        with self._lock:
            if not self._stopping.is_set():
                command = [*self._command, server_pid_argument()]
                self._process = subprocess.Popen(command, env=self._env, process_group=0)
                self._started_at = time.monotonic()

    def _watch(self) -> None:
        delays = restart_delays()
        while self._process is not None:
            code = self._process.wait()
            if self._stopping.is_set():
                return
            delay = delays.after_run(time.monotonic() - self._started_at)
            log.error("the %s exited (%s); restarting it in %g s (nothing is lost)", self._name, code, delay)
            if self._stopping.wait(delay):
                return
            self._spawn()
            log.info("%s restarted as process %s", self._name, self.pid)

    def stop(self, timeout: float = 30.0) -> None:
        with self._lock:
            self._stopping.set()
            process = self._process
        terminate(process, timeout)

    @property
    def pid(self) -> int | None:
        """The process id while it runs; None while it is being restarted."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None
