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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from catalog import CatalogService
from tests.bench.commits import isbre_rate
from tests.bench.harness import RUNS, Report, median_of, percentile
from tests.server import IsbreServer

_TS = re.compile(rb'"ts":(\d+)')
_SEQ = re.compile(rb"\nid: (\d+)\n")


async def _subscriber(port: int, after: int, until: int, latencies: list[float] | None) -> int:
    """Read frames until commit_seq `until`; optionally record each event's latency. Returns the count."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET /v1/events?after={after} HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
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
        seqs = _SEQ.findall(data)
        seen += len(_SEQ.findall(chunk)) if not tail else len(seqs) - len(_SEQ.findall(tail))
        tail = data[-64:]
        if seqs and int(seqs[-1]) >= until:
            writer.close()
            return seen


def _subscribers_process(port: int, after: int, until: int, count: int, ready, results) -> None:
    async def main() -> list[float]:
        latencies: list[float] = []
        tasks = [_subscriber(port, after, until, latencies if i == 0 else None) for i in range(count)]
        gathered = asyncio.gather(*tasks)
        await asyncio.sleep(0.5)  # let every connection open before the commits start
        ready.set()
        await gathered
        return latencies

    results.put(asyncio.run(main()))


def _attach(server: IsbreServer, count: int, until: int):
    after = httpx.get(f"{server.url}/v1/events/cursor").json()["commit_seq"]
    ready, results = mp.Event(), mp.Queue()
    process = mp.Process(
        target=_subscribers_process, args=(server.port, after, after + until, count, ready, results)
    )
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
    process, results = _attach(server, subscribers, commits)
    _namespace_commits(server, commits, f"lat{subscribers}_{time.monotonic_ns()}_", pace=0.002)
    latencies = results.get(timeout=120)
    process.join()
    return percentile(latencies, 0.5), percentile(latencies, 0.99)


def replay_rate(server: IsbreServer, records: int) -> float:
    async def read_all() -> float:
        start = time.perf_counter()
        await _subscriber(server.port, 0, records, None)
        return records / (time.perf_counter() - start)

    return asyncio.run(read_all())


def fill_log(warehouse: Path, records: int) -> None:
    service = CatalogService.open(warehouse)
    try:
        service.create_namespace(("filler",), {})
        with ThreadPoolExecutor(64) as pool:
            list(
                pool.map(
                    lambda i: service.update_namespace(("filler",), [], {"i": str(i)}), range(records - 1)
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
        ["subscribers", "commits/s", "ratio to none"],
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
        alone = median_of(RUNS, lambda: isbre_rate(server, 8, 100))
        throughput_report.add("0", alone, "1.00")

        def attached() -> float:
            process, results = _attach(server, 100, 8 * 100 + 8)  # the tables' creates are events too
            rate = isbre_rate(server, 8, 100)
            results.get(timeout=120)
            process.join()
            return rate

        with_subscribers = median_of(RUNS, attached)
        throughput_report.add("100", with_subscribers, f"{with_subscribers / alone:.2f}")
    finally:
        server.stop()
    return [latency_report, replay_report, throughput_report]
