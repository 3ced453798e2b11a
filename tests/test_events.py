"""Commit events over SSE and the pull endpoint, against real servers."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from isbre.events.client import CommitEvent, EventStreamError, subscribe

from tests import zygote
from tests.http_client import http
from tests.postgres import new_database
from tests.server import ID_SCHEMA as SCHEMA
from tests.server import InProcessServer, IsbreServer, sse_records
from tests.waiting import eventually


def create_table(server: IsbreServer, namespace: str, name: str) -> None:
    http.post(
        f"{server.url}/v1/isbre/namespaces/{namespace}/tables", json={"name": name, "schema": SCHEMA}
    ).raise_for_status()


def commit(client: httpx.Client, server: IsbreServer, namespace: str, table: str, key: str) -> None:
    body = {"updates": [{"action": "set-properties", "updates": {key: "1"}}]}
    client.post(f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{table}", json=body).raise_for_status()


class Collector:
    """Runs the Python client in a thread and keeps what it yields."""

    def __init__(self, url: str, **options: object) -> None:
        self.events: list[CommitEvent] = []
        self.error: BaseException | None = None
        self._stopped = threading.Event()
        self._stream = iter(subscribe(url, **options))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._stream:
                self.events.append(event)
                if self._stopped.is_set():
                    return
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        """Stop after the next event (the thread is a daemon, so an idle one just stays parked)."""
        self._stopped.set()

    def wait_for(self, commit_seq: int, timeout: float = 30.0) -> list[CommitEvent]:
        def arrived() -> bool:
            if self.error is not None:
                raise self.error
            return bool(self.events) and self.events[-1].commit_seq >= commit_seq

        eventually(arrived, f"an event with commit_seq {commit_seq}", timeout, every=0.02)
        return self.events


def run_writers(server: IsbreServer, namespace: str, writers: int, commits: int) -> list[str]:
    acknowledged: list[str] = []

    def work(w: int) -> None:
        with httpx.Client(timeout=30) as client:
            for i in range(commits):
                commit(client, server, namespace, f"t{w % 4}", f"w{w}-{i}")
                acknowledged.append(f"w{w}-{i}")

    threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return acknowledged


@pytest.fixture(scope="module", params=["fan-out process", "in-process", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    """Every test here runs against both ways of serving streams, and on a PostgreSQL store (whose
    commits reach the fan-out process through LISTEN/NOTIFY)."""
    env = {"ISBRE_EVENTS_PROCESS": "false"} if request.param == "in-process" else {}
    store = new_database(request) if request.param == "postgresql" else None
    running = InProcessServer(tmp_path_factory.mktemp("isbre") / "warehouse", env=env, store=store).start()
    yield running
    running.stop()


def events_health(server: IsbreServer) -> dict:
    return http.get(f"{server.url}/health").json()["components"]["events"]


@pytest.fixture
def tables(server: IsbreServer, namespace: str) -> str:
    for t in range(4):
        create_table(server, namespace, f"t{t}")
    return namespace


def test_one_event_per_commit_under_eight_writers(server: IsbreServer, tables: str) -> None:
    start = server.high_water()
    collector = Collector(server.url, after=start)
    acknowledged = run_writers(server, tables, writers=8, commits=25)
    events = collector.wait_for(start + len(acknowledged))
    assert [e.commit_seq for e in events] == list(range(start + 1, start + 201))
    assert all(e.kind == "table.commit" and e.record["namespace"] == [tables] for e in events)
    metadata_files = [e.record["metadata_location"] for e in events]
    assert len(set(metadata_files)) == 200, "two events named the same commit"


def test_history_then_live_tail_without_gap(server: IsbreServer, tables: str) -> None:
    run_writers(server, tables, writers=2, commits=20)
    collector = Collector(server.url, after=0)
    run_writers(server, tables, writers=4, commits=20)
    events = collector.wait_for(server.high_water())
    assert [e.commit_seq for e in events] == list(range(1, server.high_water() + 1))


def test_reconnect_with_last_event_id_misses_nothing(server: IsbreServer, tables: str) -> None:
    run_writers(server, tables, writers=1, commits=10)
    top = server.high_water()
    first = sse_records(server, until=top - 5, after=0)
    resumed = sse_records(server, until=top, headers={"Last-Event-ID": str(first[-1]["commit_seq"])})
    assert [r["commit_seq"] for r in first + resumed] == list(range(1, top + 1))


def test_filters_select_exactly_the_matching_events(server: IsbreServer, namespace: str) -> None:
    http.post(
        f"{server.url}/v1/isbre/namespaces", json={"namespace": [namespace, "inner"]}
    ).raise_for_status()
    create_table(server, namespace, "a")
    create_table(server, f"{namespace}%1Finner", "b")
    with httpx.Client() as client:
        for i in range(3):
            commit(client, server, namespace, "a", f"k{i}")
            commit(client, server, f"{namespace}%1Finner", "b", f"k{i}")
    rename = {
        "source": {"namespace": [namespace], "name": "a"},
        "destination": {"namespace": [namespace], "name": "a2"},
    }
    http.post(f"{server.url}/v1/isbre/tables/rename", json=rename).raise_for_status()
    top = server.high_water()
    everything = [r for r in sse_records(server, until=top, after=0) if r["namespace"][:1] == [namespace]]

    def filtered(**params: object) -> list[int]:
        expected_last = max(r["commit_seq"] for r in everything if matches(r, **params))
        return [r["commit_seq"] for r in sse_records(server, until=expected_last, after=0, **params)]

    def matches(record: dict, namespace: str | None = None, table=(), kind=()) -> bool:
        ns = namespace.split(".") if namespace else None
        names = [(record["namespace"], record.get("name"))]
        if "previous" in record:
            names.append((record["previous"]["namespace"], record["previous"]["name"]))
        return (
            (not kind or record["kind"] in kind)
            and (ns is None or any(n[: len(ns)] == ns for n, _ in names))
            and (not table or any(".".join([*n, str(m)]) in table for n, m in names))
        )

    for params in (
        {"namespace": f"{namespace}.inner"},
        {"table": [f"{namespace}.a"]},
        {"table": [f"{namespace}.a2", f"{namespace}.inner.b"]},
        {"kind": ["table.create", "table.rename"], "namespace": namespace},
    ):
        assert filtered(**params) == [r["commit_seq"] for r in everything if matches(r, **params)], params


def test_recent_is_the_tail_of_what_the_stream_replays(server: IsbreServer, tables: str) -> None:
    """What the console opens with: the newest matching records, then the cursor to follow from."""
    changes = [
        {
            "identifier": {"namespace": [tables], "name": f"t{t}"},
            "updates": [{"action": "set-properties", "updates": {"k": str(t)}}],
        }
        for t in range(4)
    ]
    with httpx.Client(base_url=f"{server.url}/v1/isbre") as client:
        for _ in range(260):  # more than a chunk of the log (1,000 records), read backwards
            client.post("/transactions/commit", json={"table-changes": changes}).raise_for_status()
        top = server.high_water()
        everything = sse_records(server, until=top, after=0)
        for params, wanted in (
            ({}, everything),
            (
                {"table": [f"{tables}.t1"]},
                [r for r in everything if r.get("name") == "t1" and r["namespace"] == [tables]],
            ),
            (
                {"kind": ["table.create"], "namespace": tables},
                [r for r in everything if r["kind"] == "table.create" and r["namespace"] == [tables]],
            ),
        ):
            for limit in (0, 1, 5, 1000):
                answer = client.get("/events/recent", params={"limit": limit, **params})
                assert answer.status_code == 200
                assert answer.json() == {"commit_seq": top, "records": wanted[-limit:] if limit else []}, (
                    params,
                    limit,
                )
        too_many = client.get("/events/recent", params={"limit": 1001})
        assert too_many.status_code == 400 and too_many.json()["error"]["type"] == "BadRequestException"


def test_transaction_events_arrive_together(server: IsbreServer, tables: str) -> None:
    start = server.high_water()
    changes = [
        {
            "identifier": {"namespace": [tables], "name": f"t{i}"},
            "updates": [{"action": "set-properties", "updates": {"tx": "1"}}],
        }
        for i in range(3)
    ]
    http.post(
        f"{server.url}/v1/isbre/transactions/commit", json={"table-changes": changes}
    ).raise_for_status()
    records = sse_records(server, until=start + 3, after=start)
    assert [r["commit_seq"] for r in records] == [start + 1, start + 2, start + 3]
    assert len({r["txn"] for r in records}) == 1
    assert {r["txn_size"] for r in records} == {3}


def test_pull_endpoint_pages_through_what_sse_streams(server: IsbreServer, tables: str) -> None:
    before = server.high_water()
    run_writers(server, tables, writers=2, commits=10)
    top = server.high_water()
    records = sse_records(server, until=top, after=before)
    streamed = [str(r["commit_seq"]) for r in records]
    # From the millisecond of this test's first commit (earlier ones of that millisecond come too).
    body: dict = {"page-size": 7, "since-timestamp-ms": records[0]["ts"] // 1000}
    pulled: list[str] = []
    with httpx.Client(base_url=server.url) as client:
        while (page := client.post("/v1/isbre/events", json=body).json())["events"]:
            assert len(page["events"]) <= 7
            pulled += [e["event-id"] for e in page["events"]]
            body = {"page-size": 7, "continuation-token": page["continuation-token"]}
    assert [seq for seq in pulled if int(seq) > before] == streamed
    assert all(int(seq) <= before for seq in pulled[: len(pulled) - len(streamed)])


def test_pull_filters_by_operation_and_object(server: IsbreServer, tables: str) -> None:
    with httpx.Client() as client:
        commit(client, server, tables, "t1", "x")
    page = http.post(
        f"{server.url}/v1/isbre/events",
        json={
            "operation-types": ["update-table"],
            "catalog-objects-by-name": [[tables, "t1"]],
            "page-size": 100,
        },
    ).json()
    assert [e["operation"]["identifier"] for e in page["events"]] == [{"namespace": [tables], "name": "t1"}]
    event = page["events"][0]
    assert event["operation"]["operation-type"] == "update-table"
    assert event["request-event-count"] == 1
    assert set(event) >= {"event-id", "request-id", "timestamp-ms", "operation"}
    bad = http.post(f"{server.url}/v1/isbre/events", json={"continuation-token": "garbage"})
    assert bad.status_code == 400


def test_open_streams_are_counted(server: IsbreServer) -> None:
    def streams() -> float:
        lines = http.get(f"{server.url}/metrics").text.splitlines()
        return float(next(line for line in lines if line.startswith("isbre_event_streams ")).split()[1])

    before = streams()
    with http.stream("GET", f"{server.url}/v1/events", timeout=10) as response:
        lines = response.iter_lines()  # kept: a dropped iterator closes the response
        next(lines)  # the retry hint: the stream is open
        assert streams() == before + 1
    eventually(lambda: streams() == before, "the closed stream uncounted", timeout=5)


def test_cursor_ahead_of_the_log_is_400(server: IsbreServer) -> None:
    response = http.get(f"{server.url}/v1/events", params={"after": server.high_water() + 1000})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "BadRequestException"


@pytest.fixture
def short_memory(tmp_path: Path) -> Iterator[IsbreServer]:
    """A server that keeps only 5 records and 8 live events, so both limits are easy to reach."""
    env = {
        "ISBRE_EVENTS_RETENTION_RECORDS": "5",
        "ISBRE_EVENTS_TRIM_INTERVAL_SECONDS": "0.2",
        "ISBRE_EVENTS_RING_SIZE": "8",
    }
    running = InProcessServer(tmp_path / "warehouse", env=env).start()
    yield running
    running.stop()


def test_expired_cursor_is_410(short_memory: IsbreServer) -> None:
    base = f"{short_memory.url}/v1/isbre"
    for i in range(20):
        http.post(f"{base}/namespaces", json={"namespace": [f"n{i}"]}).raise_for_status()
    cursor = f"{short_memory.url}/v1/events/cursor"
    eventually(lambda: http.get(cursor).json()["oldest_commit_seq"] == 16, "the log trimmed to 5", 10)
    response = http.get(f"{short_memory.url}/v1/events", params={"after": 0})
    assert response.status_code == 410
    assert response.json()["error"]["type"] == "CursorExpiredException"
    token = http.post(f"{base}/events", json={"page-size": 1}).json()["continuation-token"]
    assert http.post(f"{base}/events", json={"continuation-token": token}).status_code == 200
    from isbre.rest.event_pages import encode_token

    assert http.post(f"{base}/events", json={"continuation-token": encode_token(0)}).status_code == 410
    with pytest.raises(EventStreamError, match="older than the retained"):
        next(iter(subscribe(short_memory.url, after=0)))


@pytest.fixture
def small_ring(tmp_path: Path) -> Iterator[IsbreServer]:
    """A server that keeps only 8 live events in memory (and the whole log)."""
    running = InProcessServer(tmp_path / "warehouse", env={"ISBRE_EVENTS_RING_SIZE": "8"}).start()
    yield running
    running.stop()


def paused_while_committing(
    server: IsbreServer, commits: int, after_commits: Callable[[], None] = lambda: None
) -> tuple[list[int], dict[str, Any] | None]:
    """Open a stream from 0, read nothing while `commits` namespaces are created (and then
    `after_commits()` runs), then read: the ids received and the error the stream ended with."""
    base = f"{server.url}/v1/isbre"
    with http.stream("GET", f"{server.url}/v1/events", params={"after": 0}, timeout=60) as response:
        lines = response.iter_lines()
        with httpx.Client(timeout=60) as client:
            for i in range(commits):
                client.post(f"{base}/namespaces", json={"namespace": [f"p{i}"]}).raise_for_status()
        after_commits()
        seqs, error = [], None
        for line in lines:
            if line.startswith("id: "):
                seqs.append(int(line[4:]))
                if seqs[-1] == commits:
                    break
            elif line.startswith("data: ") and '"error"' in line:
                error = json.loads(line[6:])["error"]
    return seqs, error


def test_a_paused_subscriber_misses_nothing(small_ring: IsbreServer) -> None:
    """Many more commits than the live ring holds land while the subscriber reads nothing.

    (Socket buffers may absorb part of the stream; test_broadcast.py pins the fall-back to the
    log in-process, where a paused subscriber is exactly one that is not iterated.) A stream
    that ends, with an error frame or without, fails the test with what it said.
    """
    seqs, error = paused_while_committing(small_ring, 300)
    assert seqs == list(range(1, 301)), f"the stream ended after {seqs[-1:]}: {error}"


def test_a_subscriber_slower_than_retention_is_told_why_its_stream_ends(short_memory: IsbreServer) -> None:
    """With retention of 5 records, a paused subscriber's records are trimmed before it reads them:
    the stream ends with the 410 error frame, never silently."""

    def trimmed() -> None:
        cursor = f"{short_memory.url}/v1/events/cursor"
        eventually(lambda: http.get(cursor).json()["oldest_commit_seq"] >= 290, "the log trimmed")

    seqs, error = paused_while_committing(short_memory, 300, trimmed)
    assert seqs == list(range(1, len(seqs) + 1)), "a gap without an error"
    if seqs[-1:] != [300]:
        assert error is not None and error["code"] == 410, f"the stream ended silently after {seqs[-1:]}"


def test_client_survives_a_server_restart(tmp_path: Path) -> None:
    server = IsbreServer(tmp_path / "warehouse").start()
    cursor_file = tmp_path / "cursor"
    collector = Collector(server.url, after=0, cursor_file=cursor_file, max_delay=0.5)
    base = f"{server.url}/v1/isbre"
    for i in range(5):
        http.post(f"{base}/namespaces", json={"namespace": [f"before{i}"]}).raise_for_status()
    collector.wait_for(5)
    server.stop()
    restarted = IsbreServer(server.warehouse, port=server.port).start()
    try:
        for i in range(5):
            http.post(f"{base}/namespaces", json={"namespace": [f"after{i}"]}).raise_for_status()
        events = collector.wait_for(10)
        assert [e.commit_seq for e in events] == list(range(1, 11))
        assert [e.record["namespace"][0] for e in events[5:]] == [f"after{i}" for i in range(5)]
        collector.stop()
        eventually(lambda: int(cursor_file.read_text()) == 10, "the cursor file at the last event", 5)
        # A consumer started later resumes after the cursor its predecessor left on disk.
        resumed = Collector(restarted.url, cursor_file=cursor_file)
        http.post(f"{base}/namespaces", json={"namespace": ["late"]}).raise_for_status()
        assert [e.commit_seq for e in resumed.wait_for(11)] == [11]
    finally:
        restarted.stop()


def test_async_client_follows_too(server: IsbreServer, tables: str) -> None:
    start = server.high_water()

    async def scenario() -> list[int]:
        seqs = []
        async for event in subscribe(server.url, after=start, tables=[f"{tables}.t2"]):
            seqs.append(event.commit_seq)
            if len(seqs) == 3:
                return seqs
        return seqs

    async def with_writes() -> list[int]:
        reader = asyncio.ensure_future(scenario())
        await asyncio.to_thread(run_writers, server, tables, 4, 3)  # writers 2 and 6 commit to t2
        return await asyncio.wait_for(reader, 30)

    seqs = asyncio.run(with_writes())
    assert seqs == sorted(seqs) and len(set(seqs)) == 3 and seqs[0] > start


def test_events_tail_prints_json_lines(server: IsbreServer, tables: str) -> None:
    start = server.high_water()
    tail = zygote.popen(
        [
            sys.executable,
            "-m",
            "isbre.rest.cli",
            "events",
            "tail",
            "--url",
            server.url,
            "--after",
            str(start),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        run_writers(server, tables, writers=1, commits=3)
        lines = [json.loads(tail.stdout.readline()) for _ in range(3)]
    finally:
        tail.terminate()
        tail.wait(10)
    assert [line["commit_seq"] for line in lines] == [start + 1, start + 2, start + 3]
    assert {line["kind"] for line in lines} == {"table.commit"}


def test_pull_from_a_point_in_time(server: IsbreServer, tables: str) -> None:
    with httpx.Client() as client:
        commit(client, server, tables, "t0", "before")
        time.sleep(0.05)
        since_ms = int(time.time() * 1000)
        time.sleep(0.05)
        commit(client, server, tables, "t0", "after")
    page = http.post(
        f"{server.url}/v1/isbre/events", json={"since-timestamp-ms": since_ms, "page-size": 50}
    ).json()
    assert len(page["events"]) == 1
    assert page["events"][0]["timestamp-ms"] >= since_ms
    assert page["events"][0]["event-id"] == str(server.high_water())


def test_streams_are_served_where_configured(server: IsbreServer) -> None:
    in_process = server.env.get("ISBRE_EVENTS_PROCESS") == "false"
    health = events_health(server)
    assert ("process" not in health) if in_process else health["process"] != server.pid
    assert health["status"] == "ok"


def test_a_stream_on_a_kept_alive_connection(server: IsbreServer, request: pytest.FixtureRequest) -> None:
    """A client that reuses its connection for the stream gets it there, and its next request works."""
    with httpx.Client(timeout=30) as client:
        config = client.get(f"{server.url}/v1/config")
        start = server.high_water()
        http.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": [f"kept{start}"]})
        with client.stream("GET", f"{server.url}/v1/events", params={"after": start}) as response:
            port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
            assert port == config.extensions["network_stream"].get_extra_info("client_addr")[1]
            handed_over = request.node.callspec.params["server"] != "in-process"
            assert ("server" not in response.headers) == handed_over, "written by the other process"
            ids = (line for line in response.iter_lines() if line.startswith("id: "))
            assert next(ids) == f"id: {start + 1}"
        assert client.get(f"{server.url}/v1/config").status_code == 200
    assert "ASGI callable returned without" not in server.log(), "the server answered a handed-over request"


def test_an_http_1_0_stream(server: IsbreServer) -> None:
    """An HTTP/1.0 request is not handed over: the server's process (uvicorn) answers it."""
    start = server.high_water()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(f"GET /v1/events?after={start} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        http.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": [f"old{start}"]})
        received = b""
        while f"id: {start + 1}\n".encode() not in received:
            chunk = sock.recv(1 << 16)
            assert chunk, f"the stream ended early: {received!r}"
            received += chunk
    head = received.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 200") and b"text/event-stream" in head
    assert b"\r\nserver: uvicorn" in head


def test_a_killed_fanout_process_is_replaced_and_subscribers_miss_nothing(tmp_path: Path) -> None:
    server = IsbreServer(tmp_path / "warehouse").start()
    base = f"{server.url}/v1/isbre"
    try:
        collector = Collector(server.url, after=0, max_delay=0.5)
        for i in range(5):
            http.post(f"{base}/namespaces", json={"namespace": [f"before{i}"]}).raise_for_status()
        collector.wait_for(5)
        killed = events_health(server)["process"]
        # The replacement inherits a low soft limit on open files, and raises it: one per subscriber.
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.prlimit(server.process.pid, resource.RLIMIT_NOFILE, (256, hard))
        with http.stream("GET", f"{server.url}/v1/events", timeout=30) as response:
            lines = response.iter_lines()
            next(lines)  # open, and (the kill shows) served by that process: the kill cuts it
            os.kill(killed, signal.SIGKILL)
            with pytest.raises(httpx.RemoteProtocolError):
                list(lines)
        for i in range(5):  # commits go on while the streams have no process
            http.post(f"{base}/namespaces", json={"namespace": [f"during{i}"]}).raise_for_status()
        assert [e.commit_seq for e in collector.wait_for(10)] == list(range(1, 11))

        def replaced_and_ok() -> dict:
            health = events_health(server)
            return health if health["process"] not in (None, killed) and health["status"] == "ok" else {}

        health = eventually(replaced_and_ok, "the fan-out process replaced", timeout=15)
        http.post(f"{base}/namespaces", json={"namespace": ["after"]}).raise_for_status()
        assert [e.commit_seq for e in collector.wait_for(11)] == list(range(1, 12))

        def open_files_limits() -> list[str]:
            limits = Path(f"/proc/{health['process']}/limits").read_text().splitlines()
            return next(line for line in limits if line.startswith("Max open files")).split()[3:5]

        eventually(lambda: open_files_limits() == [str(hard), str(hard)], "its open files limit raised", 15)
        assert "until it restarts in 1 s" in server.log()
        # Killed again soon after: the next restart waits twice as long.
        replaced = health["process"]
        os.kill(replaced, signal.SIGKILL)
        killed_at = time.monotonic()
        eventually(
            lambda: events_health(server)["process"] not in (None, replaced),
            "the fan-out process replaced again",
            timeout=15,
        )
        assert time.monotonic() - killed_at >= 2.0
        assert "until it restarts in 2 s" in server.log()
    finally:
        server.stop()


def test_the_fanout_process_starts_with_the_first_stream_and_ends_with_the_server(tmp_path: Path) -> None:
    server = IsbreServer(tmp_path / "warehouse").start()
    assert events_health(server) == {"status": "ok", "streams": 0, "process": None}  # nobody streams
    with http.stream("GET", f"{server.url}/v1/events", timeout=30) as response:
        next(response.iter_lines())
        fanout = events_health(server)["process"]
        assert fanout is not None and psutil.Process(fanout).ppid() == server.pid
    server.kill()

    def running() -> bool:
        try:  # an orphan may stay a zombie until something reaps it: that is ended, too
            return "zombie" not in Path(f"/proc/{fanout}/status").read_text()
        except FileNotFoundError:
            return False

    eventually(lambda: not running(), "the fan-out process gone with its server", timeout=10)
