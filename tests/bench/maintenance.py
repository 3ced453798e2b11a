"""A streaming table over time: small appends through isbre's REST catalog with the catalog's
maintenance on (the streaming defaults a sink's table gets) and off, beside PyIceberg's
SqlCatalog on SQLite with no maintenance, in one run.

At each checkpoint: the median client-side latency of the last commits, the size of the metadata
file a commit rewrites, the snapshots the table keeps, and the time a scan takes to plan.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from isbre.sinks.contract import OffsetSpan
from isbre.sinks.iceberg import IcebergSink
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from tests.bench.harness import Report
from tests.server import IsbreServer

CHECKPOINTS = (100, 250, 500)
WINDOW = 50  # commits whose latency makes a checkpoint's median
ROW = pa.table({"n": pa.array([1], pa.int64())})
STREAMING = {
    "isbre.maintenance.enabled": "true",
    # Two seconds of snapshots here stand for the defaults' ten minutes at a commit a second.
    "history.expire.max-snapshot-age-ms": "2000",
    "history.expire.min-snapshots-to-keep": "20",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
}


def _metadata_bytes(table: Table) -> int:
    path = table.metadata_location.removeprefix("file://")
    return os.path.getsize(path)


def _planning_ms(table: Table) -> float:
    started = time.perf_counter()
    list(table.scan().plan_files())
    return (time.perf_counter() - started) * 1000


def _appending(catalog: Catalog, ident: str, properties: dict[str, str]) -> Callable[[int], Table]:
    table = catalog.create_table(ident, schema=ROW.schema, properties=properties)

    def commit(_: int) -> Table:
        table.append(ROW)
        return table

    return commit


def _sinking(catalog: Catalog, ident: str, properties: dict[str, str]) -> Callable[[int], Table]:
    """One-row pushes through isbre's sink, a commit each (no metadata columns, as the appends)."""
    sink = IcebergSink(catalog, ident, metadata_policy="none", table_properties=properties)

    def commit(offset: int) -> Table:
        sink.push(ROW.to_batches()[0], OffsetSpan("bench", "stream", 0, offset, offset + 1))
        sink.finish()
        return sink.writer.table

    return commit


def _feed(
    label: str, catalog: Catalog, properties: dict[str, str], report: Report, sink: bool = False
) -> None:
    ident = f"bench.{label.split()[0].lower()}"
    commit = (_sinking if sink else _appending)(catalog, ident, properties)
    latencies: list[float] = []
    for done in range(1, CHECKPOINTS[-1] + 1):
        started = time.perf_counter()
        commit(done)
        latencies.append(time.perf_counter() - started)
        if done in CHECKPOINTS:
            table = catalog.load_table(ident)
            median = statistics.median(latencies[-WINDOW:]) * 1000
            report.add(
                label,
                str(done),
                median,
                f"{_metadata_bytes(table) / 1024:,.0f}",
                str(len(table.metadata.snapshots)),
                _planning_ms(table),
            )


def run(workdir: Path) -> Report:
    report = Report(
        f"A streaming table: {CHECKPOINTS[-1]:,} one-row appends, median commit latency of the last {WINDOW}",
        ["catalog", "commits", "commit, ms", "metadata file, KiB", "snapshots kept", "scan planning, ms"],
    )
    server = IsbreServer(workdir / "isbre-warehouse").start()
    sql_warehouse = workdir / "sql-warehouse"
    sql_warehouse.mkdir()
    sql = SqlCatalog("bench", uri=f"sqlite:///{workdir / 'sql.db'}", warehouse=sql_warehouse.as_uri())
    try:
        rest = RestCatalog("bench", uri=server.url)
        rest.create_namespace("bench")
        sql.create_namespace("bench")
        _feed("isbre (maintenance on)", rest, STREAMING, report)
        _feed("isbre-off (no maintenance)", rest, {}, report)
        # A sink's table gets the streaming defaults unless told otherwise: here, as isbre-off.
        off = {
            "isbre.maintenance.enabled": "false",
            "write.metadata.delete-after-commit.enabled": "false",
            "commit.manifest-merge.enabled": "false",
        }
        _feed("isbre-sink (IcebergSink, no maintenance)", rest, off, report, sink=True)
        # The defaults a sink's table gets, their age cut as above: expiry and manifest merging.
        streaming = {"history.expire.max-snapshot-age-ms": "2000"}
        _feed("isbre-streaming (IcebergSink, streaming defaults)", rest, streaming, report, sink=True)
        _feed("SqlCatalog (no maintenance)", sql, {}, report)
    finally:
        server.stop()
        sql.close()
    return report
