"""isbre on PostgreSQL with one and two replicas, beside PyIceberg's SqlCatalog on the same
PostgreSQL server doing the same commits (clients in processes), and how soon a commit made
through one replica reaches an event stream on the other."""

from __future__ import annotations

import os
import threading
import time
from functools import partial
from pathlib import Path

import httpx
from pyiceberg.catalog.sql import SqlCatalog

from events.client import subscribe
from tests.bench.harness import RUNS, Report, median_of, percentile
from tests.bench.workers import isbre_rate, load_rate, prepare, sql_rate
from tests.postgres import PostgresServer
from tests.server import IsbreServer

WRITER_COUNTS = (1, 4, 16)
COMMITS_TOTAL = 640
LATENCY_COMMITS = 200


def cross_replica_latency(source: IsbreServer, stream: IsbreServer) -> list[float]:
    """Milliseconds from each commit's own timestamp (taken in the writer's transaction) to its
    event on the other replica's stream; commits one at a time, 10 ms apart."""
    start = stream.high_water()
    arrived: list[float] = []

    def follow() -> None:
        for event in subscribe(stream.url, after=start):
            arrived.append(time.time() * 1000 - event.record["ts"] / 1000)
            if len(arrived) == LATENCY_COMMITS:
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    time.sleep(0.5)
    with httpx.Client() as client:
        for n in range(LATENCY_COMMITS):
            body = {"updates": [{"action": "set-properties", "updates": {"n": str(n)}}]}
            client.post(f"{source.url}/v1/isbre/namespaces/bench/tables/loaded", json=body).raise_for_status()
            time.sleep(0.01)
    follower.join(60)
    return arrived


def run(workdir: Path) -> list[Report]:
    commits = Report(
        f"Commits on one PostgreSQL server, clients in processes (set-properties, each writer its own "
        f"table), commits per second, median of {RUNS} runs of {COMMITS_TOTAL} commits",
        [
            "writers",
            "isbre 1 replica",
            "isbre 2 replicas",
            "SqlCatalog (PostgreSQL)",
            "2 replicas / SqlCatalog",
        ],
    )
    loads = Report(
        f"loadTable on PostgreSQL, clients in processes, requests per second, median of {RUNS} runs",
        ["clients", "isbre 1 replica", "isbre 2 replicas", "ratio"],
    )
    latency = Report(
        f"Cross-replica event latency: commit on replica A to its SSE event on replica B, "
        f"{LATENCY_COMMITS} commits, milliseconds",
        ["p50", "p90", "p99", "max"],
    )
    database = PostgresServer.start()
    isbre_url, sql_url = database.database("isbre_bench"), database.database("sql_bench")
    servers = [IsbreServer(workdir / "replicated", store=isbre_url, workers=1) for _ in range(2)]
    sql_dir = workdir / "sql-postgres"
    sql_dir.mkdir()
    sql_uri, warehouse = sql_url.replace("postgresql://", "postgresql+psycopg://"), sql_dir.as_uri()
    SqlCatalog("bench", uri=sql_uri, warehouse=warehouse).create_namespace("bench")
    try:
        for server in servers:
            server.start()
        prepare(servers[0])  # the other replica sees it too
        for writers in WRITER_COUNTS:
            per_writer = max(1, COMMITS_TOTAL // writers)
            one = median_of(RUNS, partial(isbre_rate, servers[:1], writers, per_writer))
            two = median_of(RUNS, partial(isbre_rate, servers, writers, per_writer))
            sql = median_of(RUNS, partial(sql_rate, sql_uri, warehouse, writers, per_writer))
            commits.add(str(writers), one, two, sql, f"{two / sql:.1f}x")
        for clients in (4, 16):
            requests = max(20, 4000 // clients)
            one = median_of(RUNS, partial(load_rate, servers[:1], clients, requests))
            two = median_of(RUNS, partial(load_rate, servers, clients, requests))
            loads.add(str(clients), one, two, f"{two / one:.1f}x")
        samples = cross_replica_latency(servers[0], servers[1])
        latency.add(*(percentile(samples, q) for q in (0.5, 0.9, 0.99)), max(samples))
    finally:
        for server in servers:
            server.stop()
        database.stop()
    return [commits, loads, latency]


if __name__ == "__main__":
    import tempfile

    print(f"# {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="isbre-bench-") as directory:
        for report in run(Path(directory)):
            print(report.markdown(), end="\n\n")
