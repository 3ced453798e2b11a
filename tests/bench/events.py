"""Commit events: commit-to-event latency, replay rate, and what subscribers cost the writers.

Subscribers run in a separate process on raw asyncio sockets, so that the
measuring side adds as little as possible to the machine's load; latency is
the time an event is received minus the record's `ts`, which the writer stamps
just before the durable commit (the same clock: everything is on loopback).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import httpx
from isbre.catalog.warehouses import open_catalog

from tests.bench.commits import isbre_rate
from tests.bench.harness import RUNS, Report, median_of, percentile
from tests.server import IsbreServer

_TS = re.compile(rb'"ts":(\d+)')
_SEQ = re.compile(rb"\nid: (\d+)\n")


async def _subscriber(
    port: int, after: int, expected: int, latencies: list[float] | None, query: str = ""
) -> int:
    """Read `expected` events after `after`; optionally record each one's latency. Returns the count."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    # The server's own name: without authentication it refuses other Host names (DNS rebinding).
    host = f"127.0.0.1:{port}"
    request = (
        f"GET /v1/events?after={after}{query} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n"
    )
    writer.write(request.encode())
    await writer.drain()
    seen, tail = 0, b""
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            raise ConnectionError("the stream ended early")
        now_us = time.time_ns() // 1000
        data = tail + chunk
        if latencies is not None:
            latencies.extend(
                (now_us - int(ts)) / 1000 for ts in _TS.findall(data[len(tail) - 64 if tail else 0 :])
            )
        seen += len(_SEQ.findall(data)) - len(_SEQ.findall(tail))
        tail = data[-64:]
        if seen >= expected:
            writer.close()
            return seen


def _subscribers_process(
    port: int, after: int, expected: list[int], queries: list[str], ready, results
) -> None:
    async def main() -> list[float]:
        latencies: list[float] = []
        tasks = [
            _subscriber(port, after, count, latencies if i == 0 else None, query)
            for i, (count, query) in enumerate(zip(expected, queries, strict=True))
        ]
        gathered = asyncio.gather(*tasks)
        await asyncio.sleep(0.5)  # let every connection open before the commits start
        ready.set()
        started = time.process_time(), time.perf_counter()
        await gathered
        return latencies, (time.process_time() - started[0]) / (time.perf_counter() - started[1])

    results.put(asyncio.run(main()))


def _attach(server: IsbreServer, queries: list[str], expected: list[int]):
    """One subscriber per query string, in a separate process, each stopping after its expected count."""
    after = httpx.get(f"{server.url}/v1/events/cursor").json()["commit_seq"]
    ready, results = mp.Event(), mp.Queue()
    args = (server.port, after, expected, queries, ready, results)
    process = mp.Process(target=_subscribers_process, args=args)
    process.start()
    ready.wait(30)
    return process, results


def _namespace_commits(server: IsbreServer, count: int, prefix: str, pace: float = 0.0) -> None:
    with httpx.Client() as client:
        for i in range(count):
            client.post(
                f"{server.url}/v1/isbre/namespaces", json={"namespace": [f"{prefix}{i}"]}
            ).raise_for_status()
            if pace:
                time.sleep(pace)


def latency(server: IsbreServer, subscribers: int, commits: int = 500) -> tuple[float, float]:
    """p50 and p99 commit-to-event latency (ms), one writer committing at a steady pace."""
    process, results = _attach(server, [""] * subscribers, [commits] * subscribers)
    _namespace_commits(server, commits, f"lat{subscribers}_{time.monotonic_ns()}_", pace=0.002)
    latencies, _ = results.get(timeout=120)
    process.join()
    return percentile(latencies, 0.5), percentile(latencies, 0.99)


def latency_from_another_process(server: IsbreServer, commits: int = 200) -> tuple[float, float]:
    """p50 and p99 latency (ms) of the events of commits that another process (an embedded catalog
    on the server's warehouse) makes: the server learns of them from the store, not its writer."""
    process, results = _attach(server, [""], [commits])
    embedded = open_catalog(server.warehouse)
    try:
        prefix = f"other_{time.monotonic_ns()}_"
        for i in range(commits):
            embedded.namespaces.create((f"{prefix}{i}",), {})
            time.sleep(0.002)
    finally:
        embedded.close()
    latencies, _ = results.get(timeout=120)
    process.join()
    return percentile(latencies, 0.5), percentile(latencies, 0.99)


def replay_rate(server: IsbreServer, records: int) -> float:
    async def read_all() -> float:
        start = time.perf_counter()
        await _subscriber(server.port, 0, records, None)
        return records / (time.perf_counter() - start)

    return asyncio.run(read_all())


def fill_log(warehouse: Path, records: int) -> None:
    service = open_catalog(warehouse)
    try:
        service.namespaces.create(("filler",), {})
        with ThreadPoolExecutor(64) as pool:
            list(
                pool.map(
                    lambda i: service.namespaces.update_properties(("filler",), [], {"i": str(i)}),
                    range(records - 1),
                )
            )
    finally:
        service.close()


def run(workdir: Path, replay_records: int = 100_000) -> list[Report]:
    latency_report = Report(
        "Commit-to-event latency over SSE (one writer, 500 commits), median of 3 runs",
        ["subscribers", "p50 ms", "p99 ms"],
    )
    throughput_report = Report(
        "Commit throughput (8 writers, set-properties) with subscribers attached, median of 3 runs",
        ["subscribers", "commits/s", "ratio to none", "subscribers' own CPU (cores)"],
    )
    replay_report = Report("Replay from cursor 0 over SSE, median of 3 runs", ["records", "events/s"])

    fill_log(workdir / "replay-warehouse", replay_records)
    server = IsbreServer(workdir / "replay-warehouse").start()
    try:
        replay_report.add(f"{replay_records:,}", median_of(RUNS, lambda: replay_rate(server, replay_records)))
        httpx.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["bench"]}).raise_for_status()
        for subscribers in (1, 100):
            runs = sorted(latency(server, subscribers) for _ in range(RUNS))
            latency_report.add(str(subscribers), *runs[len(runs) // 2])
        runs = sorted(latency_from_another_process(server) for _ in range(RUNS))
        latency_report.add("1, commits by another process (200)", *runs[len(runs) // 2])
        alone = median_of(RUNS, lambda: isbre_rate(server, 8, 100))
        throughput_report.add("none", alone, "1.00", "-")

        client_cpu: list[float] = []

        def attached(each_one_table: bool) -> float:
            run = f"sub{uuid.uuid4().hex[:8]}"
            queries = [f"&table=bench.{run}_w{i % 8}" if each_one_table else "" for i in range(100)]
            # A table's events are its create and 100 commits; all 8 tables' for an unfiltered subscriber.
            process, results = _attach(server, queries, [101 if each_one_table else 808] * 100)
            rate = isbre_rate(server, 8, 100, run)
            client_cpu.append(results.get(timeout=120)[1])
            process.join()
            return rate

        for label, each_one_table in (("100, all events", False), ("100, one table each", True)):
            client_cpu.clear()
            rate = median_of(RUNS, partial(attached, each_one_table))
            throughput_report.add(label, rate, f"{rate / alone:.2f}", f"{sorted(client_cpu)[1]:.2f}")
    finally:
        server.stop()
    return [latency_report, replay_report, throughput_report]
