"""A table's new rows in a reader's hands: `TableFeed` (woken by the commit's event, reading through
a plan from its cursor) beside a reader that polls the table and plans the difference itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pyarrow as pa
from isbre.events import TableFeed
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.table import Table

from tests.bench.harness import RUNS, Report, cpu_seconds, percentile
from tests.server import IsbreServer

APPENDS = 40  # per run, 10 rows each
PAUSE_S = 0.1  # between appends: each is read on its own
POLL_S = 0.5  # the polling reader's interval
IDLE_S = 10.0
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])


def _polling_reader(table: Table, arrived: Callable[[pa.Table], None], stop: threading.Event) -> None:
    """Load the table every POLL_S; on a new snapshot, plan and read what the appends since added."""
    seen = table.metadata.current_snapshot_id
    while not stop.wait(POLL_S):
        table = table.refresh()
        head = table.metadata.current_snapshot_id
        if head != seen and head is not None:
            scan = table.incremental_append_scan(
                from_snapshot_id_exclusive=seen, to_snapshot_id_inclusive=head
            )
            arrived(scan.to_arrow())
            seen = head


def _feed_reader(feed: TableFeed, arrived: Callable[[pa.Table], None], stop: threading.Event) -> None:
    while not stop.is_set():
        rows = feed.read(timeout=0.5)
        if rows.num_rows:
            arrived(rows)


def _latencies(
    table: Table, start_reader: Callable[[Callable[[pa.Table], None], threading.Event], None]
) -> list[float]:
    """Seconds from each append's acknowledgement to its rows in the reader's hands."""
    committed: dict[int, float] = {}
    latencies: list[float] = []
    done = threading.Event()

    def arrived(rows: pa.Table) -> None:
        now = time.perf_counter()
        for first in {i - i % 10 for i in rows["id"].to_pylist()}:
            latencies.append(now - committed[first])
        if len(latencies) >= APPENDS:
            done.set()

    stop = threading.Event()
    reader = threading.Thread(target=start_reader, args=(arrived, stop), daemon=True)
    reader.start()
    base = int(time.time() * 1000) * 1000
    for n in range(APPENDS):
        first = base + n * 10
        table.append(pa.table({"id": list(range(first, first + 10))}, schema=SCHEMA))
        committed[first] = time.perf_counter()
        time.sleep(PAUSE_S)
    done.wait(30)
    stop.set()
    reader.join(timeout=10)
    return latencies


def run(workdir: Path) -> Report:
    report = Report(
        f"Commit to rows in a reader's hands, {APPENDS} appends of 10 rows {PAUSE_S * 1000:.0f} ms apart, "
        f"median of {RUNS} runs",
        ["reader", "p50 ms", "p99 ms", "server CPU % while idle"],
    )
    server = IsbreServer(workdir / "feeds-warehouse").start()
    try:
        catalog = RestCatalog("bench", uri=server.url)
        catalog.create_namespace("bench")
        table = catalog.create_table("bench.feed", SCHEMA)
        table.append(pa.table({"id": [0]}, schema=SCHEMA))
        process = psutil.Process(server.pid)
        before = cpu_seconds(process)
        time.sleep(IDLE_S)
        idle_none = (cpu_seconds(process) - before) / IDLE_S * 100
        feed = TableFeed(server.url, "bench.feed", consumer=None)
        try:
            feed.read(timeout=0.1)
            before = cpu_seconds(process)
            time.sleep(IDLE_S)
            idle_feed = (cpu_seconds(process) - before) / IDLE_S * 100
            runs = [
                _latencies(table, lambda arrived, stop: _feed_reader(feed, arrived, stop))
                for _ in range(RUNS)
            ]
        finally:
            feed.close()
        polled = [
            _latencies(
                table, lambda arrived, stop: _polling_reader(catalog.load_table("bench.feed"), arrived, stop)
            )
            for _ in range(RUNS)
        ]
        for label, found, idle in (
            ("TableFeed (events, plan from cursor)", runs, f"{idle_feed:.2f} (none open: {idle_none:.2f})"),
            (f"polling loadTable every {POLL_S * 1000:.0f} ms, local incremental plan", polled, ""),
        ):
            p50 = sorted(percentile(each, 0.5) for each in found)[len(found) // 2]
            p99 = sorted(percentile(each, 0.99) for each in found)[len(found) // 2]
            report.add(label, p50 * 1000, p99 * 1000, idle)
    finally:
        server.stop()
    return report
