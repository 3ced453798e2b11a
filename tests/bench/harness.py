"""Shared benchmark plumbing: repeated runs, medians, percentiles, and a Markdown table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psutil

RUNS = 3


def median_of(runs: int, measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(runs))


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(work: Callable[[], None]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


@dataclass
class Report:
    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append(
            [c if isinstance(c, str) else f"{c:,.2f}" if isinstance(c, float) else str(c) for c in cells]
        )
        print(" | ".join(self.rows[-1]), flush=True)

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.headers) + " |"]
        lines.append("|" + "|".join("---" for _ in self.headers) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


def cpu_seconds(process: psutil.Process, exited_children: bool = False) -> float:
    """CPU time so far of `process` and its live descendants, and with `exited_children` of the
    children it has reaped (PostgreSQL's backends that ended)."""
    total = 0.0
    for each in (process, *process.children(recursive=True)):
        try:
            times = each.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
        if exited_children and each is process:
            total += times.children_user + times.children_system
    return total
