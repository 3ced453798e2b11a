"""`isbre` commands started by forking a process that has imported isbre already, for tests.

A test run starts about a hundred `isbre serve` processes; each new interpreter spent a second and
a half of CPU importing PyIceberg, PyArrow and FastAPI before it served anything, most of the
suite's cost besides the tests' own work. So the first command a test process starts also starts
this zygote: `python -m tests.zygote`, which imports what `isbre serve` imports and then waits on a
socket shared with the test process. Asked to run a command, it forks: the child takes the
command's environment, working directory, output and session, and runs `isbre.rest.cli` as
`python -m isbre.rest.cli` would (as `__main__`, with its arguments), then ends as that interpreter
would have ended. The command is a real process of its own (its pid, its session, its signals);
only its imports are inherited. The zygote reports each child's end (its exit status, as
`Popen.returncode` gives it) to the test process, and ends when the test process has gone.

A command that needs a new interpreter (a `PYTHON*` setting, another Python) is started as usual:
`needs_new_interpreter` says which.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

# What `isbre serve` imports by the time it serves: loaded once, here.
PRELOADED = ("isbre.rest.cli", "isbre.rest.serve", "isbre.rest.app", "isbre.rest.workers")
_MAX_MESSAGE = 1 << 20


def needs_new_interpreter(env: Mapping[str, str]) -> bool:
    """Settings read when an interpreter starts (PYTHONPATH, PYTHONSAFEPATH, ...) or when a library
    is loaded: a forked command would not see them."""
    return any(key.startswith(("PYTHON", "LD_", "PYICEBERG_")) for key in env)


# The zygote's side.


def _serve(control: socket.socket) -> None:
    """Fork a child for each request on `control` and report each child's end; return only in a
    child, set up to run its request. Exits when the test process closes `control`."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wake-up fd is written
    events = selectors.DefaultSelector()
    events.register(control, selectors.EVENT_READ)
    events.register(wake_read, selectors.EVENT_READ)
    while True:
        for key, _ in events.select():
            if key.fileobj is control:
                request, fds = _receive(control)
                if request is None:
                    sys.exit(0)  # the test process has gone
                pid = os.fork()
                if pid == 0:
                    events.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (wake_read, wake_write):
                        os.close(fd)
                    control.close()
                    _take_over(request, fds)
                    return
                for fd in fds:
                    os.close(fd)
                _send(control, {"id": request["id"], "pid": pid})
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 4096)
                _reap(control)


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(control, {"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})


def _take_over(request: dict[str, Any], fds: list[int]) -> None:
    """In the child: become the process `subprocess.Popen` would have started."""
    if request["new_session"]:
        os.setsid()
    for target, fd in zip((0, 1, 2), fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = [sys.argv[0], *request["args"]]


def _receive(control: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    fds = array.array("i")
    message, ancillary, _, _ = control.recvmsg(_MAX_MESSAGE, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return (json.loads(message) if message else None), list(fds)


def _send(control: socket.socket, message: dict[str, Any]) -> None:
    control.sendall(json.dumps(message).encode() + b"\n")


def main() -> None:
    for name in PRELOADED:
        __import__(name)
    control = socket.socket(fileno=int(sys.argv[1]))  # SOCK_SEQPACKET, from the test process
    _serve(control)
    # The child: run the command as `python -m isbre.rest.cli` runs it; its SystemExit, or an
    # exception it raises, ends this interpreter as it would have ended that one.
    runpy.run_module("isbre.rest.cli", run_name="__main__", alter_sys=True)


# The test process's side.


class ForkedProcess:
    """A command the zygote forked, as the tests use a `subprocess.Popen`."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, returncode: int) -> None:
        self.returncode = returncode
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The test process's zygote: started on first use, ended with the test process."""

    _running: Zygote | None = None
    _starting = threading.Lock()

    def __init__(self) -> None:
        # One request per packet: a request and its descriptors arrive whole, never split or joined.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C reaches the tests, not the parent of their servers
        )
        theirs.close()
        self._control = ours
        self._sending = threading.Lock()
        self._ids = iter(range(1, sys.maxsize))
        self._started: dict[int, tuple[threading.Event, list[int]]] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}  # ends reported before the test process heard of the start
        self._lock = threading.Lock()
        threading.Thread(target=self._listen, name="zygote", daemon=True).start()

    @classmethod
    def shared(cls) -> Zygote:
        with cls._starting:
            if cls._running is None or cls._running.gone():
                cls._running = cls()
            return cls._running

    def gone(self) -> bool:
        return self._process.poll() is not None

    def run(
        self,
        args: list[str],
        env: Mapping[str, str],
        stdin: int,
        stdout: int,
        stderr: int,
        cwd: str | None = None,
        new_session: bool = False,
    ) -> ForkedProcess:
        """Start `python -m isbre.rest.cli ARGS` forked, its standard streams on the given descriptors."""
        request_id = next(self._ids)
        started = threading.Event()
        answer: list[int] = []
        with self._lock:
            self._started[request_id] = (started, answer)
        request = {"id": request_id, "args": args, "env": dict(env), "cwd": cwd or os.getcwd()}
        request["new_session"] = new_session
        with self._sending:
            self._control.sendmsg(
                [json.dumps(request).encode()],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [stdin, stdout, stderr]))],
            )
        while not started.wait(1.0):
            if self.gone():
                raise RuntimeError(
                    f"the test zygote ended ({self._process.returncode}) before it started {args}"
                )
        child = ForkedProcess(answer[0], ["isbre", *args])
        with self._lock:
            self._children[child.pid] = child
            if (early := self._early.pop(child.pid, None)) is not None:
                child._end(early)
        return child

    def _listen(self) -> None:
        for line in self._control.makefile("rb"):
            message = json.loads(line)
            with self._lock:
                if "id" in message:
                    started, answer = self._started.pop(message["id"])
                    answer.append(message["pid"])
                    started.set()
                elif (child := self._children.pop(message["pid"], None)) is not None:
                    child._end(message["returncode"])
                else:
                    self._early[message["pid"]] = message["returncode"]
        with self._lock:
            for child in self._children.values():
                child._end(-signal.SIGKILL)
            self._children.clear()


if __name__ == "__main__":
    main()
