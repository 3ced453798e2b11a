"""What a hostile or careless client sends: refused with the right error, never a 500, never a change."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pydantic
import pytest
from isbre.rest.auth import sha256_hex
from isbre.rest.settings import AuthSettings

from tests.http_client import http
from tests.lineage_receiver import Receiver
from tests.server import ID_SCHEMA, IsbreServer, secured_server
from tests.waiting import eventually

P = "/v1/isbre"


# -- safe defaults without authentication


def test_a_body_that_is_not_json_is_415_and_changes_nothing(server: IsbreServer) -> None:
    url = f"{server.url}{P}/namespaces"
    body = json.dumps({"namespace": ["from_a_web_page"]})
    for content_type in (
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
    ):
        headers = {"Content-Type": content_type} if content_type else {}
        answer = http.post(url, content=body, headers=headers)
        assert answer.status_code == 415, (content_type, answer.text)
        assert answer.json()["error"]["type"] == "UnsupportedMediaTypeException"
    assert http.head(f"{url}/from_a_web_page").status_code == 404
    ok = http.post(url, content=body, headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


def test_a_foreign_host_header_is_refused_without_auth(server: IsbreServer, namespace: str) -> None:
    url = f"{server.url}{P}/namespaces/{namespace}"
    refused = http.delete(url, headers={"Host": "rebind.evil.example"})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["type"] == "BadRequestException"
    assert http.head(url).status_code == 204
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", "localhost"):
        assert http.get(url, headers={"Host": host}).status_code == 200


def raw_request(server: IsbreServer, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_two_host_headers_are_refused(server: IsbreServer, namespace: str) -> None:
    """Judged on one and acted on by another is no judgement: a request names one host."""
    path = f"{P}/namespaces/{namespace}".encode()
    for hosts in (
        (b"localhost", b"rebind.evil.example"),
        (b"rebind.evil.example", b"localhost"),
        (b"localhost",) * 2,
    ):
        head = b"DELETE " + path + b" HTTP/1.1\r\n" + b"".join(b"Host: %s\r\n" % host for host in hosts)
        answer = raw_request(server, head + b"Connection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
        assert b"one Host header" in answer
    assert http.head(f"{server.url}{P}/namespaces/{namespace}").status_code == 204


# -- client input is never a 500


@pytest.mark.parametrize(
    "name",
    ["x" * 220, "x" * 255, "é" * 120, "表" * 80, "😀" * 60],
    ids=["220-bytes", "255-bytes", "240-bytes-accented", "240-bytes-cjk", "240-bytes-emoji"],
)
def test_long_and_multibyte_names_are_400_not_500(server: IsbreServer, namespace: str, name: str) -> None:
    tables = f"{server.url}{P}/namespaces/{namespace}/tables"
    answer = http.post(tables, json={"name": name, "schema": ID_SCHEMA})
    assert answer.status_code == 400, answer.text
    assert "bytes" in answer.json()["error"]["message"]
    assert http.get(tables).json()["identifiers"] == []


def test_multibyte_names_within_the_limit_work(server: IsbreServer, namespace: str) -> None:
    tables = f"{server.url}{P}/namespaces/{namespace}/tables"
    name = "表" * 40  # 120 bytes
    assert http.post(tables, json={"name": name, "schema": ID_SCHEMA}).status_code == 200
    assert http.get(f"{tables}/{name}").status_code == 200


def test_namespaces_too_long_for_a_store_key_are_400(server: IsbreServer) -> None:
    levels = ["n" * 200] * 3  # 602 bytes with separators: over LMDB's 511-byte keys
    answer = http.post(f"{server.url}{P}/namespaces", json={"namespace": levels})
    assert answer.status_code == 400, answer.text
    assert http.get(f"{server.url}{P}/namespaces/{'%1F'.join(levels)}").status_code == 400


@pytest.mark.parametrize(
    "changes",
    [
        {"requirements": [{"type": "assert-create"}], "updates": []},
        {
            "requirements": [{"type": "assert-create"}],
            "updates": [{"action": "assign-uuid", "uuid": "2d1f0b5e-6c1c-4d2e-8f0a-1b2c3d4e5f60"}],
        },
        {
            "requirements": [{"type": "assert-create"}],
            "updates": [{"action": "upgrade-format-version", "format-version": 2}],
        },
    ],
    ids=["nothing", "uuid-only", "format-only"],
)
def test_an_incomplete_create_by_updates_is_400(server: IsbreServer, namespace: str, changes: dict) -> None:
    answer = http.post(f"{server.url}{P}/namespaces/{namespace}/tables/half", json=changes)
    assert answer.status_code == 400, answer.text
    assert http.head(f"{server.url}{P}/namespaces/{namespace}/tables/half").status_code == 404


def b64(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


@pytest.mark.parametrize(
    "token",
    [b64({"a": 1}), b64(5), b64([1, [2]]), b64(None), b64("x" * 600), "%%%", "AAAA", b64(["a"] * 40)],
)
def test_crafted_page_tokens_are_400(server: IsbreServer, namespace: str, token: str) -> None:
    for path in ("namespaces", f"namespaces/{namespace}/tables", f"namespaces/{namespace}/views"):
        answer = http.get(f"{server.url}{P}/{path}", params={"pageToken": token})
        assert answer.status_code in (200, 400), (path, token, answer.text)
        if answer.status_code == 200:
            assert answer.json()  # a token that happens to be a valid position


def test_deeply_nested_json_is_400(server: IsbreServer, namespace: str) -> None:
    nested = "[" * 100_000 + "]" * 100_000
    for path in ("namespaces", f"namespaces/{namespace}/tables/t", "transactions/commit", "events"):
        answer = http.post(
            f"{server.url}{P}/{path}", content=nested, headers={"Content-Type": "application/json"}
        )
        assert answer.status_code == 400, (path, answer.text[:300])


# -- small ones


def test_two_principals_with_one_name_are_refused_at_load() -> None:
    twice = [
        {"name": "etl", "roles": ["writer"], "token_sha256": sha256_hex("a")},
        {"name": "etl", "roles": ["admin"], "token_sha256": sha256_hex("b")},
    ]
    with pytest.raises(pydantic.ValidationError, match="etl"):
        AuthSettings(enabled=True, principals=twice)
    same_client = [
        {"name": "a", "roles": ["reader"], "client_id": "c", "secret_sha256": sha256_hex("a")},
        {"name": "b", "roles": ["admin"], "client_id": "c", "secret_sha256": sha256_hex("b")},
    ]
    with pytest.raises(pydantic.ValidationError, match="client_id"):
        AuthSettings(enabled=True, principals=same_client)


def test_the_lineage_api_key_never_appears_in_a_command_line(tmp_path: Path) -> None:
    receiver = Receiver().start()
    env = {"ISBRE_LINEAGE_URL": receiver.url, "ISBRE_LINEAGE_API_KEY": "very-secret-key"}
    server = IsbreServer(tmp_path / "warehouse", env=env).start()
    try:
        http.post(f"{server.url}{P}/namespaces", json={"namespace": ["db"]}).raise_for_status()
        http.post(
            f"{server.url}{P}/namespaces/db/tables", json={"name": "t", "schema": ID_SCHEMA}
        ).raise_for_status()
        eventually(lambda: len(receiver.snapshot()) >= 2, "two lineage events delivered")
        assert receiver.authorizations == {"Bearer very-secret-key"}
        listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert "very-secret-key" not in listing
        assert all(
            b"very-secret-key" not in p.read_bytes()
            for p in Path("/proc").glob("[0-9]*/cmdline")
            if _readable(p)
        )
    finally:
        server.stop()
        receiver.stop()


def _readable(path: Path) -> bool:
    try:
        path.read_bytes()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module", params=["true", "false"], ids=["fan-out process", "in process"])
def short_tokens(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[IsbreServer]:
    principals = [
        {"name": "bi", "roles": ["reader"], "client_id": "bi", "secret_sha256": sha256_hex("bi-secret")}
    ]
    server = secured_server(
        tmp_path_factory.mktemp("short") / "warehouse",
        principals,
        ISBRE_AUTH__TOKEN_TTL_SECONDS="3",
        ISBRE_EVENTS_PROCESS=request.param,
    )
    yield server
    server.stop()


def token(server: IsbreServer, secret: str) -> httpx.Response:
    form = {"grant_type": "client_credentials", "client_id": "bi", "client_secret": secret}
    return http.post(f"{server.url}/v1/oauth/tokens", data=form)


def test_an_event_stream_ends_when_its_token_expires(short_tokens: IsbreServer) -> None:
    access = token(short_tokens, "bi-secret").json()["access_token"]
    headers = {"Authorization": f"Bearer {access}"}
    started = time.monotonic()
    lines = []
    with http.stream("GET", f"{short_tokens.url}{P}/events", headers=headers, timeout=30) as stream:
        for line in stream.iter_lines():
            lines.append(line)
    elapsed = time.monotonic() - started
    assert elapsed < 15, "the stream outlived its token"
    assert "event: error" in lines
    frame = json.loads(next(line[6:] for line in lines if line.startswith("data: ")))
    assert frame["error"]["type"] == "NotAuthorizedException"
    assert "reconnect" in frame["error"]["message"]


def test_repeated_failures_at_the_token_endpoint_are_429(short_tokens: IsbreServer) -> None:
    answers = [token(short_tokens, "wrong").status_code for _ in range(12)]
    assert answers[0] == 401
    assert 429 in answers
    limited = token(short_tokens, "wrong")
    assert limited.status_code == 429
    assert int(limited.headers["retry-after"]) >= 1
