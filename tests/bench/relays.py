"""Relays: commit → message in JetStream, and what two relays cost the commits."""

from __future__ import annotations

import asyncio
import base64
import json
import multiprocessing as mp
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import nats
import psutil

from tests.bench.commits import isbre_rate
from tests.bench.harness import RUNS, Report, percentile
from tests.relay_targets import NatsBroker, WebhookReceiver
from tests.server import ID_SCHEMA, IsbreServer

SECRET = "whsec_" + base64.b64encode(b"bench-signing-key-0123456789abcd").decode()
SAMPLES = 200


def _serve_hook(found: Any, stop: Any) -> None:
    receiver = WebhookReceiver().start()
    found.put(receiver.url)
    stop.wait()
    receiver.stop()


class HookProcess:
    """A webhook receiver in a process of its own, off the bench's clients' interpreter lock."""

    def __init__(self) -> None:
        self._found: Any = mp.Queue()
        self._stop = mp.Event()
        self._process = mp.Process(target=_serve_hook, args=(self._found, self._stop))

    def start(self) -> str:
        self._process.start()
        url: str = self._found.get(timeout=60)
        return url

    def stop(self) -> None:
        self._stop.set()
        self._process.join()


class StreamWatch:
    """An ordered JetStream consumer on its own thread: when each commit's message was stored."""

    def __init__(self, url: str, subject: str) -> None:
        self.arrived: dict[int, tuple[float, int]] = {}  # commit_seq: (arrival, the commit's ts in µs)
        self._url = url
        self._subject = subject
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._done: asyncio.Event | None = None
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._watch(),), daemon=True
        )

    async def _watch(self) -> None:
        self._done = asyncio.Event()
        client = await nats.connect(self._url)
        js = client.jetstream()

        async def arrived(message: Any) -> None:
            event = json.loads(message.data)
            self.arrived[event["commitseq"]] = (time.time(), event["data"]["ts"])

        await js.subscribe(self._subject, cb=arrived, ordered_consumer=True, deliver_policy="new")
        self._ready.set()
        await self._done.wait()
        await client.close()

    def start(self) -> StreamWatch:
        self._thread.start()
        assert self._ready.wait(60), "the JetStream consumer did not start"
        return self

    def stop(self) -> None:
        done = self._done
        assert done is not None
        self._loop.call_soon_threadsafe(done.set)
        self._thread.join()


def _latencies(server: IsbreServer, watch: StreamWatch) -> list[float]:
    """Milliseconds from each commit's timestamp to its message stored in JetStream."""
    base = f"{server.url}/v1/isbre/namespaces/bench/tables"
    httpx.post(base, json={"name": "latency", "schema": ID_SCHEMA}).raise_for_status()
    seqs = []
    with httpx.Client(timeout=60) as client:
        for i in range(SAMPLES):
            body = {"requirements": [], "updates": [{"action": "set-properties", "updates": {"i": str(i)}}]}
            client.post(f"{base}/latency", json=body).raise_for_status()
            seqs.append(client.get(f"{server.url}/v1/events/cursor").json()["commit_seq"])
            time.sleep(0.02)  # one commit at a time: each message's own latency
    deadline = time.monotonic() + 60
    while not all(seq in watch.arrived for seq in seqs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [(watch.arrived[s][0] - watch.arrived[s][1] / 1e6) * 1000 for s in seqs if s in watch.arrived]


def _loaded_latencies(server: IsbreServer, watch: StreamWatch) -> list[float]:
    """Milliseconds from each commit's timestamp to its message in JetStream, while 8 writers commit
    as fast as they can (a busy relay batches: its messages may wait for the next batch)."""
    first = httpx.get(f"{server.url}/v1/events/cursor").json()["commit_seq"] + 1
    isbre_rate(server, 8, 50)
    last = httpx.get(f"{server.url}/v1/events/cursor").json()["commit_seq"]
    deadline = time.monotonic() + 60
    while not all(seq in watch.arrived for seq in range(first, last + 1)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [
        (watch.arrived[s][0] - watch.arrived[s][1] / 1e6) * 1000
        for s in range(first, last + 1)
        if s in watch.arrived
    ]


def _relay_process(server: IsbreServer) -> psutil.Process:
    found = [
        c for c in psutil.Process(server.pid).children(recursive=True) if "relay" in " ".join(c.cmdline())
    ]
    assert len(found) == 1, f"expected one relay process, found {found}"
    return found[0]


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _wait_caught_up(server: IsbreServer) -> None:
    """Until every relay has sent every commit (their CPU for the run is then all spent)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        relays = httpx.get(f"{server.url}/health").json()["components"]["relays"]["relays"]
        if all(relay["lag"] == 0 for relay in relays.values()):
            return
        time.sleep(0.05)
    raise AssertionError("the relays did not catch up within 60 s")


def run(workdir: Path) -> Report:
    report = Report(
        "Relays (a NATS JetStream relay and a webhook relay; 8 writers, set-properties), median of 3 runs",
        ["measure", "value"],
    )
    broker = NatsBroker(workdir).start()
    hook = HookProcess()
    hook_url = hook.start()
    relays = [
        {"kind": "nats", "name": "bus", "url": broker.url},
        {"kind": "webhook", "name": "hook", "url": hook_url, "secret": SECRET},
    ]
    off = IsbreServer(workdir / "relays-off").start()
    on = IsbreServer(workdir / "relays-on", env={"ISBRE_RELAYS": json.dumps(relays)}).start()
    for server in (off, on):
        httpx.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["bench"]}).raise_for_status()
    while not broker.messages():  # the relay makes its stream with its first message
        time.sleep(0.05)
    watch = StreamWatch(broker.url, "isbre.commits.>").start()
    try:
        latencies = _latencies(on, watch)
        loaded = _loaded_latencies(on, watch)
    finally:
        # The bench's own consumer, stopped before the commits are counted: it would take the clients'
        # interpreter lock for every message, a cost of the bench, not of the relays.
        watch.stop()
    try:
        report.add("commit → message in JetStream, p50 ms", percentile(latencies, 0.5))
        report.add("commit → message in JetStream, p99 ms", percentile(latencies, 0.99))
        report.add("messages timed", f"{len(latencies)} of {SAMPLES}")
        report.add("under 8 writers: commit → message in JetStream, p50 ms", percentile(loaded, 0.5))
        report.add("under 8 writers: commit → message in JetStream, p99 ms", percentile(loaded, 0.99))
        rates: dict[str, list[float]] = {"off": [], "on": []}
        relay_cpu: list[float] = []
        relay = _relay_process(on)
        for _ in range(RUNS):  # interleaved: a machine that slows down slows both alike
            rates["off"].append(isbre_rate(off, 8, 100))
            before = _cpu_seconds(relay)
            rates["on"].append(isbre_rate(on, 8, 100))
            _wait_caught_up(on)
            relay_cpu.append((_cpu_seconds(relay) - before) * 1000 / 800)
        rate_off, rate_on = (statistics.median(rates[k]) for k in ("off", "on"))
        report.add("commits/s, no relay", rate_off)
        report.add("commits/s, two relays on", rate_on)
        report.add("ratio on / off (goal ≥ 0.95)", f"{rate_on / rate_off:.2f}")
        report.add("relay process CPU per commit (both relays), ms", statistics.median(relay_cpu))
    finally:
        on.stop()
        off.stop()
        hook.stop()
        broker.stop()
    return report
