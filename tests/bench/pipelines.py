"""A table-to-table hop (`pipe`: a feed, no transform, a sink) catching up on a source table, beside a
plain sink writing the same rows from memory in one commit: rows per second into the target."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pyarrow as pa
from isbre.events import TableFeed
from isbre.sinks.contract import OffsetSpan
from isbre.sinks.iceberg import IcebergSink
from isbre.sinks.pipeline import pipe
from pyiceberg.catalog.rest import RestCatalog

from tests.bench.harness import RUNS, Report
from tests.server import IsbreServer

COMMITS = 20
ROWS = 50_000  # per source commit
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("label", pa.string())])


def _batch(first: int) -> pa.Table:
    ids = list(range(first, first + ROWS))
    return pa.table({"id": ids, "label": [f"row {i}" for i in ids]}, schema=SCHEMA)


def _count(catalog: RestCatalog, table: str) -> int:
    if not catalog.table_exists(table):
        return 0
    snapshot = catalog.load_table(table).current_snapshot()
    summary = snapshot.summary if snapshot is not None else None
    return int(summary.additional_properties.get("total-records", "0")) if summary is not None else 0


def _plain(catalog: RestCatalog, target: str) -> float:
    sink = IcebergSink(catalog, target)
    start = time.perf_counter()
    for n in range(COMMITS):  # one commit of everything, as the hop, catching up, makes one
        sink.push(_batch(n * ROWS).to_batches()[0], OffsetSpan("bench", "plain", 0, n * ROWS, (n + 1) * ROWS))
    sink.finish()
    elapsed = time.perf_counter() - start
    sink.close()
    return COMMITS * ROWS / elapsed


def _piped(server: IsbreServer, catalog: RestCatalog, source: str, target: str) -> float:
    feed = TableFeed(server.url, source, consumer=target.replace(".", "-"), from_start=True)
    sink = IcebergSink(catalog, target)
    start = time.perf_counter()
    try:
        pipe(feed, None, sink, until=lambda: _count(catalog, target) >= COMMITS * ROWS)
    finally:
        elapsed = time.perf_counter() - start
        feed.close()
        sink.close()
    return COMMITS * ROWS / elapsed


def run(workdir: Path) -> Report:
    report = Report(
        f"A table-to-table hop beside a plain sink: {COMMITS} commits of {ROWS:,} rows, "
        f"median of {RUNS} runs",
        ["writer", "rows/s", "÷ plain sink"],
    )
    server = IsbreServer(workdir / "pipes-warehouse").start()
    try:
        catalog = RestCatalog("bench", uri=server.url)
        catalog.create_namespace("bench")
        source = catalog.create_table("bench.source", SCHEMA)
        for n in range(COMMITS):
            source.append(_batch(n * ROWS))
        plain = statistics.median(_plain(catalog, f"bench.plain{run}") for run in range(RUNS))
        piped = statistics.median(
            _piped(server, catalog, "bench.source", f"bench.piped{run}") for run in range(RUNS)
        )
        report.add("IcebergSink, rows from memory", plain, 1.0)
        report.add("pipe(TableFeed, None, IcebergSink)", piped, piped / plain)
    finally:
        server.stop()
    return report
