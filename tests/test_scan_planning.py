"""Server-side scan planning: PyIceberg reading through the plan endpoints gets the rows its own
local plan gets, pages and polls work as the spec says, incremental plans between snapshots and
from a commit cursor hand over each appended file once, and every path in a plan is the table's."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from isbre.rest.plan_filters import bounded_filter
from isbre.rest.scan_json import parse_expression
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.expressions import (
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    Not,
    NotEqualTo,
    NotIn,
    NotNull,
    Or,
    StartsWith,
)
from pyiceberg.expressions.visitors import expression_evaluator
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import StaticTable, Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from tests.crafted import crafted_snapshot
from tests.http_client import http
from tests.openapi import check
from tests.postgres import new_database
from tests.row_deltas import commit_deletes, equality_deletes, position_deletes
from tests.server import InProcessServer, IsbreServer
from tests.waiting import eventually

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "cat", StringType(), required=False),
    NestedField(3, "n", LongType(), required=False),
)
BY_CAT = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "cat"))
PAGE = 2  # file scan tasks per answer: most plans here come in pages
PLAN_ROUTE = "/namespaces/{namespace}/tables/{table}/plan"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    env = {"ISBRE_SCAN_PLANNING_MODE": "server", "ISBRE_PLAN_PAGE_SIZE": str(PAGE)}
    running = InProcessServer(tmp_path_factory.mktemp("plans") / "warehouse", env=env).start()
    yield running
    running.stop()


def rows(first: int, count: int) -> pa.Table:
    ids = list(range(first, first + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "cat": pa.array([f"c{i % 3}" for i in ids]),
            "n": pa.array([None if i % 7 == 0 else i % 11 for i in ids], pa.int64()),
        },
        schema=pa.schema(
            [
                pa.field("id", pa.int64(), nullable=False),
                pa.field("cat", pa.string()),
                pa.field("n", pa.int64()),
            ]
        ),
    )


def appended(catalog: RestCatalog, name: str, batches: int, **create: Any) -> Table:
    table = catalog.create_table(name, SCHEMA, **create)
    for batch in range(batches):
        table.append(rows(batch * 30, 30))
    return table


def data_files(table: Table) -> list[Any]:
    return [task.file for task in local(table).scan().plan_files()]


def local(table: Table) -> StaticTable:
    """The same table without a catalog: PyIceberg plans its scans itself."""
    return StaticTable.from_metadata(table.metadata_location)


def url(server: IsbreServer, table: Table, tail: str = "plan") -> str:
    namespace, name = table.name()
    return f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{name}/{tail}"


def plan_requests(server: IsbreServer) -> int:
    scraped = http.get(f"{server.url}/metrics").text
    pattern = (
        rf'isbre_http_requests_total{{method="POST",route="{re.escape(PLAN_ROUTE)}",status="200"}} (\d+)'
    )
    return sum(int(n) for n in re.findall(pattern, scraped))


def whole_plan(server: IsbreServer, table: Table, body: dict[str, Any]) -> dict[str, Any]:
    """A plan's answer with every plan task fetched into it (delete references made file paths)."""
    first = check(http.post(url(server, table), json=body))
    assert first.status_code == 200, first.text
    answer = first.json()
    tasks, pending = list(_resolved(answer)), list(answer["plan-tasks"])
    while pending:
        page = check(http.post(url(server, table, "tasks"), json={"plan-task": pending.pop(0)}))
        assert page.status_code == 200, page.text
        tasks += _resolved(page.json())
        pending += page.json()["plan-tasks"]
    return {**answer, "tasks": tasks}


def _resolved(page: dict[str, Any]) -> list[dict[str, Any]]:
    deletes = page["delete-files"]
    found = []
    for task in page["file-scan-tasks"]:
        applied = [deletes[i] for i in task.get("delete-file-references", [])]
        found.append({**task, "deletes": sorted(d["file-path"] for d in applied), "delete-objects": applied})
    return found


def paths(answer: dict[str, Any]) -> list[str]:
    return sorted(task["data-file"]["file-path"] for task in answer["tasks"])


PLAN_ENDPOINTS = {
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/plan",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}/plan/{plan-id}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}/plan/{plan-id}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/tasks",
}


def test_config_tells_clients_where_to_plan(server: IsbreServer, tables: dict[str, Table]) -> None:
    config = check(http.get(f"{server.url}/v1/config")).json()
    assert set(config["endpoints"]) >= PLAN_ENDPOINTS
    assert config["overrides"]["scan-planning-mode"] == "server"
    assert config["overrides"]["rest-scan-planning-enabled"] == "true"  # the Java client before 1.11
    loaded = http.get(url(server, tables["plain"], "").rstrip("/")).json()
    assert loaded["config"]["scan-planning-mode"] == "server"


# -- PyIceberg's own reads, planned on the server and locally


@pytest.fixture(scope="module")
def tables(server: IsbreServer) -> dict[str, Table]:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("reads")
    found = {
        "plain": appended(catalog, "reads.plain", 4),
        "parted": appended(catalog, "reads.parted", 4, partition_spec=BY_CAT),
        "v3": appended(catalog, "reads.v3", 3, partition_spec=BY_CAT),
    }
    for name in ("plain", "parted", "v3"):  # position deletes in one file, then more rows after them
        table = found[name]
        target = sorted(data_files(table), key=lambda f: f.file_path)[1]
        table = commit_deletes(table, [position_deletes(table, target, [0, 3, 5])])
        table.append(rows(120, 10))
        found[name] = catalog.load_table(f"reads.{name}")
    # PyIceberg 0.12 writes no v3 manifests: the v3 table is a v2 one upgraded, as Spark would.
    upgrade = {"updates": [{"action": "upgrade-format-version", "format-version": 3}]}
    check_ok(http.post(url(server, found["v3"], "").rstrip("/"), json=upgrade))
    found["v3"] = catalog.load_table("reads.v3")
    assert found["v3"].metadata.format_version == 3
    return found


ids = st.integers(-5, 135)
cats = st.sampled_from(["c0", "c1", "c2", "zz"])
leaves = st.one_of(
    ids.map(lambda v: LessThan("id", v)),
    ids.map(lambda v: GreaterThanOrEqual("id", v)),
    ids.map(lambda v: EqualTo("id", v)),
    ids.map(lambda v: NotEqualTo("id", v)),
    st.sets(ids, min_size=1, max_size=4).map(lambda vs: In("id", vs)),
    cats.map(lambda v: EqualTo("cat", v)),
    st.sets(cats, min_size=1, max_size=2).map(lambda vs: NotIn("cat", vs)),
    st.sampled_from(["c", "c1", "z"]).map(lambda v: StartsWith("cat", v)),
    st.just(IsNull("n")),
    st.just(NotNull("n")),
    st.integers(0, 12).map(lambda v: LessThan("n", v)),
)
filters = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda pair: And(*pair)),
        st.tuples(inner, inner).map(lambda pair: Or(*pair)),
        inner.map(Not),
    ),
    max_leaves=4,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(row_filter=filters, which=st.sampled_from(["plain", "parted", "v3"]))
def test_pyiceberg_reads_the_rows_of_its_local_plan(
    server: IsbreServer, tables: dict[str, Table], row_filter: BooleanExpression, which: str
) -> None:
    table = tables[which]
    assert table.catalog.supports_server_side_planning()
    before = plan_requests(server)
    planned_here = table.scan(row_filter=row_filter).to_arrow().sort_by("id")
    assert plan_requests(server) == before + 1
    assert planned_here.equals(local(table).scan(row_filter=row_filter).to_arrow().sort_by("id"))


def test_a_plan_pages_through_plan_tasks_and_equals_the_local_plan(
    server: IsbreServer, tables: dict[str, Table]
) -> None:
    table = tables["parted"]
    answer = whole_plan(server, table, {})
    # A page is a run of manifests of about PAGE files (a manifest of more is a page of its own).
    assert answer["plan-tasks"] and len(answer["file-scan-tasks"]) < len(answer["tasks"])
    assert answer["plan-id"] and answer["isbre-snapshot-id"] == table.metadata.current_snapshot_id
    mine = {task["data-file"]["file-path"]: task["deletes"] for task in answer["tasks"]}
    theirs = {
        t.file.file_path: sorted(d.file_path for d in t.delete_files)
        for t in local(table).scan().plan_files()
    }
    assert mine == theirs and any(mine.values())
    assert len(mine) == len(answer["tasks"])  # no file twice across pages


def test_statistics_come_for_the_fields_asked(server: IsbreServer, tables: dict[str, Table]) -> None:
    table = tables["plain"]
    answer = whole_plan(server, table, {"stats-fields": ["id"], "select": ["id", "cat"]})
    for task in answer["tasks"]:
        data_file = task["data-file"]
        assert data_file["lower-bounds"]["keys"] == [1] and data_file["value-counts"]["keys"] == [1]
        assert data_file["lower-bounds"]["values"][0] <= data_file["upper-bounds"]["values"][0]
    bare = whole_plan(server, table, {})
    assert all("lower-bounds" not in task["data-file"] for task in bare["tasks"])
    unknown = check(http.post(url(server, table), json={"stats-fields": ["nope"]}))
    assert unknown.status_code == 400 and "nope" in unknown.json()["error"]["message"]


def test_equality_deletes_apply_to_older_files_of_their_partition(server: IsbreServer) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("equality")
    table = appended(catalog, "equality.t", 1, partition_spec=BY_CAT)
    older = {f.file_path: f.partition for f in data_files(table)}
    c1 = next(partition for partition in older.values() if partition[0] == "c1")
    table = commit_deletes(table, [equality_deletes(table, "id", [1, 4], partition=c1)])
    table.append(rows(30, 30))
    answer = whole_plan(server, catalog.load_table("equality.t"), {})
    for task in answer["tasks"]:
        data_file = task["data-file"]
        deleted = data_file["file-path"] in older and data_file["partition"] == ["c1"]
        assert len(task["deletes"]) == (1 if deleted else 0), data_file
    applied = {d["file-path"]: d for task in answer["tasks"] for d in task["delete-objects"]}
    (delete_file,) = applied.values()
    assert delete_file["content"] == "equality-deletes" and delete_file["equality-ids"] == [1]


def test_plan_exchanges_match_the_spec(server: IsbreServer, tables: dict[str, Table]) -> None:
    table = tables["plain"]  # unpartitioned: no string partition values (see `sent`)
    snapshots = [s.snapshot_id for s in table.snapshots()]
    bodies = [
        {},
        {"filter": {"type": "lt", "term": "id", "value": 50}, "stats-fields": ["id"], "select": ["id"]},
        {"snapshot-id": snapshots[1], "use-snapshot-schema": True},
        {"start-snapshot-id": snapshots[0], "end-snapshot-id": snapshots[2]},
        {"isbre-after-commit-seq": 0},
    ]
    for body in bodies:
        answer = check(http.post(url(server, table), json=body))
        assert answer.status_code == 200 and answer.json()["status"] == "completed", answer.text
        for task in answer.json()["plan-tasks"]:
            assert check(http.post(url(server, table, "tasks"), json={"plan-task": task})).status_code == 200
        plan = url(server, table, f"plan/{answer.json()['plan-id']}")
        assert check(http.get(plan)).json()["status"] == "completed"
        assert check(http.delete(plan)).status_code == 204
    assert check(http.post(url(server, table, "tasks"), json={"plan-task": "x"})).status_code == 404
    assert check(http.get(url(server, table, "plan/x"))).status_code == 404
    assert check(http.post(url(server, table), json={"snapshot-id": "x"})).status_code == 400


# -- plans that poll


def test_a_slow_plan_is_submitted_fetched_and_cancelled(tmp_path_factory: pytest.TempPathFactory) -> None:
    env = {"ISBRE_PLAN_WAIT_SECONDS": "0"}  # every plan answered `submitted`, as a long one would be
    polled = InProcessServer(tmp_path_factory.mktemp("polled") / "warehouse", env=env).start()
    try:
        config = http.get(f"{polled.url}/v1/config").json()  # the default: clients plan, and may ask
        assert set(config["endpoints"]) >= PLAN_ENDPOINTS and "scan-planning-mode" not in config["overrides"]
        catalog = RestCatalog("isbre", uri=polled.url)
        assert not catalog.supports_server_side_planning()
        catalog.create_namespace("slow")
        table = appended(catalog, "slow.t", 2)
        submitted = check(
            http.post(url(polled, table), json={"filter": {"type": "lt", "term": "id", "value": 40}})
        )
        assert submitted.json()["status"] == "submitted"
        plan = url(polled, table, f"plan/{submitted.json()['plan-id']}")

        def completed() -> dict[str, Any] | None:
            answer = check(http.get(plan)).json()
            return answer if answer["status"] == "completed" else None

        answer = eventually(completed, "the submitted plan did not complete")
        assert sorted(t["data-file"]["file-path"] for t in answer["file-scan-tasks"]) == sorted(
            f.file_path for f in data_files(table)
        )
        again = check(http.post(url(polled, table), json={})).json()["plan-id"]
        assert check(http.delete(url(polled, table, f"plan/{again}"))).status_code == 204
        assert check(http.get(url(polled, table, f"plan/{again}"))).json() == {"status": "cancelled"}
        for bad in ("nonsense", again[:-4]):
            missing = check(http.get(url(polled, table, f"plan/{bad}")))
            assert missing.status_code == 404 and missing.json()["error"]["type"] == "NoSuchPlanIdException"
        task = check(http.post(url(polled, table, "tasks"), json={"plan-task": "nonsense"}))
        assert task.status_code == 404 and task.json()["error"]["type"] == "NoSuchPlanTaskException"
        # A plan of one table is no plan of another.
        other = appended(catalog, "slow.other", 1)
        assert check(http.get(url(polled, other, f"plan/{again}"))).status_code == 404
    finally:
        polled.stop()


# -- incremental plans: between snapshots, and from a commit cursor


def test_an_incremental_plan_reads_what_the_appends_between_two_snapshots_added(server: IsbreServer) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("between")
    table = appended(catalog, "between.t", 5, partition_spec=BY_CAT)
    snapshots = [s.snapshot_id for s in table.snapshots()]
    body = {"start-snapshot-id": snapshots[1], "end-snapshot-id": snapshots[3]}
    answer = whole_plan(server, table, body)
    theirs = local(table).incremental_append_scan(
        from_snapshot_id_exclusive=snapshots[1], to_snapshot_id_inclusive=snapshots[3]
    )
    assert paths(answer) == sorted(task.file.file_path for task in theirs.plan_files())
    assert answer["isbre-rewrites"] == []
    reversed_order = check(
        http.post(
            url(server, table), json={"start-snapshot-id": snapshots[3], "end-snapshot-id": snapshots[1]}
        )
    )
    assert (
        reversed_order.status_code == 400 and "not an ancestor" in reversed_order.json()["error"]["message"]
    )
    assert check(http.post(url(server, table), json={"snapshot-id": 12345})).status_code == 400


def cursor_plan(server: IsbreServer, table: Table, after: int) -> dict[str, Any]:
    return whole_plan(server, table, {"isbre-after-commit-seq": after})


def read(table: Table, answer: dict[str, Any]) -> list[int]:
    """The ids the plan's files hold."""
    found: list[int] = []
    for path in paths(answer):
        with table.io.new_input(path).open() as stream:
            found += pa.parquet.read_table(stream)["id"].to_pylist()  # type: ignore[attr-defined]
    return sorted(found)


def test_a_cursor_reader_gets_every_appended_row_once(server: IsbreServer) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("cursor")
    table = catalog.create_table(
        "cursor.t", SCHEMA, properties={"isbre.maintenance.compact.min-input-files": "2"}
    )
    empty = cursor_plan(server, table, 0)
    assert empty["tasks"] == [] and empty["isbre-commit-seq"] == 0
    seen: list[int] = []
    cursor = 0
    for batch in range(3):
        table.append(rows(batch * 10, 10))
        answer = cursor_plan(server, table, cursor)
        seen += read(table, answer)
        assert answer["isbre-commit-seq"] > cursor
        cursor = answer["isbre-commit-seq"]
    assert seen == list(range(30))
    assert cursor_plan(server, table, cursor)["tasks"] == []  # nothing new: nothing again

    # Compaction rewrites every file into one: a cursor reader gets no row twice.
    jobs = http.post(url(server, table, "maintenance"), json={"jobs": ["compact-data-files"]}, timeout=60)
    assert jobs.status_code == 200 and jobs.json()["jobs"][0]["committed"], jobs.text
    compacted = cursor_plan(server, catalog.load_table("cursor.t"), cursor)
    assert compacted["tasks"] == [] and compacted["isbre-rewrites"] == []
    assert compacted["isbre-commit-seq"] > cursor
    cursor = compacted["isbre-commit-seq"]

    # An overwrite (a rewrite, then an append of its new rows) is reported, and its new rows read.
    table = catalog.load_table("cursor.t")
    table.overwrite(rows(100, 5), overwrite_filter=LessThan("id", 5))
    answer = cursor_plan(server, catalog.load_table("cursor.t"), cursor)
    assert read(table, answer) == list(range(100, 105))
    operations = [rewrite["operation"] for rewrite in answer["isbre-rewrites"]]
    assert operations and set(operations) <= {"delete", "overwrite"}
    assert all(rewrite["commit-seq"] == answer["isbre-commit-seq"] for rewrite in answer["isbre-rewrites"])


def check_ok(response: httpx.Response) -> httpx.Response:
    assert response.status_code == 200, response.text
    return check(response)


def test_a_cursor_behind_expired_snapshots_is_told_to_resync(server: IsbreServer) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("expired")
    table = appended(catalog, "expired.t", 1)
    cursor = cursor_plan(server, table, 0)["isbre-commit-seq"]
    for batch in range(1, 4):
        table.append(rows(batch * 30, 30))
    table = catalog.load_table("expired.t")
    doomed = [s.snapshot_id for s in table.snapshots()][1]  # the first one after the cursor
    removal = {"action": "remove-snapshots", "snapshot-ids": [doomed]}
    namespace, name = table.name()
    commit = http.post(
        f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{name}",
        json={"updates": [removal], "requirements": []},
    )
    assert commit.status_code == 200, commit.text
    # `410` answers only isbre's own cursor field (docs/events.md), beyond the spec's plan route.
    gone = http.post(url(server, table), json={"isbre-after-commit-seq": cursor})
    assert gone.status_code == 410 and "read the table whole again" in gone.json()["error"]["message"]
    # A cursor after the expired snapshot's commit is served.
    later = cursor_plan(server, table, cursor + 2)
    assert read(table, later) == list(range(90, 120))


def test_a_cursor_combined_with_snapshots_is_refused(server: IsbreServer, tables: dict[str, Table]) -> None:
    table = tables["plain"]
    body = {"isbre-after-commit-seq": 1, "snapshot-id": table.metadata.current_snapshot_id}
    refused = check(http.post(url(server, table), json=body))
    assert refused.status_code == 400 and "isbre-after-commit-seq" in refused.json()["error"]["message"]
    assert check(http.post(url(server, table), json={"isbre-after-commit-seq": -1})).status_code == 400


# -- paths


def test_a_plan_never_names_a_file_outside_the_table(
    server: IsbreServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("paths")
    table = appended(catalog, "paths.t", 1)
    own = table.metadata.location.removeprefix("file://")
    outside = tmp_path_factory.mktemp("elsewhere") / "secret.parquet"
    # A writer's commit may name any data file: the manifest is data the server checks on reading.
    updates = crafted_snapshot(
        table.metadata,
        f"{own}/metadata/snap-crafted.avro",
        [(f"{own}/metadata/crafted-m0.avro", [str(outside), f"{own}/data/real.parquet"])],
    )
    namespace, name = table.name()
    committed = http.post(
        f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{name}", json={"updates": updates}
    )
    assert committed.status_code == 200, committed.text
    for body in ({}, {"isbre-after-commit-seq": 0}):
        # Each page is checked as it is planned: the refusal comes with the page that names it.
        answers = [check(http.post(url(server, table), json=body))]
        while answers[-1].status_code == 200 and answers[-1].json()["plan-tasks"]:
            task = answers[-1].json()["plan-tasks"][0]
            answers.append(check(http.post(url(server, table, "tasks"), json={"plan-task": task})))
        refused = answers[-1]
        assert refused.status_code == 400, refused.text
        assert "outside the table" in refused.json()["error"]["message"]
        assert str(outside) in refused.json()["error"]["message"]
        assert not any(str(outside) in answer.text for answer in answers[:-1])


def test_cursor_plans_on_a_postgresql_store(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The commit that added each snapshot, and the log records a cursor plan reads, on PostgreSQL."""
    shared = InProcessServer(tmp_path / "warehouse", store=new_database(request)).start()
    try:
        catalog = RestCatalog("isbre", uri=shared.url)
        catalog.create_namespace("pg")
        table = appended(catalog, "pg.t", 2)
        first = cursor_plan(shared, table, 0)
        assert read(table, first) == list(range(60))
        table.append(rows(60, 5))
        second = cursor_plan(shared, table, first["isbre-commit-seq"])
        assert read(table, second) == list(range(60, 65))
        table = catalog.load_table("pg.t")
        doomed = [s.snapshot_id for s in table.snapshots()][1]
        namespace, name = table.name()
        removal = {"updates": [{"action": "remove-snapshots", "snapshot-ids": [doomed]}], "requirements": []}
        check_ok(http.post(f"{shared.url}/v1/isbre/namespaces/{namespace}/tables/{name}", json=removal))
        behind = http.post(url(shared, table), json={"isbre-after-commit-seq": 0})
        assert behind.status_code == 410, behind.text
    finally:
        shared.stop()


def tampered(token: str, change: Callable[[dict[str, Any]], None], filter_json: str | None = None) -> str:
    """`token` with its payload changed by `change` (and its filter made `filter_json`, when given:
    JSON text too deep for Python's own encoder), its signature kept."""
    payload, _, signature = token.partition(".")
    found = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    change(found)
    text = json.dumps(found)
    if filter_json is not None:
        text = text.replace(json.dumps(found["f"]), filter_json, 1)
    again = base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")
    return f"{again}.{signature}"


def nested(depth: int) -> str:
    """A filter nested `depth` levels deep, as JSON text."""
    return '{"type":"not","child":' * depth + '{"type":"eq","term":"id","value":1}' + "}" * depth


def test_plan_ids_and_tasks_are_signed_and_a_changed_one_is_never_parsed(server: IsbreServer) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("signed")
    table = appended(catalog, "signed.t", 4)
    answer = check_ok(http.post(url(server, table), json={})).json()
    plan_id, (task, *_) = answer["plan-id"], answer["plan-tasks"]
    assert "." in plan_id and "." in task  # a payload and its signature

    def widened(found: dict[str, Any]) -> None:
        found["m"] = [0, 10**6]

    deep = nested(1000)  # past the parser's recursion: a 500 before tokens were signed
    for method, where, body in (
        ("GET", url(server, table, f"plan/{tampered(plan_id, lambda _: None, deep)}"), None),
        ("DELETE", url(server, table, f"plan/{tampered(plan_id, lambda _: None, deep)}"), None),
        ("POST", url(server, table, "tasks"), {"plan-task": tampered(task, lambda _: None, deep)}),
        ("POST", url(server, table, "tasks"), {"plan-task": tampered(task, widened)}),
        ("POST", url(server, table, "tasks"), {"plan-task": "x" * (5 << 20)}),
    ):
        refused = http.request(method, where, json=body)
        assert refused.status_code == 404, (method, refused.text[:300])
        assert refused.json()["error"]["type"] in ("NoSuchPlanIdException", "NoSuchPlanTaskException")
    # The untouched ones still serve.
    assert check_ok(http.post(url(server, table, "tasks"), json={"plan-task": task})).json()[
        "file-scan-tasks"
    ]
    assert check_ok(http.get(url(server, table, f"plan/{plan_id}"))).json()["status"] == "completed"


def test_plan_filters_are_bounded_and_long_chains_are_planned(server: IsbreServer) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("bounded")
    table = appended(catalog, "bounded.t", 3)
    too_deep = http.post(
        url(server, table),
        content=f'{{"filter":{nested(1000)}}}'.encode(),
        headers={"Content-Type": "application/json"},
    )
    assert too_deep.status_code == 400 and "nested" in too_deep.json()["error"]["message"], too_deep.text
    huge = {"type": "in", "term": "id", "values": list(range(20_000))}
    refused = http.post(url(server, table), json={"filter": huge})
    assert refused.status_code == 400 and "plan_max_filter_terms" in refused.text, refused.text
    # Clients nest `a and b and c ...` as deep as it is long: a chain of 500 is read balanced, and
    # planned as the model says (ids 0..89; the chain excludes 0, 3, 6, ... 1497).
    chain: dict[str, Any] = {"type": "not-eq", "term": "id", "value": 0}
    for i in range(1, 500):
        chain = {"type": "and", "left": chain, "right": {"type": "not-eq", "term": "id", "value": 3 * i}}
    answer = whole_plan(server, table, {"filter": chain})
    kept = {t["data-file"]["file-path"] for t in answer["tasks"]}
    assert kept == {f.file_path for f in data_files(table)}  # every file holds a row the chain keeps
    assert kept == {
        t.file.file_path
        for t in local(table).scan(row_filter=parse_expression(bounded_filter(chain, 10_000))).plan_files()
    }
    residual = answer["tasks"][0]["residual-filter"]
    expression = parse_expression(residual)
    keeps = expression_evaluator(SCHEMA, expression, True)
    assert [i for i in range(90) if keeps(Record(i, None, None))] == [i for i in range(90) if i % 3 != 0]
