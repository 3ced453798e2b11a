"""A table's new rows in a reader's hands: `TableFeed` (woken by the commit's event, reading through
a plan from its cursor) beside a reader that polls the table and plans the difference itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.compute as pc
from isbre.events import TableFeed
from isbre.sinks.contract import OffsetSpan
from isbre.sinks.iceberg import IcebergSink
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.table import Table

from tests.bench.harness import RUNS, Report, cpu_seconds, percentile
from tests.server import IsbreServer

APPENDS = 40  # per run, 10 rows each
PAUSE_S = 0.1  # between appends: each is read on its own
POLL_S = 0.5  # the polling reader's interval
IDLE_S = 10.0
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
KEYED = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("version", pa.int64())])


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
    write: Callable[[int], None],
    commits_of: Callable[[pa.Table], set[int]],
    start_reader: Callable[[Callable[[pa.Table], None], threading.Event], None],
) -> list[float]:
    """Seconds from each write's acknowledgement (`write(n)`, n from 0) to its rows in the reader's
    hands (`commits_of` says which writes the rows read came from)."""
    committed: dict[int, float] = {}
    latencies: list[float] = []
    done = threading.Event()

    def arrived(rows: pa.Table) -> None:
        now = time.perf_counter()
        for n in commits_of(rows):
            latencies.append(now - committed[n])
        if len(latencies) >= APPENDS:
            done.set()

    stop = threading.Event()
    reader = threading.Thread(target=start_reader, args=(arrived, stop), daemon=True)
    reader.start()
    for n in range(APPENDS):
        write(n)
        committed[n] = time.perf_counter()
        time.sleep(PAUSE_S)
    done.wait(30)
    stop.set()
    reader.join(timeout=10)
    return latencies


def _appends(table: Table) -> tuple[Callable[[int], None], Callable[[pa.Table], set[int]]]:
    """Appends of 10 new ids each; the appends some rows came from."""
    base = int(time.time() * 1000) * 1000

    def write(n: int) -> None:
        first = base + n * 10
        table.append(pa.table({"id": list(range(first, first + 10))}, schema=SCHEMA))

    return write, lambda rows: {(i - base) // 10 for i in rows["id"].to_pylist()}


def _upserts(
    catalog: RestCatalog, name: str
) -> tuple[Callable[[int], None], Callable[[pa.Table], set[int]], IcebergSink]:
    """A keyed sink's commits to a new table `name`, each the same 10 keys with a new version: 10
    update pairs each."""
    sink = IcebergSink(catalog, name, key=["id"])
    offset = [0]

    def write(n: int) -> None:
        batch = pa.RecordBatch.from_pydict({"id": list(range(10)), "version": [n] * 10}, schema=KEYED)
        sink.push(batch, OffsetSpan("bench", "keyed", 0, offset[0], offset[0] + 10))
        sink.finish()
        offset[0] += 10

    def commits_of(rows: pa.Table) -> set[int]:
        after = rows.filter(pc.equal(rows["_change_type"], "update_after"))
        return set(after["version"].to_pylist())

    write(-1)  # the keys' first rows: every commit measured updates them
    return write, commits_of, sink


def _changes(
    server: IsbreServer, catalog: RestCatalog, table: Table
) -> list[tuple[str, list[list[float]], str]]:
    """Change feeds: of the appends, and of a keyed sink's updates (equality deletes applied,
    updates paired)."""
    feed = TableFeed(server.url, "bench.feed", consumer=None, changes=True)
    try:
        appended = [_latencies(*_appends(table), partial(_feed_reader, feed)) for _ in range(RUNS)]
    finally:
        feed.close()
    updated = []
    for run in range(RUNS):  # a new table each run: from 1 data file and no delete file to 40 of each
        write, commits_of, sink = _upserts(catalog, f"bench.keyed{run}")
        feed = TableFeed(server.url, f"bench.keyed{run}", consumer=None, changes=True)
        try:
            updated.append(_latencies(write, commits_of, partial(_feed_reader, feed)))
        finally:
            feed.close()
            sink.close()
    return [
        ("TableFeed(changes=True), the same appends", appended, ""),
        ("TableFeed(changes=True), a new keyed sink table's commits of 10 updates", updated, ""),
    ]


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
            runs = [_latencies(*_appends(table), partial(_feed_reader, feed)) for _ in range(RUNS)]
        finally:
            feed.close()
        changed = _changes(server, catalog, table)
        polled = [
            _latencies(*_appends(table), partial(_polling_reader, catalog.load_table("bench.feed")))
            for _ in range(RUNS)
        ]
        for label, found, idle in (
            ("TableFeed (events, plan from cursor)", runs, f"{idle_feed:.2f} (none open: {idle_none:.2f})"),
            *changed,
            (f"polling loadTable every {POLL_S * 1000:.0f} ms, local incremental plan", polled, ""),
        ):
            p50 = sorted(percentile(each, 0.5) for each in found)[len(found) // 2]
            p99 = sorted(percentile(each, 0.99) for each in found)[len(found) // 2]
            report.add(label, p50 * 1000, p99 * 1000, idle)
    finally:
        server.stop()
    return report
