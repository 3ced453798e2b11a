"""A real `isbre serve` process on loopback, for tests and benchmarks."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar, TypeVar

import httpx
import psutil
from isbre.catalog.job_process import JOB_PROCESS_NAME
from isbre.rest.serve import single_process_server
from isbre.rest.settings import Settings, load_settings

from tests import reaper, zygote
from tests.http_client import http
from tests.zygote import ForkedProcess

T = TypeVar("T")
_LOGGERS = ("isbre", "uvicorn.error")  # what an in-process server's log holds

# The smallest table schema: one required long column.
ID_SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# A commit is answered once it is durable: on a loaded two-core machine whose disk other test
# processes write to, a create waited 2.8 and 3.1 s for its sync (the server's slow-request log),
# past httpx's default of 5 s once. Tests that commit wait this long.
COMMIT_TIMEOUT = 30.0


# How long a starting server may do nothing at all (no CPU time spent by its processes, no line
# logged) before it is taken for stuck; and, busy or not, how long it may take in all (a server
# that starts its workers again and again is busy, and never ready).
STALL_SECONDS = 60.0
GIVE_UP_SECONDS = 600.0


def _cpu_seconds(pid: int) -> float:
    """The CPU time of the process `pid` and of every process under it (a server's workers)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


class IsbreServer:
    started: ClassVar[list[IsbreServer]] = []  # every server a test started, so that none outlives its test

    def __init__(
        self,
        warehouse: Path | str,
        port: int | None = None,
        env: dict[str, str] | None = None,
        store: Path | str | None = None,
        workers: int = 1,
        home: Path | None = None,
    ) -> None:
        """`warehouse`: a directory, or an s3:// root (then `store` is needed: the LMDB directory, or a
        database URL). `home`: where the server's log and state go (default: beside the store, or
        beside a local warehouse)."""
        self.warehouse = warehouse
        self.store = store
        self.workers = workers
        self.port = port or free_port()
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | ForkedProcess | None = None
        if home is None:
            home = store.parent if isinstance(store, Path) else Path(warehouse).parent
        self.log_path = home / f"isbre-{self.port}.log"
        if isinstance(store, str):  # a database: in the environment (a URL may hold a password)
            self.env = {"ISBRE_STORE": store, "ISBRE_STATE_DIR": str(home / f"state-{self.port}"), **self.env}
        self.ready_path = "/ready"  # with workers: when every one of them answers

    @property
    def store_location(self) -> str:
        """The store as `catalog.stores.open_store` takes it."""
        return str(self.store or Path(self.warehouse) / "isbre.lmdb")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The process that serves."""
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self) -> IsbreServer:
        args = ["serve", "--port", str(self.port), "--warehouse", str(self.warehouse)]
        args += ["--workers", str(self.workers)]
        if isinstance(self.store, Path):
            args += ["--store", str(self.store)]
        # Only what a test asks for: a developer's own OpenLineage or isbre settings stay out.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(("OPENLINEAGE", "ISBRE_"))}
        env = {**inherited, **self.env}
        with self.log_path.open("ab") as log:
            # A session of its own, as a terminal gives a server: tests signal its group.
            self.process = zygote.popen(
                [sys.executable, "-m", "isbre.rest.cli", *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        IsbreServer.started.append(self)
        reaper.watch_process(self.process.pid)
        process = self.process
        return self._ready(
            lambda: None if process.poll() is None else f"exited with {process.returncode}",
            lambda: (_cpu_seconds(process.pid), self._logged()),
        )

    def _ready(self, ended: Callable[[], str | None], progress: Callable[[], object]) -> IsbreServer:
        """Wait until the server answers `ready_path`, for as long as it is starting: `ended()`
        says how it ended, if it has; `progress()` changes while it works (CPU time spent, lines
        logged). On a machine busy with other work a start takes what it takes; one that does
        nothing for STALL_SECONDS is stuck."""
        last, moved = progress(), time.monotonic()
        looked = moved
        give_up = moved + GIVE_UP_SECONDS
        while time.monotonic() < give_up:
            if (how := ended()) is not None:
                raise RuntimeError(f"isbre {how}:\n{self.log()}")
            try:
                if http.get(f"{self.url}{self.ready_path}", timeout=5).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            # Progress once a second: reading every process's CPU time 20 times a second, in each
            # of a hundred starts, cost the suite seconds of CPU for a limit of a minute.
            if time.monotonic() - looked >= 1.0:
                looked = time.monotonic()
                if (now := progress()) != last:
                    last, moved = now, looked
                elif looked - moved > STALL_SECONDS:
                    self.kill()
                    raise TimeoutError(
                        f"isbre did nothing for {STALL_SECONDS} s while starting:\n{self.log()}"
                    )
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"isbre was still not ready after {GIVE_UP_SECONDS} s:\n{self.log()}")

    def _logged(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def high_water(self, token: str | None = None) -> int:
        """The highest commit_seq in the server's commit log."""
        headers = {"Authorization": f"Bearer {token}"} if token else None
        return http.get(f"{self.url}/v1/events/cursor", headers=headers).json()["commit_seq"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class InProcessServer(IsbreServer):
    """The same server on a thread of the test process: uvicorn on loopback, as `isbre serve` runs
    it with one worker, without a process to start (each start imports the whole stack again).

    For tests that need no process of their own: one worker, settings only from `ISBRE_*`
    variables, nothing that signals, kills or limits the server's process (`process` is None; `kill`
    stops it at once, which is no crash), and no LMDB environment of its store opened by the test
    while it runs (LMDB allows one per process). The log holds what every in-process server logged
    while this one ran.
    """

    _environment: ClassVar[threading.Lock] = threading.Lock()  # settings are read from os.environ

    def start(self) -> IsbreServer:
        outside = sorted(key for key in self.env if not key.startswith("ISBRE_"))
        if self.workers != 1 or outside:
            raise ValueError(f"an in-process server has one worker and ISBRE_* settings only, not {outside}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = logging.FileHandler(self.log_path)
        self._log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for name in _LOGGERS:
            logging.getLogger(name).addHandler(self._log)
        settings = self._settings()
        logging.getLogger("isbre").setLevel(settings.log_level.upper())  # as `isbre serve` logs
        self._server = single_process_server(settings, log_config=None)
        self._thread = threading.Thread(target=self._server.run, name=f"isbre-{self.port}", daemon=True)
        IsbreServer.started.append(self)
        self._thread.start()
        # The server's own thread's progress is not told apart from the test's: what it logs is.
        return self._ready(lambda: None if self._thread.is_alive() else "stopped", self._logged)

    @property
    def pid(self) -> int:
        return os.getpid()

    def _settings(self) -> Settings:
        flags = {"host": "127.0.0.1", "port": self.port, "warehouse": str(self.warehouse), "workers": 1}
        if isinstance(self.store, Path):
            flags["store"] = str(self.store)
        with self._environment:
            os.environ.update(self.env)
            try:
                return load_settings(None, **flags)
            finally:
                for key in self.env:
                    del os.environ[key]

    def stop(self) -> None:
        self._end(force=False)

    def kill(self) -> None:
        self._end(force=True)

    def _end(self, force: bool) -> None:
        """As SIGTERM ends `isbre serve` (`force`: without waiting for open connections); either way
        the application shuts down, so its store is closed before the next server opens it."""
        if not hasattr(self, "_thread"):
            return
        self._server.force_exit = force
        self._server.should_exit = True
        self._thread.join(timeout=15)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join()
        for name in _LOGGERS:
            logging.getLogger(name).removeHandler(self._log)
        self._log.close()


def job_process(of: psutil.Process) -> psutil.Process | None:
    """A maintenance job's process running under `of` (forked from its jobs' forkserver), if any."""
    for process in of.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.name() == JOB_PROCESS_NAME:
                return process
    return None


def secured_server(
    warehouse: Path, principals: list[dict[str, object]], workers: int = 1, process: bool = False, **env: str
) -> IsbreServer:
    """A server with authentication on for `principals`, started: in the test process when it has one
    worker, unless the test needs a `process` of its own."""
    settings = {
        "ISBRE_AUTH__ENABLED": "true",
        "ISBRE_AUTH__TOKEN_SECRET": "test-signing-key",
        "ISBRE_AUTH__PRINCIPALS": json.dumps(principals),
    }
    kind = IsbreServer if process or workers > 1 else InProcessServer
    return kind(warehouse, env=settings | env, workers=workers).start()


def sse_records(
    server: IsbreServer, until: int, headers: dict[str, str] | None = None, **params: object
) -> list[dict]:
    """Raw SSE: read records until one with commit_seq >= until arrives."""
    records = []
    with http.stream(
        "GET", f"{server.url}/v1/events", params=params, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                records.append(json.loads(line[6:]))
                if records[-1]["commit_seq"] >= until:
                    break
    return records


def start_threads(work: Callable[[T], None], items: Iterable[T]) -> list[threading.Thread]:
    """Run `work(item)` for every item, each on its own thread, started now."""
    threads = [threading.Thread(target=work, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    return threads


def on_threads(work: Callable[[T], None], items: Iterable[T]) -> None:
    """Run `work(item)` for every item, each on its own thread, and wait for them all."""
    for thread in start_threads(work, items):
        thread.join()
