"""The CPU a command costs: `python -m tests.bench.suite_cpu make test` (Linux).

Two counts. The run's processes: every process the command starts, however short-lived, each
counted when the process that waits for it does, as the kernel adds a process's CPU to its
parent's children's usage. This process is a child subreaper (prctl(2)): a process whose parent
ends first (a forkserver whose test process has exited, a daemon) is handed to it instead of to
init, and it waits for every one of them, so none is left out. The whole machine: its busy time
from /proc/stat over the run, less this process's own, which also counts the kernel's own
threads and whatever else runs meanwhile (on a virtual machine its agent; on these test
machines up to 100 core-seconds more over a `make test`, different every run). Not part of
`make bench`, which the suite does not run: the README quotes its figures for `make test`.
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
# How long processes left over after the command has ended may take to end.
LEFTOVER_WAIT_S = 60.0
# /proc/stat's first line: user nice system idle iowait irq softirq steal ...; busy is all but
# idle, iowait and steal.
_BUSY_FIELDS = (0, 1, 2, 5, 6)


def machine_busy_seconds() -> float:
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    return sum(fields[i] for i in _BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


def _wait_for_all(command: subprocess.Popen[bytes]) -> int:
    """Wait for the command and for every process handed to this one; the command's exit status."""
    code: int | None = None
    deadline = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG if deadline is not None else 0)
        except ChildProcessError:
            break  # none left
        if pid == command.pid:
            code = os.waitstatus_to_exitcode(status)
            command.returncode = code
            deadline = time.monotonic() + LEFTOVER_WAIT_S
        elif pid == 0:
            if deadline is not None and time.monotonic() > deadline:
                print("processes of the run still running: not counted", file=sys.stderr)
                break
            time.sleep(0.05)
    assert code is not None
    return code


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1) != 0:
        print("cannot become a child subreaper: orphaned processes are not counted", file=sys.stderr)
    started, busy = time.monotonic(), machine_busy_seconds()
    code = _wait_for_all(subprocess.Popen(argv))
    machine = machine_busy_seconds() - busy - sum(os.times()[:2])
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.monotonic() - started
    print(
        f"{' '.join(argv)}: the run's processes {children.ru_utime + children.ru_stime:.1f} "
        f"core-seconds, the whole machine {machine:.1f}; {wall:.1f} s; exit status {code}",
        file=sys.stderr,
    )
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
