"""Copy-on-write deletes followed by a change feed: the catalog netting the rows each one carried
over (position delete files, written once per commit) beside the reader netting them itself
(`change_net_max_rows = 0`), two servers in the same run."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.compute as pc
from isbre.events import TableFeed
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.expressions import EqualTo

from tests.bench.harness import RUNS, Report, cpu_seconds
from tests.server import IsbreServer

ROWS = 200_000  # in one data file: each delete writes the other rows again
DELETES = 8  # per run, one row each
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("payload", pa.string())])


def _deletes(server: IsbreServer, run: int) -> tuple[list[float], float, float]:
    """Seconds from each delete's acknowledgement to its one change in the feed's hands; the
    server's and this process's CPU seconds per delete (the writer's own rewrite excluded)."""
    catalog = RestCatalog("bench", uri=server.url)
    name = f"bench.cow{run}"
    table = catalog.create_table(name, SCHEMA)
    ids = pa.array(range(ROWS), pa.int64())
    table.append(pa.table({"id": ids, "payload": pc.cast(ids, pa.string())}, schema=SCHEMA))
    feed = TableFeed(server.url, name, consumer=None, changes=True)
    server_process, own = psutil.Process(server.pid), psutil.Process()
    latencies, server_cpu, reader_cpu = [], 0.0, 0.0
    try:
        feed.read(timeout=5)  # the append: the feed starts after it
        for n in range(DELETES):
            table.delete(EqualTo("id", n * 1000))
            acknowledged = time.perf_counter()
            server_before, own_before = cpu_seconds(server_process), own.cpu_times()
            changes = feed.read(timeout=30)
            latencies.append(time.perf_counter() - acknowledged)
            server_cpu += cpu_seconds(server_process) - server_before
            own_after = own.cpu_times()
            reader_cpu += own_after.user + own_after.system - own_before.user - own_before.system
            assert changes["id"].to_pylist() == [n * 1000], changes.num_rows
    finally:
        feed.close()
    return latencies, server_cpu / DELETES, reader_cpu / DELETES


def run(workdir: Path) -> Report:
    report = Report(
        f"Copy-on-write deletes of 1 row from a {ROWS:,}-row file, commit to the change in a "
        f"TableFeed's hands, {DELETES} deletes a run, median of {RUNS} runs",
        ["who nets the carried rows", "p50 ms", "max ms", "server CPU ms / delete", "reader CPU ms / delete"],
    )
    servers = {
        "the catalog (position delete files)": IsbreServer(workdir / "netted"),
        "the reader (change_net_max_rows = 0)": IsbreServer(
            workdir / "left", env={"ISBRE_CHANGE_NET_MAX_ROWS": "0"}
        ),
    }
    results: dict[str, list[tuple[list[float], float, float]]] = {label: [] for label in servers}
    try:
        for server in servers.values():
            server.start()
            RestCatalog("bench", uri=server.url).create_namespace("bench")
        for run_number in range(RUNS):  # alternating, so that both see the same moments of the machine
            for label, server in servers.items():
                results[label].append(_deletes(server, run_number))
    finally:
        for server in servers.values():
            server.stop()
    for label, found in results.items():
        report.add(
            label,
            statistics.median(statistics.median(latencies) for latencies, _, _ in found) * 1000,
            statistics.median(max(latencies) for latencies, _, _ in found) * 1000,
            statistics.median(server for _, server, _ in found) * 1000,
            statistics.median(reader for _, _, reader in found) * 1000,
        )
    return report
