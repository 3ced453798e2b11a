"""Authentication and authorization against a real server with [auth] on."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from isbre.catalog.sink_rows import ROWS_PROPERTY
from isbre.rest.auth import sha256_hex
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import ForbiddenError, OAuthError, UnauthorizedError

from tests import duck, zygote
from tests.http_client import http
from tests.server import IsbreServer, free_port, secured_server, sse_records, start_threads

ID_SCHEMA_ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False)])

PRINCIPALS = [
    {"name": "admin", "client_id": "admin", "secret_sha256": sha256_hex("admin-secret"), "roles": ["admin"]},
    {"name": "etl", "client_id": "etl", "secret_sha256": sha256_hex("etl-secret"), "roles": ["writer"]},
    {
        "name": "analyst",
        "client_id": "bi",
        "secret_sha256": sha256_hex("bi-secret"),
        "roles": ["reader"],
        "namespaces": ["sales"],
    },
    {"name": "dashboard", "token_sha256": sha256_hex("static-dashboard-token"), "roles": ["reader"]},
]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    server = secured_server(tmp_path_factory.mktemp("secured") / "warehouse", PRINCIPALS)
    yield server
    server.stop()


def catalog(server: IsbreServer, credential: str) -> RestCatalog:
    return RestCatalog("isbre", uri=server.url, credential=credential)


def token(server: IsbreServer, client_id: str, secret: str) -> httpx.Response:
    form = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}
    return http.post(f"{server.url}/v1/oauth/tokens", data=form)


def test_pyiceberg_with_credential_works_end_to_end(secured: IsbreServer) -> None:
    admin = catalog(secured, "admin:admin-secret")
    admin.create_namespace("sales")
    admin.create_namespace("hr")
    etl = catalog(secured, "etl:etl-secret")
    table = etl.create_table("sales.orders", schema=pa.schema([pa.field("n", pa.int64())]))
    table.append(pa.table({"n": pa.array([1, 2, 3], pa.int64())}))
    assert catalog(secured, "bi:bi-secret").load_table("sales.orders").scan().to_arrow().num_rows == 3


def test_commit_records_name_the_principal_that_asked(secured: IsbreServer) -> None:
    before = secured.high_water("static-dashboard-token")
    catalog(secured, "admin:admin-secret").create_namespace("audited")
    table = catalog(secured, "etl:etl-secret").create_table("audited.t", schema=ID_SCHEMA_ARROW)
    with table.transaction() as txn:
        txn.set_properties(owner="etl")
    headers = {"Authorization": "Bearer static-dashboard-token"}
    records = sse_records(secured, before + 3, headers, after=before)
    assert [(r["kind"], r["actor"]) for r in records] == [
        ("namespace.create", "admin"),
        ("table.create", "etl"),
        ("table.commit", "etl"),
    ]


def test_wrong_or_missing_credentials_are_401(secured: IsbreServer) -> None:
    refused = token(secured, "etl", "wrong")
    assert refused.status_code == 401
    assert refused.json()["error"] == "invalid_client"
    with pytest.raises((OAuthError, UnauthorizedError)):
        catalog(secured, "etl:wrong")
    anonymous = http.get(f"{secured.url}/v1/isbre/namespaces")
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert anonymous.json()["error"]["type"] == "NotAuthorizedException"
    forged = http.get(
        f"{secured.url}/v1/isbre/namespaces", headers={"Authorization": "Bearer eyJzdWIiOiJhZG1pbiJ9.x"}
    )
    assert forged.status_code == 401
    assert http.get(f"{secured.url}/live").status_code == 200  # probes stay open


def test_roles_decide_what_a_principal_may_do(secured: IsbreServer) -> None:
    reader = catalog(secured, "bi:bi-secret")
    with pytest.raises(ForbiddenError):
        reader.create_table("sales.blocked", schema=ID_SCHEMA_ARROW)
    table = reader.load_table("sales.orders")
    with pytest.raises(ForbiddenError):
        table.append(pa.table({"n": pa.array([9], pa.int64())}))
    writer = catalog(secured, "etl:etl-secret")
    with pytest.raises(ForbiddenError):
        writer.drop_table("sales.orders")  # drops are for admins
    with pytest.raises(ForbiddenError):
        writer.create_namespace("ops")
    assert catalog(secured, "admin:admin-secret").table_exists("sales.orders")


def test_namespace_scopes_hold_for_requests_and_events(secured: IsbreServer) -> None:
    admin = catalog(secured, "admin:admin-secret")
    admin.create_table("hr.salaries", schema=ID_SCHEMA_ARROW)
    reader_token = token(secured, "bi", "bi-secret").json()["access_token"]
    headers = {"Authorization": f"Bearer {reader_token}"}
    assert (
        http.get(f"{secured.url}/v1/isbre/namespaces/hr/tables/salaries", headers=headers).status_code == 403
    )
    assert (
        http.get(f"{secured.url}/v1/isbre/namespaces/sales/tables/orders", headers=headers).status_code == 200
    )

    high = http.get(f"{secured.url}/v1/events/cursor", headers=headers).json()["commit_seq"]
    admin_token = token(secured, "admin", "admin-secret").json()["access_token"]
    everything = sse_namespaces(secured, admin_token, until=high)
    seen = sse_namespaces(secured, reader_token, until=high, last_visible=True)
    assert "hr" in everything and "sales" in everything
    assert seen == {"sales"}, f"the analyst saw {seen}"
    pulled = http.post(f"{secured.url}/v1/isbre/events", json={"page-size": 1000}, headers=headers).json()
    top_levels = {
        (e["operation"].get("namespace") or e["operation"]["identifier"]["namespace"])[0]
        for e in pulled["events"]
    }
    assert top_levels == {"sales"}


def sse_namespaces(server: IsbreServer, bearer: str, until: int, last_visible: bool = False) -> set[str]:
    """Namespaces of the records an SSE subscriber gets from the start of the log up to `until`."""
    seen: set[str] = set()
    params = {"after": 0}
    with http.stream(
        "GET",
        f"{server.url}/v1/events",
        params=params,
        headers={"Authorization": f"Bearer {bearer}"},
        timeout=10,
    ) as response:
        assert response.status_code == 200
        try:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    record = json.loads(line[6:])
                    seen.add(record["namespace"][0])
                    if record["commit_seq"] >= until or (last_visible and record["kind"] == "table.commit"):
                        break
        except httpx.ReadTimeout:
            pass  # a filtered stream has nothing more to say: what was seen is the answer
    return seen


def test_a_token_request_waiting_on_the_failure_count_holds_up_no_other(secured: IsbreServer) -> None:
    """The failed-login count is a file all of a server's workers share: a token request that waits
    on its lock must not hold up the server's other requests."""
    (counts,) = Path(secured.warehouse).parent.rglob("failed-logins.sqlite3")
    bearer = {"Authorization": f"Bearer {token(secured, 'admin', 'admin-secret').json()['access_token']}"}
    answers: list[int] = []

    def guess(client_id: str) -> None:
        answers.append(token(secured, client_id, "wrong").status_code)

    holder = sqlite3.connect(counts, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # as another worker's count of a failure holds it
        waiting = start_threads(guess, ["a-guess"])
        time.sleep(1.0)  # time for the guess to reach the lock: nothing here says it has
        assert not answers, "the token request did not wait on the lock"
        # Answered while the lock is still held: a request held up behind it would not be.
        config = http.get(f"{secured.url}/v1/config", headers=bearer, timeout=30)
        assert config.status_code == 200
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    for thread in waiting:
        thread.join()
    assert answers == [401]


def test_static_tokens_work(secured: IsbreServer) -> None:
    headers = {"Authorization": "Bearer static-dashboard-token"}
    assert http.get(f"{secured.url}/v1/isbre/namespaces", headers=headers).status_code == 200
    assert (
        http.post(
            f"{secured.url}/v1/isbre/namespaces", json={"namespace": ["x"]}, headers=headers
        ).status_code
        == 403
    )


def test_refuses_a_public_bind_without_auth(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "isbre.rest.cli",
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        str(free_port()),
    ]
    result = zygote.run([*command, "--warehouse", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "refusing to serve 0.0.0.0 with authentication off" in result.stderr


def test_client_credentials_in_http_basic(secured: IsbreServer) -> None:
    """RFC 6749 2.3.1: a server must accept client credentials in the Authorization header."""
    response = http.post(
        f"{secured.url}/v1/oauth/tokens",
        data={"grant_type": "client_credentials"},
        auth=("etl", "etl-secret"),
    )
    assert response.status_code == 200, response.text
    assert response.json()["token_type"] == "bearer"
    wrong = http.post(
        f"{secured.url}/v1/oauth/tokens", data={"grant_type": "client_credentials"}, auth=("etl", "x")
    )
    assert wrong.status_code == 401


def test_duckdb_with_credentials(secured: IsbreServer, tmp_path: Path) -> None:
    catalog(secured, "admin:admin-secret").create_namespace_if_not_exists("sales")
    con = duck.connect(tmp_path)
    con.execute(
        "CREATE SECRET lake_secret (TYPE iceberg, CLIENT_ID 'admin', CLIENT_SECRET 'admin-secret', "
        f"OAUTH2_SERVER_URI '{secured.url}/v1/oauth/tokens')"
    )
    con.execute(f"ATTACH 'isbre' AS lake (TYPE iceberg, ENDPOINT '{secured.url}', SECRET lake_secret)")
    con.execute("CREATE TABLE lake.sales.from_duckdb (x INTEGER)")
    con.execute("INSERT INTO lake.sales.from_duckdb VALUES (1), (2)")
    assert con.execute("SELECT count(*) FROM lake.sales.from_duckdb").fetchall() == [(2,)]
    con.close()


def test_a_reader_may_report_scan_metrics(secured: IsbreServer) -> None:
    reader_token = token(secured, "bi", "bi-secret").json()["access_token"]
    report = {
        "report-type": "scan-report",
        "table-name": "sales.orders",
        "snapshot-id": 1,
        "filter": True,
        "schema-id": 0,
        "projected-field-ids": [1],
        "projected-field-names": ["n"],
        "metrics": {},
    }
    response = http.post(
        f"{secured.url}/v1/isbre/namespaces/sales/tables/orders/metrics",
        json=report,
        headers={"Authorization": f"Bearer {reader_token}"},
    )
    assert response.status_code == 204, response.text


def test_a_scoped_reader_cannot_list_other_namespaces_children(secured: IsbreServer) -> None:
    reader_token = token(secured, "bi", "bi-secret").json()["access_token"]
    headers = {"Authorization": f"Bearer {reader_token}"}
    refused = http.get(f"{secured.url}/v1/isbre/namespaces", params={"parent": "hr"}, headers=headers)
    assert refused.status_code == 403
    assert (
        http.get(
            f"{secured.url}/v1/isbre/namespaces", params={"parent": "sales"}, headers=headers
        ).status_code
        == 200
    )


def test_the_body_limit_holds_before_authorization_reads_the_body(tmp_path: Path) -> None:
    server = secured_server(tmp_path / "warehouse", PRINCIPALS, ISBRE_MAX_BODY_MB="0.01")
    try:
        admin_token = token(server, "admin", "admin-secret").json()["access_token"]
        response = http.post(
            f"{server.url}/v1/isbre/namespaces",
            content=b'{"namespace": ["x"], "properties": {"p": "' + b"y" * 50_000 + b'"}}',
            headers={"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"},
        )
        assert response.status_code == 413
        assert response.json()["error"]["type"] == "RequestEntityTooLargeException"
    finally:
        server.stop()


def test_health_tells_the_unauthenticated_only_statuses(secured: IsbreServer) -> None:
    admin = token(secured, "admin", "admin-secret").json()["access_token"]
    reader = token(secured, "bi", "bi-secret").json()["access_token"]
    for headers in ({}, {"Authorization": f"Bearer {reader}"}, {"Authorization": "Bearer forged"}):
        body = http.get(f"{secured.url}/health", headers=headers).json()
        assert set(body) == {"status", "components"}
        assert all(set(part) == {"status"} for part in body["components"].values()), body
        text = json.dumps(body)
        assert str(secured.warehouse) not in text and "isbre.lmdb" not in text
    full = http.get(f"{secured.url}/health", headers={"Authorization": f"Bearer {admin}"}).json()
    assert "process" in full and "path" in json.dumps(full["components"]["store"])


def test_public_metrics_name_no_sink_table(secured: IsbreServer) -> None:
    """/metrics answers without a token: with authentication on, it names no table, by name or by
    uuid (the catalog keeps each table's state under its uuid)."""
    admin = catalog(secured, "admin:admin-secret")
    admin.create_namespace_if_not_exists("secret_ns")
    table = admin.create_table("secret_ns.payroll", schema=pa.schema([pa.field("n", pa.int64())]))
    table.append(pa.table({"n": pa.array([1, 2, 3], pa.int64())}), {ROWS_PROPERTY: '{"accepted":3}'})
    text = http.get(f"{secured.url}/metrics").raise_for_status().text
    assert "payroll" not in text and "secret_ns" not in text
    assert str(table.metadata.table_uuid) not in text and "table_uuid" not in text
    assert 'isbre_sink_rows_total{disposition="accepted"} 3' in text.splitlines()
