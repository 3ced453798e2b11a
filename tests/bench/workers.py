"""Commits and loadTable with the clients spread over processes: isbre with one server process and
with N workers, beside PyIceberg's SqlCatalog with its writers in as many processes.

Threads in one client interpreter would measure the client's own interpreter
lock; here every client process runs a few writer threads at most, and all of
them start together on a barrier.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier
from pathlib import Path

import httpx
from pyiceberg.catalog.sql import SqlCatalog

from tests.bench.commits import SCHEMA, SCHEMA_JSON
from tests.bench.harness import RUNS, Report, median_of
from tests.server import IsbreServer

WRITER_COUNTS = (1, 4, 16, 64)
COMMITS_TOTAL = 640


def client_processes(clients: int) -> int:
    return min(clients, max(4, os.cpu_count() or 1))


def _isbre_writers(urls: list[str], commits: int, tables: list[str], start: Barrier) -> None:
    def work(table: str) -> None:
        url = urls[int(table.rsplit("_", 1)[1]) % len(urls)]  # writers spread over the servers
        with httpx.Client(timeout=120) as client:
            for i in range(commits):
                body = {"updates": [{"action": "set-properties", "updates": {f"k{i}": str(i)}}]}
                client.post(f"{url}/v1/isbre/namespaces/bench/tables/{table}", json=body).raise_for_status()

    _threads(work, tables, start)


def _sql_writers(uri: str, warehouse: str, commits: int, tables: list[str], start: Barrier) -> None:
    catalog = SqlCatalog("bench", uri=uri, warehouse=warehouse)
    loaded = {table: catalog.load_table(("bench", table)) for table in tables}

    def work(table: str) -> None:
        for i in range(commits):
            with loaded[table].transaction() as transaction:
                transaction.set_properties({f"k{i}": str(i)})

    _threads(work, tables, start)


def _loaders(urls: list[str], requests: int, clients: list[str], start: Barrier) -> None:
    def work(name: str) -> None:
        url = urls[int(name) % len(urls)]
        with httpx.Client(timeout=60) as client:
            for _ in range(requests):
                client.get(f"{url}/v1/isbre/namespaces/bench/tables/loaded").raise_for_status()

    _threads(work, clients, start)


_cpu_at_start = 0.0  # in a client process: its CPU time when the barrier let it go


def _threads(work: Callable[[str], None], items: list[str], start: Barrier) -> None:
    global _cpu_at_start
    failures: list[BaseException] = []

    def guarded(item: str) -> None:
        try:
            work(item)
        except BaseException as exc:
            failures.append(exc)
            raise

    threads = [threading.Thread(target=guarded, args=(item,)) for item in items]
    start.wait()
    _cpu_at_start = time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:  # the client process exits non-zero, and in_processes says so
        raise failures[0]


def _counted(target: Callable[..., None], spent: Synchronized, *args: object) -> None:
    """Runs `target(*args)` and adds the CPU time it took after the barrier to `spent`."""
    target(*args)
    with spent.get_lock():
        spent.value += time.process_time() - _cpu_at_start


@dataclass
class ClientRun:
    seconds: float  # from the moment every client process was ready until the last one was done
    cpu_seconds: float  # the client processes' CPU time in that span


def in_processes(target: Callable[..., None], groups: list[list[str]], *leading: object) -> ClientRun:
    """Each client process runs `target(*leading, group, barrier)`."""
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(len(groups) + 1)
    spent = context.Value("d", 0.0)
    processes = [
        context.Process(target=_counted, args=(target, spent, *leading, group, ready)) for group in groups
    ]
    for process in processes:
        process.start()
    ready.wait()
    begun = time.perf_counter()
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"a client process failed ({process.exitcode})")
    return ClientRun(time.perf_counter() - begun, spent.value)


def prepare(server: IsbreServer) -> None:
    """The benchmarks' namespace, and the table that loadTable loads."""
    httpx.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["bench"]}).raise_for_status()
    body = {"name": "loaded", "schema": SCHEMA_JSON}
    httpx.post(f"{server.url}/v1/isbre/namespaces/bench/tables", json=body).raise_for_status()


def _split(items: list[str], parts: int) -> list[list[str]]:
    return [items[i::parts] for i in range(parts) if items[i::parts]]


def isbre_run(servers: IsbreServer | list[IsbreServer], writers: int, commits: int) -> ClientRun:
    """`writers` writers making `commits` commits each, each on its own table, spread over `servers`
    (replicas of one catalog)."""
    urls = [s.url for s in (servers if isinstance(servers, list) else [servers])]
    run = uuid.uuid4().hex[:8]
    tables = [f"i{run}_{w}" for w in range(writers)]
    for table in tables:
        body = {"name": table, "schema": SCHEMA_JSON}
        httpx.post(f"{urls[0]}/v1/isbre/namespaces/bench/tables", json=body).raise_for_status()
    return in_processes(_isbre_writers, _split(tables, client_processes(writers)), urls, commits)


def isbre_rate(servers: IsbreServer | list[IsbreServer], writers: int, commits: int) -> float:
    """Commits per second (see `isbre_run`)."""
    return writers * commits / isbre_run(servers, writers, commits).seconds


def sql_run(uri: str, warehouse: str, writers: int, commits: int) -> ClientRun:
    catalog = SqlCatalog("bench", uri=uri, warehouse=warehouse)
    run = uuid.uuid4().hex[:8]
    tables = [f"s{run}_{w}" for w in range(writers)]
    for table in tables:
        catalog.create_table(("bench", table), schema=SCHEMA)
    catalog.close()
    return in_processes(_sql_writers, _split(tables, client_processes(writers)), uri, warehouse, commits)


def sql_rate(uri: str, warehouse: str, writers: int, commits: int) -> float:
    return writers * commits / sql_run(uri, warehouse, writers, commits).seconds


def load_rate(servers: IsbreServer | list[IsbreServer], clients: int, requests: int) -> float:
    urls = [s.url for s in (servers if isinstance(servers, list) else [servers])]
    groups = _split([str(c) for c in range(clients)], client_processes(clients))
    return clients * requests / in_processes(_loaders, groups, urls, requests).seconds


def run(workdir: Path) -> list[Report]:
    many = min(os.cpu_count() or 1, 8)
    commits = Report(
        f"Commits with clients in processes (set-properties, each writer its own table), commits per "
        f"second, median of {RUNS} runs of {COMMITS_TOTAL} commits; {many} workers = the cores, up to 8",
        [
            "writers",
            "isbre 1 worker",
            f"isbre {many} workers",
            "SqlCatalog (SQLite)",
            "N workers / SqlCatalog",
        ],
    )
    loads = Report(
        f"loadTable with clients in processes, requests per second, median of {RUNS} runs",
        ["clients", "isbre 1 worker", f"isbre {many} workers", "ratio"],
    )
    servers = [
        IsbreServer(workdir / "one-worker", workers=1),
        IsbreServer(workdir / "many-workers", workers=many),
    ]
    sql_dir = workdir / "sql-processes"
    sql_dir.mkdir()
    uri, warehouse = f"sqlite:///{sql_dir / 'catalog.db'}", sql_dir.as_uri()
    SqlCatalog("bench", uri=uri, warehouse=warehouse).create_namespace("bench")
    try:
        for server in servers:
            prepare(server.start())
        for writers in WRITER_COUNTS:
            per_writer = max(1, COMMITS_TOTAL // writers)
            one, n = (median_of(RUNS, partial(isbre_rate, s, writers, per_writer)) for s in servers)
            sql = median_of(RUNS, partial(sql_rate, uri, warehouse, writers, per_writer))
            commits.add(str(writers), one, n, sql, f"{n / sql:.1f}x")
        for clients in (4, 16, 64):
            requests = max(20, 4000 // clients)
            one, n = (median_of(RUNS, partial(load_rate, s, clients, requests)) for s in servers)
            loads.add(str(clients), one, n, f"{n / one:.1f}x")
    finally:
        for server in servers:
            server.stop()
    return [commits, loads]
