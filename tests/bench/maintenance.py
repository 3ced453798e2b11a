"""A streaming table over time: one-row commits through isbre's sink with the catalog's
maintenance on (the streaming defaults a sink's table gets: expiry, old metadata files, manifest
merging, compaction) and off, beside PyIceberg's appends to SqlCatalog on SQLite with no
maintenance, in one run.

The maintained feed runs to 20,000 commits or until its time is up (`ISBRE_BENCH_STREAM_SECONDS`,
120 s by default); the two without maintenance, whose commits grow slower with every snapshot,
get a quarter of that each. At each checkpoint it reached, and where it stood when its time was
up: the median latency and client CPU of the last commits, the server's CPU per commit over them (job
processes included), the size of the metadata file a commit rewrites, the snapshots kept, the
data files a scan opens, and the time a scan takes to plan (the median of plans spread over the
last commits).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pyarrow as pa
from isbre.sinks.contract import OffsetSpan
from isbre.sinks.iceberg import IcebergSink
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from tests.bench.harness import Report, cpu_seconds
from tests.server import IsbreServer

CHECKPOINTS = (100, 1_000, 10_000, 20_000)
WINDOW = 50  # commits whose figures make a checkpoint's
# Plans spread over a checkpoint's window whose median is its planning time: what a plan costs
# swings with the manifests the current snapshot has between merges, so one plan is one phase.
PLANS = 5
ROW = pa.table({"n": pa.array([1], pa.int64())})
# Two seconds of snapshots here stand for the defaults' ten minutes at a commit a second.
STREAMING = {"history.expire.max-snapshot-age-ms": "2000"}
OFF = {
    "isbre.maintenance.enabled": "false",
    "write.metadata.delete-after-commit.enabled": "false",
    "commit.manifest-merge.enabled": "false",
    "isbre.maintenance.compact.enabled": "false",
}


def _seconds() -> float:
    return float(os.environ.get("ISBRE_BENCH_STREAM_SECONDS", "120"))


def _metadata_bytes(table: Table) -> int:
    path = table.metadata_location.removeprefix("file://")
    return os.path.getsize(path)


def _planning_ms(table: Table) -> float:
    started = time.perf_counter()
    list(table.scan().plan_files())
    return (time.perf_counter() - started) * 1000


def _plans_after(done: int) -> bool:
    """Whether a plan is timed after commit `done`: every WINDOW // PLANS commits of a window
    that ends at a checkpoint."""
    ahead = next(c for c in CHECKPOINTS if c >= done) - done
    return ahead < WINDOW and ahead % (WINDOW // PLANS) == 0


def _data_files(table: Table) -> int:
    current = table.current_snapshot()
    return int(current.summary["total-data-files"]) if current and current.summary else 0


def _appending(catalog: Catalog, ident: str) -> Callable[[int], None]:
    table = catalog.create_table(ident, schema=ROW.schema)
    return lambda _: table.append(ROW)


def _sinking(catalog: Catalog, ident: str, properties: dict[str, str]) -> Callable[[int], None]:
    """One-row pushes through isbre's sink, a commit each (no metadata columns, as the appends)."""
    sink = IcebergSink(catalog, ident, metadata_policy="none", table_properties=properties)

    def commit(offset: int) -> None:
        sink.push(ROW.to_batches()[0], OffsetSpan("bench", "stream", 0, offset, offset + 1))
        sink.finish()

    return commit


def _feed(
    label: str,
    catalog: Catalog,
    commit: Callable[[int], None],
    ident: str,
    report: Report,
    server: psutil.Process | None,
    seconds: float,
) -> None:
    latencies: list[float] = []
    client: list[float] = []
    plans: list[float] = []
    window_cpu = 0.0
    deadline = time.monotonic() + seconds
    for done in range(1, CHECKPOINTS[-1] + 1):
        if server is not None and done % WINDOW == 1:  # checkpoints end windows
            window_cpu = cpu_seconds(server, exited_children=True)
        started, cpu = time.perf_counter(), time.process_time()
        commit(done)
        latencies.append(time.perf_counter() - started)
        client.append(time.process_time() - cpu)
        up = time.monotonic() > deadline
        if _plans_after(done):
            plans.append(_planning_ms(catalog.load_table(ident)))
        if done in CHECKPOINTS or up:
            since = (done - 1) % WINDOW + 1  # commits since the window began
            spent = (cpu_seconds(server, exited_children=True) - window_cpu) / since if server else None
            table = catalog.load_table(ident)
            report.add(
                label,
                f"{done:,}" + (" (time up)" if up and done not in CHECKPOINTS else ""),
                statistics.median(latencies[-WINDOW:]) * 1000,
                statistics.median(client[-WINDOW:]) * 1000,
                "—" if spent is None else f"{spent * 1000:.1f}",
                f"{_metadata_bytes(table) / 1024:,.0f}",
                str(len(table.metadata.snapshots)),
                str(_data_files(table)),
                statistics.median(plans or [_planning_ms(table)]),
            )
            plans.clear()
        if up:
            return


def run(workdir: Path) -> Report:
    report = Report(
        f"A streaming table: up to {CHECKPOINTS[-1]:,} one-row commits in {_seconds():g} s"
        f" ({_seconds() / 4:g} s without maintenance), medians of the last {WINDOW}"
        f" (planning: of {PLANS} plans among them)",
        [
            "catalog",
            "commits",
            "commit, ms",
            "client CPU, ms",
            "server CPU, ms",
            "metadata file, KiB",
            "snapshots kept",
            "data files",
            "scan planning, ms",
        ],
    )
    server = IsbreServer(workdir / "isbre-warehouse").start()
    process = psutil.Process(server.process.pid) if server.process else None
    sql_warehouse = workdir / "sql-warehouse"
    sql_warehouse.mkdir()
    sql = SqlCatalog("bench", uri=f"sqlite:///{workdir / 'sql.db'}", warehouse=sql_warehouse.as_uri())
    try:
        rest = RestCatalog("bench", uri=server.url)
        rest.create_namespace("bench")
        sql.create_namespace("bench")
        on, off = "bench.streaming", "bench.off"
        seconds = _seconds()
        _feed("isbre sink, maintenance on", rest, _sinking(rest, on, STREAMING), on, report, process, seconds)
        peers = seconds / 4
        _feed("isbre sink, maintenance off", rest, _sinking(rest, off, OFF), off, report, process, peers)
        sql_feed = _appending(sql, "bench.t")
        _feed("SqlCatalog appends, no maintenance", sql, sql_feed, "bench.t", report, None, peers)
    finally:
        server.stop()
        sql.close()
    return report
