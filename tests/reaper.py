"""What the tests start is stopped when the test process ends, however it ends.

A fixture's teardown does not run when pytest is killed (a CI job's time limit, SIGKILL, a
timeout that exits at once), and PostgreSQL's server is a daemon that no parent-death signal
reaches. So the first server a test run starts also starts this watcher: a small process that
reads, on a pipe from the test process, what to kill or run at the end, and does it when the pipe
closes, that is when the test process is gone. A fixture that stops its server normally tells the
watcher to forget it.

Run as `python -m tests.reaper`; the test process uses `watch_process`, `run_at_end` and `forget`.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

_pipe: IO[str] | None = None
_ids = itertools.count(1)


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): a reused pid has another."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _send(entry: list[Any]) -> int:
    global _pipe
    if _pipe is None:
        # The watcher outlives the test process: it must not share its process group (a Ctrl-C)
        # nor wait on its output.
        watcher = subprocess.Popen(
            [sys.executable, "-m", "tests.reaper"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        _pipe = watcher.stdin
    assert _pipe is not None
    entry_id = next(_ids)
    _pipe.write(json.dumps([entry_id, *entry]) + "\n")
    _pipe.flush()
    return entry_id


def watch_process(pid: int) -> int:
    """Kill `pid` (SIGKILL) if it still runs when the test process ends."""
    return _send(["kill", pid, _start_time(pid)])


def run_at_end(command: list[str]) -> int:
    """Run `command` when the test process ends, unless forgotten first."""
    return _send(["run", command])


def forget(entry_id: int) -> None:
    _send(["forget", entry_id])


def _finish(entries: dict[int, list[Any]]) -> None:
    for kind, *what in entries.values():
        if kind == "kill":
            pid, started = what
            if started is not None and _start_time(pid) == started:
                os.kill(pid, signal.SIGKILL)
        elif kind == "run":
            subprocess.run(what[0], capture_output=True, timeout=60)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    entries: dict[int, list[Any]] = {}
    for line in sys.stdin:
        entry_id, kind, *what = json.loads(line)
        if kind == "forget":
            entries.pop(int(what[0]), None)
        else:
            entries[int(entry_id)] = [kind, *what]
    _finish(entries)


if __name__ == "__main__":
    main()
