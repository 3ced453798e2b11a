"""The CPU a command costs: `python -m tests.bench.suite_cpu make test` (Linux).

Two counts. The run's processes: every process the command starts, however short-lived, as the
kernel adds each one's CPU to the process that waits for it (this one's children's usage), plus
what the processes that outlived their parent and were handed to init (a daemon, a server killed
with its helpers still running) spent, sampled from /proc every SAMPLE_S seconds. The whole
machine: its busy time from /proc/stat over the run, less this process's own, which also counts
the kernel's own threads and whatever else runs meanwhile (on a virtual machine its agent; on
these test machines tens of core-seconds that differ from run to run). Not part of `make bench`,
which the suite does not run: the README quotes its figures for `make test`.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

SAMPLE_S = 0.2
# /proc/stat's first line: user nice system idle iowait irq softirq steal ...; busy is all but
# idle, iowait and steal.
_BUSY_FIELDS = (0, 1, 2, 5, 6)
_KERNEL_THREAD = 0x00200000  # PF_KTHREAD, in /proc/<pid>/stat's flags


def machine_busy_seconds() -> float:
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    return sum(fields[i] for i in _BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of it and of its children it has waited for), of every
    process that is not one of the kernel's threads."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[6]) & _KERNEL_THREAD:
            continue
        ticks = sum(int(value) for value in fields[11:15])
        found[int(entry.name)] = (int(fields[1]), ticks / os.sysconf("SC_CLK_TCK"))
    return found


class Orphans:
    """What processes started during the run spent once handed to init (parent pid 1)."""

    def __init__(self) -> None:
        self._before = set(_processes())
        self._last: dict[int, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> Orphans:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            for pid, seen in _processes().items():
                if pid not in self._before and pid != os.getpid():
                    self._last[pid] = seen

    def seconds(self) -> float:
        return sum(cpu for pid, (parent, cpu) in self._last.items() if parent == 1 and pid != 1)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    started, busy = time.monotonic(), machine_busy_seconds()
    with Orphans() as orphans:
        code = subprocess.call(argv)
    machine = machine_busy_seconds() - busy - sum(os.times()[:2])
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = children.ru_utime + children.ru_stime + orphans.seconds()
    wall = time.monotonic() - started
    print(
        f"{' '.join(argv)}: the run's processes {run:.1f} core-seconds, the whole machine "
        f"{machine:.1f}; {wall:.1f} s; exit status {code}",
        file=sys.stderr,
    )
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
