"""Python commands of the tests started by forking a process that has imported isbre already.

A test run starts about a hundred `isbre serve` processes; each new interpreter spent a second and
a half of CPU importing PyIceberg, PyArrow and FastAPI before it served anything, most of the
suite's cost besides the tests' own work. So the first command a test process starts also starts
this zygote: `python -m tests.zygote`, which imports what `isbre serve` imports and then waits on a
socket shared with the test process. Asked to run a command, it forks: the child takes the
command's environment, working directory, standard streams and session, and runs the module or
the code as `python -m MODULE ARGS` or `python -c CODE ARGS` would (as `__main__`, with its
arguments), then ends as that interpreter would have ended. The command is a real process of its
own (its pid, its session, its signals); only its imports are inherited. The zygote reports each
child's end (its exit status, as `Popen.returncode` gives it) to the test process, and ends when
the test process has gone.

Tests start their commands with `popen` and `run`, which take what `subprocess.Popen` and
`subprocess.run` take. A command that needs a new interpreter (a `PYTHON*` setting, another
Python, an option of the interpreter) is started by `subprocess` as before:
`needs_new_interpreter` says which settings.
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
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

# What `isbre serve` imports by the time it serves: loaded once, here.
PRELOADED = ("isbre.rest.cli", "isbre.rest.serve", "isbre.rest.app", "isbre.rest.workers")
_MAX_MESSAGE = 1 << 20


def needs_new_interpreter(env: Iterable[str]) -> bool:
    """Settings read when an interpreter starts (PYTHONPATH, PYTHONSAFEPATH, ...) or when a library
    is loaded: a forked command would not see them."""
    return any(key.startswith(("PYTHON", "LD_", "PYICEBERG_")) for key in env)


# The zygote's side.


def _serve(control: socket.socket) -> dict[str, Any]:
    """Fork a child for each request on `control` and report each child's end; return only in a
    child, set up to run the request it returns. Exits when the test process closes `control`."""
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
                    return request
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
    request = _serve(control)
    # The child: run the command as `python -m` or `python -c` runs it; its SystemExit, or an
    # exception it raises, ends this interpreter as it would have ended that one.
    if request["option"] == "-m":
        sys.argv = [sys.argv[0], *request["args"]]  # run_module puts the module's path first
        sys.path[0] = os.getcwd()
        # Run afresh as `__main__`, as `python -m` runs it, though the zygote imported it by name.
        sys.modules.pop(request["target"], None)
        runpy.run_module(request["target"], run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *request["args"]]
        sys.path[0] = ""
        exec(compile(request["target"], "<string>", "exec"), {"__name__": "__main__"})


# The test process's side.


class ForkedProcess:
    """A command the zygote forked, as the tests use a `subprocess.Popen`."""

    def __init__(self, pid: int, args: list[str], streams: list[IO[Any] | None]) -> None:
        self.args = args
        self.pid = pid
        self.stdin, self.stdout, self.stderr = streams
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

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """As `Popen.communicate`: `input` written and stdin closed, both outputs read to their end."""
        read: dict[int, Any] = {}

        def drain(index: int, stream: IO[Any]) -> None:
            with stream:
                read[index] = stream.read()

        readers = [
            threading.Thread(target=drain, args=(i, stream), daemon=True)
            for i, stream in enumerate((self.stdout, self.stderr))
            if stream is not None
        ]
        for reader in readers:
            reader.start()
        if self.stdin is not None:
            with self.stdin, contextlib.suppress(BrokenPipeError):
                if input is not None:
                    self.stdin.write(input)
        self.wait(timeout)
        for reader in readers:
            reader.join(timeout)
        return read.get(0), read.get(1)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def popen(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    text: bool = False,
    start_new_session: bool = False,
) -> ForkedProcess | subprocess.Popen[Any]:
    """`subprocess.Popen(args, ...)`, forked from the zygote where `args` is `python -m MODULE ...`
    or `python -c CODE ...` of this interpreter and no setting read at its start changes."""
    options = {"env": env, "cwd": cwd, "start_new_session": start_new_session}
    streams = {"stdin": stdin, "stdout": stdout, "stderr": stderr, "text": text}
    env = os.environ if env is None else env
    changed = {key for key, _ in set(env.items()) ^ set(os.environ.items())}
    if (
        len(args) < 3
        or args[0] != sys.executable
        or args[1] not in ("-m", "-c")
        or needs_new_interpreter(changed)
    ):
        return subprocess.Popen(args, **options, **streams)  # type: ignore[call-overload, no-any-return]
    ours: list[IO[Any] | None] = []
    theirs: list[int] = []
    closing: list[int] = []
    for fd, given in enumerate((stdin, stdout, stderr)):
        if given == subprocess.STDOUT and fd == 2:
            theirs.append(theirs[1])
            ours.append(None)
        elif given == subprocess.PIPE:
            read, write = os.pipe()
            mine, child = (write, read) if fd == 0 else (read, write)
            ours.append(open(mine, ("w" if fd == 0 else "r") + ("" if text else "b")))  # noqa: SIM115
            theirs.append(child)
            closing.append(child)
        elif given == subprocess.DEVNULL:
            theirs.append(os.open(os.devnull, os.O_RDWR))
            closing.append(theirs[-1])
            ours.append(None)
        else:
            theirs.append(fd if given is None else given if isinstance(given, int) else given.fileno())
            ours.append(None)
    try:
        return Zygote.shared().start(
            [str(a) for a in args], dict(env), theirs, ours, str(cwd or os.getcwd()), start_new_session
        )
    finally:
        for fd in closing:
            os.close(fd)


def run(
    args: Sequence[str],
    *,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **options: Any,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run(args, ...)`, forked from the zygote where `popen` would fork it."""
    if capture_output:
        options.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if input is not None:
        options["stdin"] = subprocess.PIPE
    process = popen(args, **options)
    try:
        out, err = process.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    assert process.returncode is not None
    done = subprocess.CompletedProcess(list(args), process.returncode, out, err)
    if check:
        done.check_returncode()
    return done


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

    def start(
        self,
        args: list[str],
        env: dict[str, str],
        fds: list[int],
        streams: list[IO[Any] | None],
        cwd: str,
        new_session: bool,
    ) -> ForkedProcess:
        """Fork `args` (`python -m ...` or `python -c ...`), its standard streams on `fds`."""
        request_id = next(self._ids)
        started = threading.Event()
        answer: list[int] = []
        with self._lock:
            self._started[request_id] = (started, answer)
        request = {"id": request_id, "option": args[1], "target": args[2], "args": args[3:]}
        request.update(env=env, cwd=cwd, new_session=new_session)
        with self._sending:
            self._control.sendmsg(
                [json.dumps(request).encode()],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))],
            )
        while not started.wait(1.0):
            if self.gone():
                raise RuntimeError(
                    f"the test zygote ended ({self._process.returncode}) before it started {args}"
                )
        child = ForkedProcess(answer[0], args, streams)
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
