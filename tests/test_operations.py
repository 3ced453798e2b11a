"""Running it: overload, oversized requests, probes, and SIGTERM in the middle of commits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests import zygote
from tests.http_client import http
from tests.load import commit_until_stopped
from tests.server import InProcessServer, IsbreServer, free_port
from tests.waiting import eventually

SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}


def test_probes(server: IsbreServer) -> None:
    assert http.get(f"{server.url}/live").json() == {"status": "ok"}
    assert http.get(f"{server.url}/ready").json() == {"status": "ok"}
    health = http.get(f"{server.url}/health").json()
    assert health["status"] == "ok"
    assert health["components"]["writer"] == {"status": "ok", "queue_depth": 0}


def test_an_oversized_body_is_413_and_changes_nothing(tmp_path: Path) -> None:
    server = InProcessServer(tmp_path / "warehouse", env={"ISBRE_MAX_BODY_MB": "0.01"}).start()
    try:
        big = {"namespace": ["big"], "properties": {"x": "y" * 20_000}}
        response = http.post(f"{server.url}/v1/isbre/namespaces", json=big)
        assert response.status_code == 413
        assert response.json()["error"]["type"] == "RequestEntityTooLargeException"
        assert http.get(f"{server.url}/v1/isbre/namespaces").json()["namespaces"] == []
        assert (
            http.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["small"]}).status_code == 200
        )
    finally:
        server.stop()


@pytest.mark.parametrize("threshold", ["0", "0.000001"])
def test_a_request_answered_later_than_the_threshold_is_logged(tmp_path: Path, threshold: str) -> None:
    """Every answer takes longer than a microsecond: with that threshold each request is logged,
    naming its method, path, status and wait; with 0 none is."""
    server = InProcessServer(tmp_path / "warehouse", env={"ISBRE_SLOW_REQUEST_SECONDS": threshold}).start()
    try:
        assert http.get(f"{server.url}/v1/isbre/namespaces/nope").status_code == 404
    finally:
        server.stop()
    slow = [line for line in server.log().splitlines() if "slow request:" in line]
    if threshold == "0":
        assert slow == []
    else:
        slow = [line for line in slow if "nope" in line]  # the readiness probes of start() are logged too
        assert len(slow) == 1 and "WARNING" in slow[0], slow
        assert "slow request: GET '/v1/isbre/namespaces/nope' answered 404 after" in slow[0], slow
        assert slow[0].endswith("s (slow_request_seconds = 1e-06)"), slow


def test_an_overloaded_writer_answers_503_and_recovers(tmp_path: Path) -> None:
    server = InProcessServer(tmp_path / "warehouse", env={"ISBRE_MAX_QUEUE": "1"}).start()
    try:
        outcomes: Counter[int] = Counter()
        retry_after: set[str] = set()

        def burst(w: int) -> None:
            with httpx.Client(timeout=30) as client:
                for i in range(40):
                    response = client.post(
                        f"{server.url}/v1/isbre/namespaces", json={"namespace": [f"n{w}_{i}"]}
                    )
                    outcomes[response.status_code] += 1
                    if response.status_code == 503:
                        assert response.json()["error"]["type"] == "ServiceUnavailableException"
                        retry_after.add(response.headers.get("retry-after"))

        threads = [threading.Thread(target=burst, args=(w,)) for w in range(24)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert set(outcomes) <= {200, 503}
        assert outcomes[503] > 0, "24 concurrent writers never filled a one-slot queue"
        assert retry_after == {"1"}
        created = http.get(f"{server.url}/v1/isbre/namespaces").json()["namespaces"]
        assert len(created) == outcomes[200], "a refused request must leave nothing behind"
        assert (
            http.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["after"]}).status_code == 200
        )
    finally:
        server.stop()


@pytest.mark.parametrize("run", range(2))
def test_sigterm_answers_accepted_commits(tmp_path: Path, run: int) -> None:
    server = IsbreServer(tmp_path / "warehouse").start()
    base = f"{server.url}/v1/isbre"
    http.post(f"{base}/namespaces", json={"namespace": ["db"]}).raise_for_status()
    http.post(f"{base}/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).raise_for_status()
    acknowledged: list[str] = []
    statuses: Counter[int] = Counter()
    stop = threading.Event()

    threads = [
        threading.Thread(
            target=commit_until_stopped, args=(server.url, "db", "t", f"w{w}", acknowledged, stop, statuses)
        )
        for w in range(8)
    ]
    for thread in threads:
        thread.start()
    wanted = 20 + 20 * run
    eventually(lambda: len(acknowledged) >= wanted, f"{wanted} acknowledged commits", timeout=120, every=0.01)
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=30)
    stopping_took = time.monotonic() - started
    stop.set()
    for thread in threads:
        thread.join()

    assert set(statuses) <= {200, 503}, f"unexpected answers during shutdown: {statuses}"
    assert stopping_took < 15
    restarted = IsbreServer(server.warehouse).start()
    try:
        properties = http.get(f"{restarted.url}/v1/isbre/namespaces/db/tables/t").json()["metadata"][
            "properties"
        ]
        assert [key for key in acknowledged if key not in properties] == []
    finally:
        restarted.stop()


def test_sigterm_closes_event_streams_cleanly(tmp_path: Path) -> None:
    server = IsbreServer(tmp_path / "warehouse").start()
    ended: list[str] = []

    opened = threading.Event()

    def listen() -> None:
        try:
            with http.stream("GET", f"{server.url}/v1/events", timeout=30) as response:
                for _ in response.iter_lines():
                    opened.set()  # the retry hint: the stream is being served
            ended.append("clean")
        except httpx.HTTPError as exc:
            ended.append(type(exc).__name__)

    listener = threading.Thread(target=listen)
    listener.start()
    assert opened.wait(30), "the stream never opened"
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=30)
    listener.join(30)
    assert ended == ["clean"], f"the stream ended with {ended}"
    assert "returned without completing response" not in server.log()


def test_sigterm_to_the_whole_process_group_shuts_down_cleanly(tmp_path: Path) -> None:
    """What systemd and `timeout` do: SIGTERM reaches the server and its helper processes at once.
    The fan-out process may be gone before the server stops it; shutdown must still finish."""
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = zygote.popen(
            [
                sys.executable,
                "-m",
                "isbre.rest.cli",
                "serve",
                "--port",
                str(port),
                "--warehouse",
                str(tmp_path / "wh"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def live() -> bool:
            try:
                return http.get(f"http://127.0.0.1:{port}/live", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        eventually(live, "the server answering /live")
        os.killpg(process.pid, signal.SIGTERM)
        # uvicorn re-raises the signal it stopped for once it has shut down: -15 is a clean exit.
        assert process.wait(timeout=30) in (0, -signal.SIGTERM), log.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    said = log.read_text()
    assert "Application shutdown complete" in said and "shutdown failed" not in said.lower(), said
