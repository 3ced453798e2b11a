"""Every resource a client can make the server spend is bounded: bodies, headers, connections,
metadata and property sizes, the event ring."""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from isbre.catalog.records import CommitRecord
from isbre.catalog.warehouses import open_catalog
from isbre.events.broadcast import Broadcaster
from isbre.rest.auth import sha256_hex

from tests.http_client import http
from tests.server import ID_SCHEMA, IsbreServer, secured_server

P = "/v1/isbre"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    principals = [{"name": "root", "roles": ["admin"], "token_sha256": sha256_hex("root")}]
    server = secured_server(
        tmp_path_factory.mktemp("guarded") / "warehouse",
        principals,
        ISBRE_HEADER_TIMEOUT_SECONDS="2",
        ISBRE_MAX_PROPERTY_VALUE_KB="16",
        ISBRE_MAX_METADATA_MB="0.25",
        process=True,  # its descriptors, its memory and its log are read
    )
    yield server
    server.stop()


ROOT = {"Authorization": "Bearer root"}


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def raw_request(server: IsbreServer, head: bytes, body: bytes = b"", timeout: float = 10) -> bytes:
    """Send a request as bytes (some of which the server may refuse to read) and return its answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        try:
            sock.sendall(head)
            view = memoryview(body)
            while view:
                view = view[sock.send(view[: 1 << 16]) :]
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it was all sent
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
                head_end = answer.find(b"\r\n\r\n")
                if head_end >= 0:
                    fields = answer[:head_end].lower().split(b"\r\n")
                    length = next(
                        (int(f.split(b":")[1]) for f in fields if f.startswith(b"content-length:")), 0
                    )
                    if len(answer) >= head_end + 4 + length:
                        break
        except ConnectionResetError:
            pass
        return answer


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


def test_a_large_body_to_the_token_endpoint_is_413_without_being_read(guarded: IsbreServer) -> None:
    assert guarded.process is not None
    before = rss_kb(guarded.process.pid)
    size = 10 << 20
    head = (
        b"POST /v1/oauth/tokens HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: "
        + str(size).encode()
        + b"\r\n\r\n"
    )
    assert status_of(raw_request(guarded, head, b"a" * size)) == 413
    chunked = (
        b"POST /v1/oauth/tokens HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    body = b"".join(b"10000\r\n" + b"a" * 0x10000 + b"\r\n" for _ in range(160)) + b"0\r\n\r\n"
    assert status_of(raw_request(guarded, chunked, body)) == 413
    assert rss_kb(guarded.process.pid) - before < 50 * 1024


def test_bodies_are_bounded_on_every_route(guarded: IsbreServer) -> None:
    for path in (f"{P}/events", f"{P}/namespaces", f"{P}/transactions/commit"):
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer root\r\n"
            f"Content-Type: application/json\r\nContent-Length: {33 << 20}\r\n\r\n"
        ).encode()
        answer = raw_request(guarded, head, b" " * (1 << 20))
        assert status_of(answer) == 413, answer[:300]
        assert b"RequestEntityTooLargeException" in answer


def test_oversized_headers_are_431(guarded: IsbreServer) -> None:
    huge = b"Bearer " + b"x" * (100 << 10)
    answer = raw_request(
        guarded, b"GET /v1/config HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + huge + b"\r\n\r\n"
    )
    assert status_of(answer) == 431
    long_url = b"GET /v1/config?" + b"a" * (100 << 10) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    assert status_of(raw_request(guarded, long_url)) == 431
    assert http.get(f"{guarded.url}/v1/config", headers=ROOT).status_code == 200


def test_idle_connections_neither_starve_requests_nor_stay(guarded: IsbreServer) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    idle = []
    try:
        for _ in range(2000):
            idle.append(socket.create_connection(("127.0.0.1", guarded.port)))
        idle[0].sendall(b"GET /v1/con")  # and one that never finishes its request line
        answer = http.get(f"{guarded.url}/v1/config", headers=ROOT, timeout=5)
        assert answer.status_code == 200
        # The header timeout (2 s here) closes connections that never sent a whole request.
        deadline = time.monotonic() + 20
        for sock in (idle[0], idle[-1]):
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            assert sock.recv(1) == b"", "an idle connection stayed open past the header timeout"
    finally:
        for sock in idle:
            sock.close()


def test_the_server_raises_its_open_files_limit(guarded: IsbreServer) -> None:
    assert guarded.process is not None
    limits = Path(f"/proc/{guarded.process.pid}/limits").read_text()
    line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    assert soft == hard
    assert "open files" in guarded.log()


def test_property_values_and_metadata_have_ceilings(guarded: IsbreServer) -> None:
    http.post(f"{guarded.url}{P}/namespaces", json={"namespace": ["big"]}, headers=ROOT).raise_for_status()
    tables = f"{guarded.url}{P}/namespaces/big/tables"
    huge = {"p": "x" * (17 << 10)}
    refused = http.post(tables, json={"name": "t", "schema": ID_SCHEMA, "properties": huge}, headers=ROOT)
    assert refused.status_code == 400 and "max_property_value_kb" in refused.text, refused.text
    namespace = http.post(f"{guarded.url}{P}/namespaces/big/properties", json={"updates": huge}, headers=ROOT)
    assert namespace.status_code == 400 and "max_property_value_kb" in namespace.text
    http.post(tables, json={"name": "t", "schema": ID_SCHEMA}, headers=ROOT).raise_for_status()
    grown = http.post(
        f"{tables}/t", json={"updates": [{"action": "set-properties", "updates": huge}]}, headers=ROOT
    )
    assert grown.status_code == 400, grown.text
    # Many values under the per-value limit still make metadata over its ceiling (0.25 MB here).
    many = {f"p{i}": "x" * (15 << 10) for i in range(20)}
    too_big = http.post(
        f"{tables}/t", json={"updates": [{"action": "set-properties", "updates": many}]}, headers=ROOT
    )
    assert too_big.status_code == 413 and "max_metadata_mb" in too_big.text, too_big.text
    assert http.get(f"{tables}/t", headers=ROOT).json()["metadata"]["properties"].get("p0") is None


def test_the_event_ring_is_bounded_in_bytes(tmp_path: Path) -> None:
    service = open_catalog(tmp_path / "wh")
    try:
        broadcaster = Broadcaster(service.core.commit_log, capacity=4096, max_bytes=256 << 10)
        for i in range(50):
            properties = {"blob": "x" * (20 << 10), "i": str(i)}
            service.namespaces.create((f"n{i}",), properties)
        held = broadcaster.since(service.core.commit_log.commit_seq() - 1)
        assert held is not None and len(held) == 1
        assert broadcaster.ring_bytes <= 256 << 10
        assert broadcaster.since(0) is None  # older records are read from the log instead
        assert [r.commit_seq for r in service.core.commit_log.commits_since(0, 100)] == list(range(1, 51))
        assert isinstance(service.core.commit_log.commits_since(0, 1)[0], CommitRecord)
        broadcaster.close()
    finally:
        service.close()


def test_deeply_nested_json_is_400_with_authentication_on(guarded: IsbreServer) -> None:
    nested = "[" * 100_000 + "]" * 100_000
    for path in ("namespaces", "transactions/commit", "events"):
        answer = http.post(
            f"{guarded.url}{P}/{path}", content=nested, headers=ROOT | {"Content-Type": "application/json"}
        )
        assert answer.status_code == 400, (path, answer.text[:300])
