"""One hot table: 1 to 16 writer processes (PyIceberg clients, one writer each) appending 10-row
batches to the same table, beside PyIceberg's SqlCatalog on SQLite in the same run.

Cases, for each number of writers:

- isbre, rebasing stale appends (the default), client retries off: every attempt is one request;
- the same with a client retry loop (a refused append is refreshed and made again);
- isbre with `isbre.commit.rebase-appends=false` and the retry loop: what every catalog does;
- SqlCatalog with the retry loop;
- SqlCatalog with PyIceberg's own retries on (its defaults: 4 retries, waits from 100 ms doubling,
  each rebuilding only the snapshot, not the data file), and the retry loop around them for the
  appends that exhaust them.

PyIceberg's own retries are off (`commit.retry.num-retries=0`) in every case but the last, so that
every attempt is one request; in the last, each retry PyIceberg logs is counted as an attempt. The
retry loop is the one a client writes around them. Figures: acknowledged commits per second,
acknowledged attempts, attempts per acknowledged commit, the latency of an acknowledged append
from its first attempt (p50, p99), the writers' CPU per acknowledged commit, and the server's CPU
per acknowledged commit (the isbre server is a process of its own). Each case starts on a new
table, all writers at once; the median of `RUNS` runs.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import statistics
import time
import uuid
from dataclasses import dataclass
from multiprocessing.managers import SyncManager
from multiprocessing.pool import Pool
from pathlib import Path
from threading import Barrier

import psutil
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException

from tests.bench.harness import RUNS, Report, cpu_seconds, percentile
from tests.server import IsbreServer

WRITER_COUNTS = (1, 2, 4, 8, 16)


def _writer_counts() -> tuple[int, ...]:
    """`ISBRE_BENCH_HOT_WRITERS` ("1,8") measures only those (1 is always measured: the plain commits)."""
    chosen = os.environ.get("ISBRE_BENCH_HOT_WRITERS")
    return tuple(sorted({1, *map(int, chosen.split(","))})) if chosen else WRITER_COUNTS


APPENDS = 96  # per case, spread over its writers
COST_PAIRS = 60
SCHEMA = pa.schema([pa.field("writer", pa.int64()), pa.field("seq", pa.int64())])
NO_CLIENT_RETRIES = {"commit.retry.num-retries": "0"}
SQL_OWN_RETRIES = "SqlCatalog, its retries on"


@dataclass
class Writer:
    acknowledged: int
    attempts: int
    latencies: list[float]
    cpu_seconds: float


def _catalog(target: str) -> Catalog:
    if target.startswith("sqlite:"):
        uri, warehouse = target.split("|")
        return SqlCatalog("bench", uri=uri, warehouse=warehouse)
    return RestCatalog("bench", uri=target)


class _RetriesSeen(logging.Handler):
    """Counts the retries PyIceberg makes itself: it logs each one before it makes it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.getMessage().startswith("Commit failed due to a concurrent update")


def _write(target: str, identifier: str, writer: int, appends: int, retry: bool, start: Barrier) -> Writer:
    table = _catalog(target).load_table(identifier)
    retried = _RetriesSeen()
    logging.getLogger("pyiceberg.table").addHandler(retried)
    start.wait(timeout=300)
    begun_cpu = time.process_time()
    acknowledged = attempts = 0
    latencies = []
    for seq in range(appends):
        rows = pa.table({"writer": [writer] * 10, "seq": [seq] * 10}, schema=SCHEMA)
        first = time.perf_counter()
        while True:
            attempts += 1
            try:
                table.append(rows)
            except CommitFailedException:
                if not retry:
                    break
                table.refresh()
                continue
            except Exception:  # SQLite's "database is locked", as a writer meets it
                if not retry:
                    break
                table.refresh()
                continue
            acknowledged += 1
            latencies.append(time.perf_counter() - first)
            break
    logging.getLogger("pyiceberg.table").removeHandler(retried)
    return Writer(acknowledged, attempts + retried.count, latencies, time.process_time() - begun_cpu)


@dataclass
class Case:
    seconds: float
    writers: list[Writer]
    server_cpu: float | None

    @property
    def acknowledged(self) -> int:
        return sum(w.acknowledged for w in self.writers)

    @property
    def attempts(self) -> int:
        return sum(w.attempts for w in self.writers)


def _case(
    pool: Pool,
    manager: SyncManager,
    target: str,
    identifier: str,
    count: int,
    retry: bool,
    server: psutil.Process | None,
) -> Case:
    start = manager.Barrier(count + 1)
    appends = max(1, APPENDS // count)
    pending = [pool.apply_async(_write, (target, identifier, w, appends, retry, start)) for w in range(count)]
    start.wait(timeout=300)
    cpu_before = cpu_seconds(server) if server is not None else 0.0
    begun = time.perf_counter()
    writers = [p.get(timeout=1800) for p in pending]
    seconds = time.perf_counter() - begun
    return Case(seconds, writers, cpu_seconds(server) - cpu_before if server is not None else None)


def _median_case(cases: list[Case]) -> Case:
    return sorted(cases, key=lambda c: c.acknowledged / c.seconds)[len(cases) // 2]


def _server_ms(case: Case) -> float:
    assert case.server_cpu is not None
    return 1000 * case.server_cpu / max(case.acknowledged, 1)


def _row(report: Report, name: str, count: int, case: Case) -> None:
    latencies = [s for w in case.writers for s in w.latencies]
    acknowledged = case.acknowledged
    client_cpu = sum(w.cpu_seconds for w in case.writers)
    report.add(
        name,
        count,
        acknowledged / case.seconds,
        f"{acknowledged}/{case.attempts} ({100 * acknowledged / case.attempts:.0f} %)",
        case.attempts / acknowledged if acknowledged else float("nan"),
        1000 * statistics.median(latencies) if latencies else float("nan"),
        1000 * percentile(latencies, 0.99) if latencies else float("nan"),
        1000 * client_cpu / max(acknowledged, 1),
        "-" if case.server_cpu is None else _server_ms(case),
    )


def _cpu_ns(process: psutil.Process) -> int:
    """CPU time of `process` and its children so far, in nanoseconds: each thread's scheduler
    statistics (psutil's figures tick in hundredths of a second, longer than one commit takes)."""
    total = 0
    for each in (process, *process.children(recursive=True)):
        for task in Path(f"/proc/{each.pid}/task").glob("*/schedstat"):
            try:
                total += int(task.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended meanwhile
    return total


def _one_commit_cpu(catalog: Catalog, process: psutil.Process, report: Report) -> None:
    """The server's CPU for one plain append and for one stale append made again, alternately on
    one table from one client (so that both meet the same number of manifests), medians."""
    table = f"bench.cost{uuid.uuid4().hex[:8]}"
    catalog.create_table(table, SCHEMA, properties=NO_CLIENT_RETRIES)
    rows = pa.table({"writer": [0] * 10, "seq": [0] * 10}, schema=SCHEMA)
    plain: list[int] = []
    rebased: list[int] = []
    for _ in range(COST_PAIRS):
        stale, fresh = catalog.load_table(table), catalog.load_table(table)
        for view, spent in ((fresh, plain), (stale, rebased)):
            before = _cpu_ns(process)
            view.append(rows)
            spent.append(_cpu_ns(process) - before)
    made = catalog.load_table(table).snapshots()
    assert (
        sum(1 for s in made if s.summary and "isbre.rebased-from-parent" in s.summary.additional_properties)
        == COST_PAIRS
    )
    plain_ms, rebased_ms = statistics.median(plain) / 1e6, statistics.median(rebased) / 1e6
    report.add("plain append", COST_PAIRS, plain_ms, "1.00x")
    report.add("stale append, rebased", COST_PAIRS, rebased_ms, f"{rebased_ms / plain_ms:.2f}x")


def run(tmp: Path) -> list[Report]:
    report = Report(
        f"One table, 10-row appends by writer processes ({APPENDS} appends a case, median of {RUNS} runs)",
        [
            "catalog",
            "writers",
            "acknowledged/s",
            "acknowledged attempts",
            "attempts per commit",
            "p50 ms",
            "p99 ms",
            "client CPU ms/commit",
            "server CPU ms/commit",
        ],
    )
    (tmp / "isbre").mkdir(parents=True)
    server = IsbreServer(tmp / "isbre" / "warehouse").start()
    process = psutil.Process(server.pid)
    isbre = RestCatalog("bench", uri=server.url)
    isbre.create_namespace("bench")
    sql_target = f"sqlite:///{tmp / 'sql.db'}|{(tmp / 'sql').as_uri()}"
    (tmp / "sql").mkdir()
    sql = _catalog(sql_target)
    sql.create_namespace("bench")
    cases: list[tuple[str, Catalog, str, dict[str, str], bool, psutil.Process | None]] = [
        ("isbre, rebase, retries off", isbre, server.url, NO_CLIENT_RETRIES, False, process),
        ("isbre, rebase, retry loop", isbre, server.url, NO_CLIENT_RETRIES, True, process),
        (
            "isbre, no rebase, retry loop",
            isbre,
            server.url,
            {**NO_CLIENT_RETRIES, "isbre.commit.rebase-appends": "false"},
            True,
            process,
        ),
        ("SqlCatalog, retry loop", sql, sql_target, NO_CLIENT_RETRIES, True, None),
        (SQL_OWN_RETRIES, sql, sql_target, {}, True, None),
    ]
    context = multiprocessing.get_context("spawn")
    ratios = Report(
        "Hot table: isbre beside SqlCatalog at the same number of writers", ["writers", "ratio", "value"]
    )
    try:
        with context.Manager() as manager, context.Pool(max(_writer_counts())) as pool:
            single: Case | None = None
            for count in _writer_counts():
                medians: dict[str, Case] = {}
                for name, catalog, target, properties, retry, measured in cases:
                    runs = []
                    for _ in range(RUNS):
                        identifier = f"bench.t{uuid.uuid4().hex[:8]}"
                        catalog.create_table(identifier, SCHEMA, properties=properties)
                        runs.append(_case(pool, manager, target, identifier, count, retry, measured))
                    medians[name] = _median_case(runs)
                    _row(report, name, count, medians[name])
                rebased, plain = (
                    medians["isbre, rebase, retries off"],
                    medians["isbre, no rebase, retry loop"],
                )
                rate = rebased.acknowledged / rebased.seconds
                for peer in ("SqlCatalog, retry loop", SQL_OWN_RETRIES):
                    ratios.add(
                        count,
                        f"acknowledged/s: isbre rebase ÷ {peer}",
                        f"{rate / (medians[peer].acknowledged / medians[peer].seconds):.2f}x",
                    )
                ratios.add(
                    count,
                    "acknowledged/s: isbre rebase ÷ isbre no rebase",
                    f"{rate / (plain.acknowledged / plain.seconds):.2f}x",
                )
                # At one writer no append is stale: its commits are the plain ones.
                single = single or rebased
                ratios.add(
                    count,
                    "server CPU per commit: rebase ÷ one writer's (plain)",
                    f"{_server_ms(rebased) / _server_ms(single):.2f}x",
                )
        cost = Report(
            f"Server CPU of one commit, plain and rebased, in turn on one table ({COST_PAIRS} each, medians)",
            ["commit", "commits", "server CPU ms", "÷ plain"],
        )
        _one_commit_cpu(isbre, process, cost)
    finally:
        server.stop()
    return [report, ratios, cost]
