"""OpenLineage RunEvents for commits, delivered to a real receiver through the durable outbox."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.types import StringType

from tests import zygote
from tests.http_client import http
from tests.lineage_receiver import Receiver, validate
from tests.postgres import new_database
from tests.server import IsbreServer, free_port
from tests.waiting import eventually

NAMESPACE = "isbre://lineage-test"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver().start()
    yield running
    running.stop()


@pytest.fixture(params=["lmdb", "postgresql"])
def lineage_server(
    tmp_path: Path, receiver: Receiver, request: pytest.FixtureRequest
) -> Iterator[IsbreServer]:
    env = {"ISBRE_LINEAGE_URL": receiver.url, "ISBRE_LINEAGE_NAMESPACE": NAMESPACE}
    store = new_database(request) if request.param == "postgresql" else None
    running = IsbreServer(tmp_path / "warehouse", env=env, store=store).start()
    yield running
    running.stop()


def wait_for(receiver: Receiver, count: int, timeout: float = 60.0) -> list[dict]:
    def enough() -> list[dict]:
        events = receiver.snapshot()
        return events if len(events) >= count else []

    return eventually(enough, f"{count} events received", timeout)


def table_records(server: IsbreServer) -> list[dict]:
    """Every table record in the log, from the isbre events stream (the source of truth for run ids)."""
    high = http.get(f"{server.url}/v1/events/cursor").json()["commit_seq"]
    records = []
    with http.stream("GET", f"{server.url}/v1/events", params={"after": 0}, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                records.append(json.loads(line[6:]))
                if records[-1]["commit_seq"] >= high:
                    break
    return [r for r in records if r["kind"].startswith("table.")]


def outputs(event: dict) -> list[str]:
    return [o["name"] for o in event["outputs"]]


def test_a_scripted_session_produces_exactly_the_expected_runs(
    lineage_server: IsbreServer, receiver: Receiver
) -> None:
    catalog = RestCatalog("isbre", uri=lineage_server.url)
    catalog.create_namespace("sales")
    catalog.create_namespace("archive")
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("amount", pa.float64())])
    orders = catalog.create_table("sales.orders", schema=schema, properties={"comment": "all orders"})
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "amount": [1.0, 2.0, 3.0]})
    orders.append(rows)
    orders.append(rows)
    with orders.update_schema() as update:
        update.add_column("note", StringType(), doc="free text")
    catalog.create_table("sales.customers", schema=schema)
    catalog.rename_table("sales.orders", "archive.orders")
    # A two-table transaction.
    changes = [
        {
            "identifier": {"namespace": ["sales"], "name": "customers"},
            "updates": [{"action": "set-properties", "updates": {"a": "1"}}],
        },
        {
            "identifier": {"namespace": ["archive"], "name": "orders"},
            "updates": [{"action": "set-properties", "updates": {"a": "1"}}],
        },
    ]
    http.post(
        f"{lineage_server.url}/v1/isbre/transactions/commit", json={"table-changes": changes}
    ).raise_for_status()
    # A commit declaring its inputs, column lineage, job and parent run.
    declared = {
        "isbre.lineage.job": "nightly.orders_rollup",
        "isbre.lineage.inputs": json.dumps(
            ["sales.customers", {"namespace": "kafka://broker", "name": "payments"}]
        ),
        "isbre.lineage.column-lineage": json.dumps(
            {"amount": [{"namespace": "kafka://broker", "name": "payments", "field": "value"}]}
        ),
        "isbre.lineage.parent-run": json.dumps(
            {
                "job": {"namespace": "airflow", "name": "nightly"},
                "run": {"runId": "01923fb6-1b2c-7d8e-9f00-a1b2c3d4e5f6"},
            }
        ),
    }
    catalog.load_table("archive.orders").append(rows, snapshot_properties=declared)
    catalog.drop_table("sales.customers")

    records = table_records(lineage_server)
    runs = len(records) - 1  # the transaction's two records are one run
    wait_for(receiver, 2 * runs)
    # Once the outbox has delivered up to the log's end it sends nothing more: what arrived is all.
    status = f"{lineage_server.url}/v1/lineage/status"
    eventually(lambda: http.get(status).json()["backlog"] == 0, "the outbox delivered everything")
    events = receiver.snapshot()
    assert len(events) == 2 * runs, "more events than runs: something was sent twice"
    for event in events:
        validate(event)

    # START then COMPLETE for each run, runs in commit order, one runId per run.
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"] * runs
    run_ids = [e["run"]["runId"] for e in events[::2]]
    assert run_ids == [e["run"]["runId"] for e in events[1::2]]
    expected_ids = [
        r["run_id"]
        for r in records
        if not (r.get("txn") and r is not next(x for x in records if x.get("txn") == r["txn"]))
    ]
    assert run_ids == expected_ids

    complete = events[1::2]
    create, append1, append2, evolve, create2, rename, txn, declared_run, drop = complete
    assert outputs(create) == ["sales.orders"]
    facets = create["outputs"][0]["facets"]
    assert facets["lifecycleStateChange"]["lifecycleStateChange"] == "CREATE"
    assert [f["name"] for f in facets["schema"]["fields"]] == ["id", "amount"]
    assert facets["documentation"]["description"] == "all orders"
    assert facets["storage"]["storageLayer"] == "iceberg"
    assert create["job"]["facets"]["jobType"]["jobType"] == "CATALOG_COMMIT"
    assert create["producer"].startswith("https://pypi.org/project/isbre/")
    assert create["outputs"][0]["namespace"] == NAMESPACE

    statistics = append1["outputs"][0]["outputFacets"]["outputStatistics"]
    assert statistics["rowCount"] == 3 and statistics["fileCount"] == 1 and statistics["size"] > 0
    assert (
        append2["outputs"][0]["facets"]["version"]["datasetVersion"]
        != append1["outputs"][0]["facets"]["version"]["datasetVersion"]
    )
    note = evolve["outputs"][0]["facets"]["schema"]["fields"][-1]
    assert (
        note == {"name": "note", "type": "string", "description": "free text", "fields": []}
        or note["name"] == "note"
    )
    assert outputs(create2) == ["sales.customers"]

    assert outputs(rename) == ["archive.orders"]
    lifecycle = rename["outputs"][0]["facets"]["lifecycleStateChange"]
    assert lifecycle["lifecycleStateChange"] == "RENAME"
    assert lifecycle["previousIdentifier"] == {"namespace": NAMESPACE, "name": "sales.orders"}

    assert sorted(outputs(txn)) == ["archive.orders", "sales.customers"]
    assert txn["job"]["name"].startswith("isbre.transaction.")

    assert declared_run["job"]["name"] == "nightly.orders_rollup"
    assert [(i["namespace"], i["name"]) for i in declared_run["inputs"]] == [
        (NAMESPACE, "sales.customers"),
        ("kafka://broker", "payments"),
    ]
    column = declared_run["outputs"][0]["facets"]["columnLineage"]["fields"]["amount"]["inputFields"]
    assert column == [
        {"namespace": "kafka://broker", "name": "payments", "field": "value", "transformations": []}
    ]
    parent = declared_run["run"]["facets"]["parent"]
    assert (parent["job"]["namespace"], parent["job"]["name"]) == ("airflow", "nightly")
    assert parent["run"]["runId"] == "01923fb6-1b2c-7d8e-9f00-a1b2c3d4e5f6"

    assert drop["outputs"][0]["facets"]["lifecycleStateChange"]["lifecycleStateChange"] == "DROP"
    # The worker publishes its counters a few times a second: they may lag the deliveries. It counts
    # each event as it goes and stamps `last_delivery_at` once the chunk's cursor has moved: wait
    # for both.
    url = f"{lineage_server.url}/v1/lineage/status"

    def counted() -> dict | None:
        found = http.get(url).json()
        done = found["events_sent"] >= 2 * runs and found["last_delivery_at"] is not None
        return found if done else None

    status = eventually(counted, "every event counted and its chunk's delivery stamped")
    assert status["enabled"] and status["backlog"] == 0 and status["events_sent"] == 2 * runs
    assert time.time() - 60 < status["last_delivery_at"] <= time.time()


def commit_properties(server: IsbreServer, table: str, count: int) -> float:
    started = time.monotonic()
    with httpx.Client() as client:
        for i in range(count):
            body = {"updates": [{"action": "set-properties", "updates": {f"k{i}": "v"}}]}
            client.post(f"{server.url}/v1/isbre/namespaces/db/tables/{table}", json=body).raise_for_status()
    return time.monotonic() - started


SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}


def test_an_outage_delays_events_and_loses_none(lineage_server: IsbreServer, receiver: Receiver) -> None:
    base = f"{lineage_server.url}/v1/isbre"
    http.post(f"{base}/namespaces", json={"namespace": ["db"]}).raise_for_status()
    http.post(f"{base}/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).raise_for_status()
    wait_for(receiver, 2)
    port = int(receiver.url.rsplit(":", 1)[1])
    receiver.stop()

    commit_properties(lineage_server, "t", 30)  # every commit succeeds with the receiver down
    health = http.get(f"{lineage_server.url}/health").json()
    assert health["components"]["lineage"]["backlog"] > 0
    eventually(
        lambda: http.get(f"{lineage_server.url}/v1/lineage/status").json()["failures"] > 0,
        "a failed delivery counted",
    )
    assert http.get(f"{lineage_server.url}/health").json()["status"] == "degraded"

    revived = Receiver(port).start()
    try:
        events = wait_for(revived, 2 * 30, timeout=90)
        run_ids = [e["run"]["runId"] for e in events if e["eventType"] == "COMPLETE"]
        expected = [r["run_id"] for r in table_records(lineage_server)][1:]
        assert run_ids[: len(expected)] == expected, "late events must arrive in commit order"
        for event in events:
            validate(event)
    finally:
        revived.stop()


def test_a_crash_mid_backlog_loses_nothing(tmp_path: Path) -> None:
    port = free_port()
    receiver = Receiver(port).start()
    env = {"ISBRE_LINEAGE_URL": receiver.url}
    server = IsbreServer(tmp_path / "warehouse", env=env).start()
    base = f"{server.url}/v1/isbre"
    http.post(f"{base}/namespaces", json={"namespace": ["db"]}).raise_for_status()
    http.post(f"{base}/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).raise_for_status()
    wait_for(receiver, 2)
    receiver.stop()
    commit_properties(server, "t", 20)
    expected = [r["run_id"] for r in table_records(server)]
    server.kill()

    revived = Receiver(port).start()
    restarted = IsbreServer(server.warehouse, env=env).start()
    try:

        def every_run() -> list[str]:
            runs = [e["run"]["runId"] for e in revived.snapshot() if e["eventType"] == "COMPLETE"]
            return runs if set(expected[1:]) <= set(runs) else []

        received = eventually(every_run, "every run delivered after the restart", timeout=90)
        first_seen = list(dict.fromkeys(received))
        assert [r for r in first_seen if r in expected] == [r for r in expected if r in first_seen]
    finally:
        restarted.stop()
        revived.stop()


def test_lineage_is_off_without_a_transport(server: IsbreServer) -> None:
    assert http.get(f"{server.url}/v1/lineage/status").json() == {"enabled": False}
    assert http.get(f"{server.url}/health").json()["status"] == "ok"


def test_openlineage_environment_and_bearer_token(tmp_path: Path, receiver: Receiver) -> None:
    """OpenLineage's own environment configures delivery when isbre's settings do not."""
    env = {"OPENLINEAGE_URL": receiver.url, "OPENLINEAGE_API_KEY": "s3cret"}
    server = IsbreServer(tmp_path / "warehouse", env=env).start()
    try:
        base = f"{server.url}/v1/isbre"
        http.post(f"{base}/namespaces", json={"namespace": ["db"]}).raise_for_status()
        http.post(f"{base}/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).raise_for_status()
        wait_for(receiver, 2)
        assert receiver.authorizations == {"Bearer s3cret"}
    finally:
        server.stop()


def test_status_and_replay_commands(tmp_path: Path, receiver: Receiver) -> None:
    warehouse = tmp_path / "warehouse"
    server = IsbreServer(warehouse, env={"ISBRE_LINEAGE_URL": receiver.url}).start()
    base = f"{server.url}/v1/isbre"
    http.post(f"{base}/namespaces", json={"namespace": ["db"]}).raise_for_status()
    for name in ("a", "b", "c"):
        http.post(f"{base}/namespaces/db/tables", json={"name": name, "schema": SCHEMA}).raise_for_status()
    wait_for(receiver, 6)

    def status() -> dict:
        command = [sys.executable, "-m", "isbre.rest.cli", "lineage", "status", "--url", server.url]
        return json.loads(zygote.run(command, capture_output=True, text=True, check=True).stdout)

    # The worker reports its counters a few times a second: the last ones may lag the receiver.
    assert eventually(lambda: (sent := status()["events_sent"]) >= 6 and sent, "6 events counted", 10) == 6
    server.stop()

    again = Receiver().start()
    try:
        replay = zygote.run(
            [
                sys.executable,
                "-m",
                "isbre.rest.cli",
                "lineage",
                "replay",
                "--from",
                "3",
                "--to",
                "4",
                "--warehouse",
                str(warehouse),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "ISBRE_LINEAGE_URL": again.url},
            check=True,
        )
        assert "sent 4 events for commits 3..4" in replay.stdout
        assert [o["name"] for e in again.snapshot() for o in e["outputs"]] == ["db.b", "db.b", "db.c", "db.c"]
        original = {e["run"]["runId"] for e in receiver.snapshot()}
        assert {e["run"]["runId"] for e in again.snapshot()} <= original, "a replay reuses the runIds"
    finally:
        again.stop()


def test_lineage_runs_beside_table_defaults(tmp_path: Path, receiver: Receiver) -> None:
    """The worker learns the warehouses from the server: their table defaults (keyed by
    namespace) are not its to know, and must not stop it starting."""
    env = {
        "ISBRE_LINEAGE_URL": receiver.url,
        "ISBRE_TABLE_DEFAULTS": json.dumps({"isbre.db": {"write.metadata.previous-versions-max": "5"}}),
    }
    server = IsbreServer(tmp_path / "warehouse", env=env).start()
    try:
        base = f"{server.url}/v1/isbre"
        http.post(f"{base}/namespaces", json={"namespace": ["db"]}).raise_for_status()
        http.post(f"{base}/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).raise_for_status()
        wait_for(receiver, 2)
    finally:
        server.stop()
