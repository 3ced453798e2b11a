"""The CPU a command costs the whole machine: `python -m tests.bench.suite_cpu make test`.

Every process a test run starts (servers, workers, jobs, PostgreSQL, Chromium, the kernel's work
for them) is counted, including those that end before anyone could ask them: the machine's busy
time from /proc/stat over the command's run, less this process's own. Run it on a machine doing
nothing else; what other work runs meanwhile is counted too. Not part of `make bench`, which the
suite does not run: the README quotes its figures for `make test`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

# /proc/stat's first line: user nice system idle iowait irq softirq steal ...; busy is all but
# idle, iowait and steal.
_BUSY_FIELDS = (0, 1, 2, 5, 6)


def busy_seconds() -> float:
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    return sum(fields[i] for i in _BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    started, busy = time.monotonic(), busy_seconds()
    code = subprocess.call(argv)
    spent = busy_seconds() - busy - sum(os.times()[:2])
    wall = time.monotonic() - started
    print(f"{' '.join(argv)}: {spent:.1f} core-seconds, {wall:.1f} s, exit status {code}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
