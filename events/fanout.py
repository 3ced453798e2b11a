"""The server's side of the event fan-out process: starting it, waking it, handing it connections.

Writing every commit to a hundred sockets costs more CPU than the commits
themselves, and in the server's process that work holds the interpreter lock
the commit handlers need. So the server answers a stream request itself (its
authentication, filters and cursor checks, so every error is the usual one),
then passes the open connection to a process of its own
(`events.fanout_process`), which writes the stream from the shared LMDB log.
The writer wakes that process through a pipe after each commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from isbre.catalog.commit_log import CommitLog
from isbre.catalog.processes import SupervisedProcess, restart_delays, server_pid_argument, terminate
from isbre.catalog.records import CommitRecord
from isbre.catalog.stores import helper_environment
from isbre.events.filters import EventFilter

log = logging.getLogger(__name__)

# The ASGI scope extension under which the HTTP server offers a request's connection.
DETACHABLE = "isbre.detachable"
# How soon a worker tries again to reach the shared fan-out process.
RECONNECT_S = 0.2


def until_expiry(expires_at: float | None) -> float | None:
    """Seconds until a stream's token expires (at least 0); None when it never does."""
    return None if expires_at is None else max(0.0, expires_at - time.time())


class Detachable(Protocol):
    """A request's connection that the HTTP server lets go of."""

    def duplicate(self) -> int | None:
        """A duplicate of the connection's socket descriptor; None when it cannot be taken over."""

    def release(self) -> None:
        """Forget the connection without closing it: its duplicate carries on."""


@dataclass(frozen=True)
class StreamRequest:
    """What the fan-out process needs to serve one stream: validated by the server already."""

    cursor: int
    namespace: str | None = None
    tables: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    scopes: list[list[str]] = field(default_factory=list)
    expires_at: float | None = None  # when the caller's token ends (epoch seconds): the stream ends then
    warehouses: list[str | None] = field(default_factory=list)

    def event_filter(self) -> EventFilter:
        scopes = tuple(tuple(scope) for scope in self.scopes)
        return EventFilter.parse(self.namespace, self.tables, self.kinds, scopes, self.warehouses)

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, message: bytes) -> StreamRequest:
        return cls(**json.loads(message))


@dataclass(frozen=True)
class FanoutOptions:
    retry_ms: int
    keepalive_seconds: float
    ring_size: int
    ring_bytes: int

    def arguments(self) -> list[str]:
        return [
            f"--retry-ms={self.retry_ms}",
            f"--keepalive-seconds={self.keepalive_seconds}",
            f"--ring-size={self.ring_size}",
            f"--ring-bytes={self.ring_bytes}",
        ]


class _Handover:
    """What a server's handle on a fan-out process does with its channel: hand connections over,
    and read the process's reports of how many of them are open."""

    _channel: socket.socket | None
    streams: int

    def hand_over(self, fd: int, request: StreamRequest) -> bool:
        """Pass connection `fd` with its request; closes `fd`. False when the process cannot take it."""
        try:
            if self._channel is None:
                return False
            socket.send_fds(self._channel, [request.encode()], [fd])
            return True
        except OSError as exc:
            log.warning("could not hand a stream to the fan-out process (%s); serving it here", exc)
            return False
        finally:
            os.close(fd)

    def _read_report(self) -> bool | None:
        """True: a new stream count; False: the process has gone (or closed the channel); None:
        nothing to read yet."""
        assert self._channel is not None
        try:
            message = self._channel.recv(64)
        except BlockingIOError:
            return None
        except OSError:
            message = b""
        if message:
            self.streams = int(message)
            return True
        return False


class FanoutProcess(_Handover):
    """Runs `python -m events.fanout_process` once the first stream is opened (a server nobody
    streams from runs no such process), and restarts it if it dies; its streams then reconnect
    (clients resume from Last-Event-ID) and are served in the server's process until it is back."""

    def __init__(self, commit_log: CommitLog, store: str, options: FanoutOptions) -> None:
        self._log = commit_log
        self._store = store
        self._options = options
        self._process: subprocess.Popen[bytes] | None = None
        self._channel: socket.socket | None = None
        self._wake_fd: int | None = None
        self._wake_lock = threading.Lock()  # the writer thread must never write to a closed descriptor
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._started_at = 0.0
        # A process that keeps dying (it cannot start, say) is restarted ever more slowly.
        self._restart_delays = restart_delays()
        self.streams = 0

    def start(self) -> None:
        """Ready to run the process, on the server's event loop; `take` runs it."""
        self._loop = asyncio.get_running_loop()

    @property
    def idle(self) -> bool:
        """No stream has been opened yet, so no process runs."""
        return self._process is None

    def take(self) -> bool:
        """Whether the process takes a stream now: run it if no stream came before."""
        if self.idle and not self._stopping:
            try:
                self._launch()
            except OSError as exc:  # e.g. a platform without SOCK_SEQPACKET Unix sockets
                log.warning(
                    "event streams are served in this process: the fan-out process cannot start (%s)", exc
                )
                self._stopping = True  # and it is not tried again
        return self.alive

    def _launch(self) -> None:
        assert self._loop is not None, "started on the server's event loop first"
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-m", "isbre.events.fanout_process", f"--wake-fd={wake_read}"]
        command += [f"--channel-fd={theirs.fileno()}", *self._options.arguments(), server_pid_argument()]
        try:
            self._process = subprocess.Popen(
                command,
                pass_fds=(wake_read, theirs.fileno()),
                env=helper_environment(self._store),
                process_group=0,  # as a SupervisedProcess: stopped by the server, not by its group's signal
            )
        except OSError:
            os.close(wake_write)
            ours.close()
            raise
        finally:
            os.close(wake_read)
            theirs.close()
        ours.setblocking(False)
        with self._wake_lock:
            self._channel, self._wake_fd = ours, wake_write
        self._loop.add_reader(ours, self._on_message)
        self._log.writer.add_listener(self._wake)
        self._started_at = time.monotonic()
        log.info("event streams are served by process %d", self._process.pid)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.alive and self._process else None

    @property
    def alive(self) -> bool:
        return self._channel is not None and self._process is not None and self._process.poll() is None

    def _wake(self, records: list[CommitRecord]) -> None:
        """On the writer thread, after its commits."""
        self.wake()

    def wake(self) -> None:
        """A byte in the pipe; a full pipe already means "look at the log"."""
        with self._wake_lock:
            if self._wake_fd is None:
                return
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                os.write(self._wake_fd, b"\0")

    def _on_message(self) -> None:
        if self._read_report() is not False:
            return
        self._close_channel()
        if not self._stopping:
            code = self._process.wait() if self._process else None
            delay = self._restart_delays.after_run(time.monotonic() - self._started_at)
            log.error(
                "the event fan-out process exited (%s); streams are served here until it restarts in %g s",
                code,
                delay,
            )
            assert self._loop is not None
            self._loop.call_later(delay, self._restart)

    def _restart(self) -> None:
        if not self._stopping:
            self._launch()

    def _close_channel(self) -> None:
        """Once per start: the process may have gone (and this run) before `stop` runs it again."""
        with self._wake_lock:
            channel, wake_fd = self._channel, self._wake_fd
            self._channel, self._wake_fd = None, None
        if channel is None:
            return
        self._log.writer.remove_listener(self._wake)
        if self._loop is not None:
            self._loop.remove_reader(channel)
        channel.close()
        if wake_fd is not None:
            os.close(wake_fd)
        self.streams = 0

    def stop(self, timeout: float = 10.0) -> None:
        """Ends the process's streams cleanly (each with a complete response), then the process."""
        self._stopping = True
        terminate(self._process, timeout)
        self._close_channel()


def shared_socket(state: Path) -> Path | None:
    """Where the shared fan-out process of a server with several workers listens: in the server's
    state directory, if the path fits a Unix socket address (else streams are served by each worker)."""
    path = state / "isbre-events.sock"
    return path if len(os.fsencode(path)) < 104 else None


class SharedFanout(SupervisedProcess):
    """The supervisor's handle on the one fan-out process of a server with several workers."""

    def __init__(self, store: str, path: Path, options: FanoutOptions) -> None:
        command = [sys.executable, "-m", "isbre.events.fanout_process", f"--listen={path}"]
        super().__init__("event fan-out process", command + options.arguments(), helper_environment(store))


class FanoutChannel(_Handover):
    """A worker's channel to the shared fan-out process: it hands connections over and hears how
    many of its streams are open. While the process is (re)starting, streams are served here."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._channel: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.pid: int | None = None
        self.streams = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._connect()

    @property
    def alive(self) -> bool:
        return self._channel is not None

    idle = False  # the supervisor runs the shared process from the start

    def take(self) -> bool:
        return self.alive

    def _connect(self) -> None:
        if self._stopping:
            return
        channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            channel.connect(str(self._path))
        except OSError:
            channel.close()
            assert self._loop is not None
            self._loop.call_later(RECONNECT_S, self._connect)  # not listening yet, or restarting
            return
        credentials = channel.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        self.pid = struct.unpack("3i", credentials)[0]
        channel.setblocking(False)
        self._channel = channel
        assert self._loop is not None
        self._loop.add_reader(channel, self._on_message)

    def _on_message(self) -> None:
        if self._read_report() is not False:
            return
        assert self._loop is not None
        self._close()
        log.warning("the event fan-out process has gone; streams are served here until it is back")
        self._loop.call_later(RECONNECT_S, self._connect)

    def _close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            if self._loop is not None:
                self._loop.remove_reader(channel)
            channel.close()
        self.pid, self.streams = None, 0

    def stop(self) -> None:
        self._stopping = True
        self._close()
