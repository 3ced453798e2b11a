"""Counters of every worker process of one server, summed for one /metrics scrape.

A scrape reaches one worker. Each worker keeps its counters in a small file
named by its process id in a folder beside the store, rewritten four times a
second and at each scrape; a scrape sums the files of the workers still
running, so the other workers' counts it reports are at most a quarter second
old. A
worker's counts go with it when it dies, as a process restart resets
Prometheus counters anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from isbre.catalog.append_rebase import OUTCOMES
from isbre.catalog.writer import Histogram, WriterStats
from isbre.rest.labels import method_label, report_type

FOLDER = "isbre-workers"
# The supervisor's, where it commits the workers' table commits (catalog/shared_writer.py): its
# writer's batches are theirs.
SUPERVISOR_FOLDER = "isbre-supervisor"


@dataclass
class Counts:
    """What one process counted: the writer's batches and latencies, requests, reports, streams,
    stale commits made again or not."""

    writer: WriterStats = field(default_factory=WriterStats)
    requests: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    reports: Counter[str] = field(default_factory=Counter)
    streams: int = 0
    rebases: Counter[str] = field(default_factory=Counter)  # stale commits, by outcome
    # The writer now: mutations waiting for its next transaction, and those in the one under way.
    queued: int = 0
    committing: int = 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "writer": asdict(self.writer),
                "requests": [[*key, count] for key, count in self.requests.items()],
                "reports": dict(self.reports),
                "streams": self.streams,
                "rebases": dict(self.rebases),
                "queued": self.queued,
                "committing": self.committing,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Counts:
        raw: dict[str, Any] = json.loads(text)
        stats = raw["writer"]
        writer = WriterStats(
            int(stats["batches"]),
            int(stats["mutations"]),
            _histogram(stats["latency"]),
            _histogram(stats["batch_size"]),
            int(stats.get("shared_batches", 0)),
        )
        # Files another process wrote: only their numbers are taken as they are.
        requests: Counter[tuple[str, str, int]] = Counter()
        for method, route, status, count in raw["requests"]:
            requests[(method_label(str(method)), str(route), int(status))] += int(count)
        reports: Counter[str] = Counter()
        for kind, count in dict(raw["reports"]).items():
            reports[report_type(str(kind))] += int(count)
        rebases = Counter(
            {
                outcome: int(count)
                for outcome, count in dict(raw.get("rebases", {})).items()
                if outcome in OUTCOMES
            }
        )
        queued, committing = int(raw.get("queued", 0)), int(raw.get("committing", 0))
        return cls(writer, requests, reports, int(raw["streams"]), rebases, queued, committing)

    def add(self, other: Counts) -> None:
        self.writer.add(other.writer)
        self.requests.update(other.requests)
        self.reports.update(other.reports)
        self.streams += other.streams
        self.rebases.update(other.rebases)
        self.queued += other.queued
        self.committing += other.committing


def _histogram(raw: dict[str, Any]) -> Histogram:
    return Histogram(tuple(map(float, raw["bounds"])), [int(n) for n in raw["counts"]], float(raw["total"]))


def running_workers(state: Path) -> list[Path]:
    """The files of the workers that are running: a worker writes its file when it has started,
    and the file of one that is gone is removed."""
    return _running(state / FOLDER)


def _running(folder: Path) -> list[Path]:
    running = []
    for path in folder.glob("*.json"):
        try:
            os.kill(int(path.stem), 0)
        except (ValueError, OSError):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        running.append(path)
    return running


def forget_workers(state: Path) -> None:
    """Remove the files of a previous server's workers (their pids may belong to others now)."""
    for folder in (FOLDER, SUPERVISOR_FOLDER):
        for path in (state / folder).glob("*"):
            with contextlib.suppress(OSError):
                path.unlink()


class SharedCounters:
    """This worker's file, and the sum over every running worker's and the supervisor's."""

    def __init__(self, state: Path, folder: str = FOLDER) -> None:
        """`folder`: SUPERVISOR_FOLDER for the supervisor's file."""
        self.state = state
        self.folder = state / folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"{os.getpid()}.json"

    def publish(self, counts: Counts) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(counts.to_json())
        os.replace(temporary, self.path)

    def total(self, own: Counts) -> Counts:
        self.publish(own)
        total = Counts()
        for path in running_workers(self.state) + _running(self.state / SUPERVISOR_FOLDER):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                total.add(Counts.from_json(path.read_text()))  # files are replaced whole
        return total

    async def publish_periodically(self, counts: Callable[[], Counts], interval: float = 0.25) -> None:
        while True:
            await asyncio.sleep(interval)
            self.publish(counts())

    def publish_every(self, counts: Callable[[], Counts], interval: float = 0.25) -> threading.Event:
        """`publish_periodically` on a thread of its own (the supervisor's); set the event to stop."""
        stop = threading.Event()

        def publishing() -> None:
            while not stop.wait(interval):
                self.publish(counts())

        threading.Thread(target=publishing, name="isbre-counters", daemon=True).start()
        return stop

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
