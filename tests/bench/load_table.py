"""loadTable over loopback: requests per second and latency percentiles."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pyarrow as pa
from pyiceberg.catalog.rest import RestCatalog

from tests.bench.harness import RUNS, Report, percentile
from tests.server import IsbreServer


def _measure(url: str, clients: int, requests: int) -> tuple[float, list[float]]:
    latencies: list[list[float]] = [[] for _ in range(clients)]

    def work(c: int) -> None:
        with httpx.Client() as client:
            client.get(url).raise_for_status()  # open the connection outside the measurement
            for _ in range(requests):
                start = time.perf_counter()
                client.get(url).raise_for_status()
                latencies[c].append(time.perf_counter() - start)

    threads = [threading.Thread(target=work, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    return clients * requests / elapsed, [x for per_client in latencies for x in per_client]


def table_with_snapshots(server: IsbreServer, snapshots: int = 10) -> str:
    """The URL of a new table on `server` that `snapshots` appends made."""
    catalog = RestCatalog("bench", uri=server.url)
    catalog.create_namespace("bench")
    table = catalog.create_table("bench.loaded", schema=pa.schema([pa.field("n", pa.int64())]))
    for i in range(snapshots):
        table.append(pa.table({"n": pa.array([i], pa.int64())}))
    return f"{server.url}/v1/isbre/namespaces/bench/tables/loaded"


def run(workdir: Path, requests: int = 2000) -> Report:
    report = Report(
        f"loadTable over loopback (table with 10 snapshots), median of {RUNS} runs",
        ["clients", "requests/s", "p50 ms", "p99 ms"],
    )
    server = IsbreServer(workdir / "load-warehouse").start()
    try:
        url = table_with_snapshots(server)
        for clients in (1, 4):
            results = sorted(
                (_measure(url, clients, requests // clients) for _ in range(RUNS)), key=lambda r: r[0]
            )
            rate, latencies = results[len(results) // 2]
            report.add(
                str(clients), rate, percentile(latencies, 0.5) * 1000, percentile(latencies, 0.99) * 1000
            )
    finally:
        server.stop()
    return report
