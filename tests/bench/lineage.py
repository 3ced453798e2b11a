"""Lineage: what the outbox costs commits, and how fast it delivers a backlog."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import httpx

from tests.bench.commits import isbre_rate
from tests.bench.harness import RUNS, Report, median_of
from tests.lineage_receiver import Receiver
from tests.server import IsbreServer, free_port


def _serve_receiver(port: int, stop) -> None:
    receiver = Receiver(port).start()
    stop.wait()
    receiver.stop()


class ReceiverProcess:
    """A real OpenLineage receiver in its own process."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._stop = mp.Event()
        self._process = mp.Process(target=_serve_receiver, args=(port, self._stop))

    def start(self) -> ReceiverProcess:
        self._process.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self.count()
                return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise TimeoutError("the receiver did not start")

    def count(self) -> int:
        return int(httpx.get(f"http://127.0.0.1:{self.port}/count").text)

    def stop(self) -> None:
        self._stop.set()
        self._process.join()


def _prepare(server: IsbreServer) -> None:
    httpx.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["bench"]}).raise_for_status()


def drain_rate(workdir: Path, commits: int = 1000) -> float:
    """Commits made with the receiver down, then events per second once it is back."""
    port = free_port()
    server = IsbreServer(
        workdir / f"drain-{time.monotonic_ns()}", env={"ISBRE_LINEAGE_URL": f"http://127.0.0.1:{port}"}
    )
    server.start()
    try:
        _prepare(server)
        isbre_rate(server, 8, commits // 8)
        receiver = ReceiverProcess(port).start()
        expected = 2 * (commits // 8 * 8 + 8)  # START and COMPLETE for every create and commit
        started = time.perf_counter()
        while receiver.count() < expected:
            time.sleep(0.01)
        rate = expected / (time.perf_counter() - started)
        receiver.stop()
        return rate
    finally:
        server.stop()


def run(workdir: Path) -> Report:
    report = Report(
        "Lineage (8 writers, set-properties; receiver in its own process), median of 3 runs",
        ["measure", "value"],
    )
    port = free_port()
    receiver = ReceiverProcess(port).start()
    off = IsbreServer(workdir / "lineage-off").start()
    on = IsbreServer(workdir / "lineage-on", env={"ISBRE_LINEAGE_URL": f"http://127.0.0.1:{port}"}).start()
    try:
        for server in (off, on):
            _prepare(server)
        rate_off = median_of(RUNS, lambda: isbre_rate(off, 8, 100))
        rate_on = median_of(RUNS, lambda: isbre_rate(on, 8, 100))
        report.add("commits/s, lineage off", rate_off)
        report.add("commits/s, lineage on (receiver up)", rate_on)
        report.add("ratio on / off", f"{rate_on / rate_off:.2f}")
    finally:
        on.stop()
        off.stop()
        receiver.stop()
    report.add(
        "outbox delivery, events/s (draining a 1,000-commit backlog)",
        median_of(RUNS, lambda: drain_rate(workdir)),
    )
    return report
