"""isbre on PostgreSQL with one and two replicas, beside PyIceberg's SqlCatalog on the same
PostgreSQL server doing the same commits (clients in processes), where each spends its CPU, and
how soon a commit made through one replica reaches an event stream on the other."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx
import psutil
from isbre.events.client import subscribe
from pyiceberg.catalog.sql import SqlCatalog

from tests.bench.harness import RUNS, Report, cpu_seconds, median_of, percentile
from tests.bench.workers import ClientRun, isbre_rate, isbre_run, load_rate, prepare, sql_rate, sql_run
from tests.postgres import PostgresServer
from tests.server import IsbreServer

WRITER_COUNTS = (1, 4, 16)
COMMITS_TOTAL = 640
LATENCY_COMMITS = 200
CPU_WRITERS = 16


def cpu_per_commit(
    run: Callable[[], ClientRun], commits: int, servers: list[IsbreServer], database: PostgresServer
) -> list[float]:
    """Milliseconds of CPU per commit spent by the isbre servers, the client processes and
    PostgreSQL during `run`, and the commits per second it reached."""
    postmaster = psutil.Process(int((database.home / "data" / "postmaster.pid").read_text().split()[0]))
    processes = [psutil.Process(server.process.pid) for server in servers if server.process]
    before = sum(cpu_seconds(p) for p in processes), cpu_seconds(postmaster, exited_children=True)
    clients = run()
    after = sum(cpu_seconds(p) for p in processes), cpu_seconds(postmaster, exited_children=True)
    server, postgres = ((b - a) * 1000 / commits for a, b in zip(before, after, strict=True))
    client = clients.cpu_seconds * 1000 / commits
    return [server, client, postgres, server + client + postgres, commits / clients.seconds]


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
    cpu = Report(
        f"CPU per commit at {CPU_WRITERS} writers: the isbre servers, the client processes and "
        f"PostgreSQL, milliseconds, median of {RUNS} runs of {COMMITS_TOTAL} commits",
        ["", "isbre servers", "clients", "PostgreSQL", "all", "commits/s"],
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
        per_writer = COMMITS_TOTAL // CPU_WRITERS
        runs = {
            "isbre, 1 replica": (servers[:1], partial(isbre_run, servers[:1], CPU_WRITERS, per_writer)),
            "isbre, 2 replicas": (servers, partial(isbre_run, servers, CPU_WRITERS, per_writer)),
            "SqlCatalog": ([], partial(sql_run, sql_uri, warehouse, CPU_WRITERS, per_writer)),
        }
        for name, (measured, run) in runs.items():
            samples = [cpu_per_commit(run, COMMITS_TOTAL, measured, database) for _ in range(RUNS)]
            cpu.add(name, *(statistics.median(column) for column in zip(*samples, strict=True)))
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
    return [commits, cpu, loads, latency]


if __name__ == "__main__":
    import tempfile

    print(f"# {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="isbre-bench-") as directory:
        for report in run(Path(directory)):
            print(report.markdown(), end="\n\n")
