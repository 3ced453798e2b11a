"""Scan plans exactly as the spec and clients expect, on the tables that broke them: file names
holding `%`, a partition source dropped since, null partition values under a residual, fixed and
binary literals, the deprecated `{"type": "true"}`, set residuals in the spec's words, a cursor
ahead of the log, and v3 tasks with their first row ids. Rows read through a plan are compared
with PyIceberg's local reading and with what the test appended (the model)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from isbre.catalog.scan_planning import spec_literals
from isbre.rest.plan_filters import bounded_filter
from isbre.rest.scan_json import parse_expression
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.expressions import BooleanExpression
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import StaticTable, Table
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform, TruncateTransform
from pyiceberg.types import (
    BinaryType,
    DateType,
    FixedType,
    LongType,
    NestedField,
    StringType,
)

from tests.appenders import V3Appender, tags
from tests.http_client import http
from tests.openapi import check
from tests.server import InProcessServer, IsbreServer

PAGE = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    env = {"ISBRE_SCAN_PLANNING_MODE": "server", "ISBRE_PLAN_PAGE_SIZE": str(PAGE)}
    running = InProcessServer(tmp_path_factory.mktemp("exact") / "warehouse", env=env).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def catalog(server: IsbreServer) -> RestCatalog:
    return RestCatalog("isbre", uri=server.url)


def url(server: IsbreServer, table: Table, tail: str = "plan") -> str:
    namespace, name = table.name()
    return f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{name}/{tail}"


def plan(
    server: IsbreServer, table: Table, body: dict[str, Any], validate: bool = True
) -> list[dict[str, Any]]:
    """Every file scan task of a plan, its pages fetched, each answer checked against the spec
    (`validate`: unless a string partition value is in it, which the spec's `PrimitiveTypeValue`,
    a `oneOf` that every string matches several times over, cannot validate)."""
    first = http.post(url(server, table), json=body)
    assert first.status_code == 200, first.text
    if validate:
        check(first)
    answers, pending = [first.json()], list(first.json()["plan-tasks"])
    while pending:
        page = http.post(url(server, table, "tasks"), json={"plan-task": pending.pop(0)})
        assert page.status_code == 200, page.text
        if validate:
            check(page)
        answers.append(page.json())
        pending += page.json()["plan-tasks"]
    tasks = []
    for answer in answers:
        deletes = answer["delete-files"]
        for task in answer["file-scan-tasks"]:
            applied = [deletes[i] for i in task.get("delete-file-references", [])]
            tasks.append({**task, "deletes": applied})
    return tasks


def local_files(table: Table, row_filter: BooleanExpression | str = "true") -> set[str]:
    static = StaticTable.from_metadata(str(table.metadata_location))
    return {task.file.file_path for task in static.scan(row_filter=row_filter).plan_files()}


def test_a_data_file_whose_name_holds_a_percent_is_planned(server: IsbreServer, catalog: RestCatalog) -> None:
    """PyIceberg (as Spark) percent-encodes a partition value in the file's path: the file is the
    table's, written by its own engine inside its folder."""
    catalog.create_namespace_if_not_exists("pct")
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "ts", StringType()))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "ts"))
    table = catalog.create_table("pct.t", schema, partition_spec=spec)
    table.append(pa.table({"id": [1, 2], "ts": ["2021-05-19T00:00:00", "plain"]}))
    paths = local_files(table.refresh())
    assert any("%3A" in path for path in paths), paths
    assert {task["data-file"]["file-path"] for task in plan(server, table, {}, validate=False)} == paths
    assert sorted(catalog.load_table("pct.t").scan().to_arrow()["id"].to_pylist()) == [1, 2]


def test_a_partition_source_dropped_since_is_planned(server: IsbreServer, catalog: RestCatalog) -> None:
    catalog.create_namespace_if_not_exists("dropped")
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "c", StringType()))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "c"))
    table = catalog.create_table("dropped.t", schema, partition_spec=spec)
    table.append(pa.table({"id": [1, 2, 3], "c": ["x", "y", "x"]}))
    with table.update_spec() as update:
        update.remove_field("c")
    with table.update_schema() as update:
        update.delete_column("c")
    table = table.refresh()
    table.append(pa.table({"id": [4, 5]}))
    table = table.refresh()
    tasks = plan(server, table, {"filter": {"type": "gt", "term": "id", "value": 1}}, validate=False)
    assert {t["data-file"]["file-path"] for t in tasks} == local_files(table, "id > 1")
    old = [t for t in tasks if t["data-file"]["spec-id"] == 0]
    assert old and all(t["data-file"]["partition"][0] in ("x", "y") for t in old)
    assert sorted(catalog.load_table("dropped.t").scan(row_filter="id > 1").to_arrow()["id"].to_pylist()) == [
        2,
        3,
        4,
        5,
    ]


def test_null_partition_values_under_a_residual_are_planned(
    server: IsbreServer, catalog: RestCatalog
) -> None:
    catalog.create_namespace_if_not_exists("nulls")
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "a", LongType()))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "a"))
    table = catalog.create_table("nulls.t", schema, partition_spec=spec)
    table.append(pa.table({"id": [1, 2, 3, 4], "a": pa.array([None, 5, 3, None], pa.int64())}))
    table = table.refresh()
    for body in (
        {
            "type": "or",
            "left": {"type": "gt", "term": "a", "value": 4},
            "right": {"type": "eq", "term": "id", "value": 1},
        },
        {"type": "or", "left": True, "right": {"type": "eq", "term": "a", "value": 3}},
        {"type": "not", "child": {"type": "is-null", "term": "a"}},
    ):
        tasks = plan(server, table, {"filter": body}, validate=False)  # null: see below
        nulls = [t for t in tasks if t["data-file"]["partition"] == [None]]
        assert all(task["residual-filter"] is not None for task in tasks)
        assert {t["data-file"]["file-path"] for t in tasks} >= {t["data-file"]["file-path"] for t in nulls}
    everything = plan(server, table, {"filter": {"type": "true"}}, validate=False)  # `true`, deprecated
    assert {t["data-file"]["file-path"] for t in everything} == local_files(table)
    # A null partition value is JSON null, as Java's parser reads it (the spec's schema for a
    # partition value, `PrimitiveTypeValue`, has no null: no answer here can validate against it).
    assert [t["data-file"]["partition"] for t in everything].count([None]) == 1


def test_fixed_and_binary_literals_are_hex_as_the_spec_says(
    server: IsbreServer, catalog: RestCatalog
) -> None:
    catalog.create_namespace_if_not_exists("bytes")
    schema = Schema(
        NestedField(1, "id", LongType()),
        NestedField(2, "b", BinaryType()),
        NestedField(3, "f", FixedType(4)),
    )
    table = catalog.create_table("bytes.t", schema)
    arrow = pa.schema([pa.field("id", pa.int64()), pa.field("b", pa.binary()), pa.field("f", pa.binary(4))])
    for start in (0, 10):
        rows = {"id": [start, start + 1], "b": [b"\x00\x01", b"\xff"], "f": [b"abcd", b"wxyz"]}
        table.append(pa.table(rows, schema=arrow))
    table = table.refresh()
    for term, value in (("b", "0001"), ("f", b"abcd".hex()), ("b", "ff")):
        tasks = plan(server, table, {"filter": {"type": "eq", "term": term, "value": value}})
        assert len(tasks) == 2  # both files hold the value
    # Below every file's lower bound for `f` ("abcd"): pruned, as the bytes say.
    assert plan(server, table, {"filter": {"type": "in", "term": "f", "values": ["00000000"]}}) == []


def test_set_residuals_carry_values_as_the_spec_names_them(server: IsbreServer, catalog: RestCatalog) -> None:
    catalog.create_namespace_if_not_exists("sets")
    table = catalog.create_table("sets.t", Schema(NestedField(1, "id", LongType())))
    table.append(pa.table({"id": [1, 2, 3]}))
    (task,) = plan(server, table.refresh(), {"filter": {"type": "not-in", "term": "id", "values": [2, 9]}})
    residual = task["residual-filter"]
    assert (
        residual["type"] == "not-in" and sorted(residual["values"]) == [2, 9] and "literals" not in residual
    )


def test_a_cursor_ahead_of_the_log_is_refused(server: IsbreServer, catalog: RestCatalog) -> None:
    catalog.create_namespace_if_not_exists("ahead")
    table = catalog.create_table("ahead.t", Schema(NestedField(1, "id", LongType())))
    refused = http.post(url(server, table), json={"isbre-after-commit-seq": 10**9})
    assert refused.status_code == 400 and "ahead of the commit log" in refused.text, refused.text


def test_v3_tasks_carry_the_first_row_id_their_files_inherit(
    server: IsbreServer, catalog: RestCatalog
) -> None:
    catalog.create_namespace_if_not_exists("lineage")
    catalog.create_table(
        "lineage.t",
        pa.schema([pa.field("writer", pa.int64()), pa.field("seq", pa.int64())]),
        properties={"format-version": "3"},
    )
    rows = [pa.table({"writer": [0] * n, "seq": list(range(n))}) for n in (3, 5, 2)]
    for i, batch in enumerate(rows):
        V3Appender(server.url, "lineage.t").append(batch, tags(0, i))
    table = catalog.load_table("lineage.t")
    tasks = plan(server, table, {})
    spans = sorted((t["data-file"]["first-row-id"], t["data-file"]["record-count"]) for t in tasks)
    # Each file's rows take the ids after the previous file's: 0..9 once each, as the table's
    # next-row-id says.
    assert spans == [(0, 3), (3, 5), (8, 2)]
    assert table.metadata.next_row_id == 10  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "field",
    [
        PartitionField(1, 1000, BucketTransform(4), "id_bucket"),
        PartitionField(2, 1000, TruncateTransform(2), "name_trunc"),
        PartitionField(3, 1000, DayTransform(), "day"),
    ],
    ids=["bucket", "truncate", "day"],
)
def test_compaction_on_every_partitioning(
    server: IsbreServer, catalog: RestCatalog, field: PartitionField
) -> None:
    namespace = f"compact_{field.name}"
    catalog.create_namespace_if_not_exists(namespace)
    schema = Schema(
        NestedField(1, "id", LongType()),
        NestedField(2, "name", StringType()),
        NestedField(3, "d", DateType()),
    )
    table = catalog.create_table(
        f"{namespace}.t",
        schema,
        partition_spec=PartitionSpec(field),
        properties={"isbre.maintenance.compact.min-input-files": "3"},
    )
    model: list[int] = []
    for i in range(4):
        ids = [10 * i + k for k in range(3)]
        model += ids
        table.append(
            pa.table(
                {"id": ids, "name": ["aa"] * 3, "d": [date(2024, 1, 1) + timedelta(days=k % 2) for k in ids]}
            )
        )
    answer = httpx.post(
        f"{url(server, table, 'maintenance')}", json={"jobs": ["compact-data-files"]}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    (job,) = answer.json()["jobs"]
    assert job["committed"] and not job.get("problems"), job
    assert sorted(catalog.load_table(f"{namespace}.t").scan().to_arrow()["id"].to_pylist()) == sorted(model)


def test_rewrite_manifests_on_a_v3_table(server: IsbreServer, catalog: RestCatalog) -> None:
    catalog.create_namespace_if_not_exists("merge3")
    catalog.create_table(
        "merge3.t",
        pa.schema([pa.field("writer", pa.int64()), pa.field("seq", pa.int64())]),
        properties={"format-version": "3"},
    )
    for i in range(3):
        V3Appender(server.url, "merge3.t").append(pa.table({"writer": [0] * 2, "seq": [i, i]}), tags(0, i))
    table = catalog.load_table("merge3.t")
    before = sorted(
        (t["data-file"]["first-row-id"], t["data-file"]["file-path"]) for t in plan(server, table, {})
    )
    answer = httpx.post(
        f"{url(server, table, 'maintenance')}", json={"jobs": ["rewrite-manifests"]}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    (job,) = answer.json()["jobs"]
    assert job["committed"], job
    table = catalog.load_table("merge3.t")
    current = table.current_snapshot()
    assert current is not None and len(current.manifests(table.io)) == 1
    after = sorted(
        (t["data-file"]["first-row-id"], t["data-file"]["file-path"]) for t in plan(server, table, {})
    )
    assert after == before  # the rows keep their ids


def test_a_deletion_vector_is_planned_for_its_own_data_file_only(
    server: IsbreServer, catalog: RestCatalog
) -> None:
    """Java's reader refuses a deletion vector attached to another file than the one it names
    (`BaseDeleteLoader.validateDV`), and reads its blob at its offset and size."""
    catalog.create_namespace_if_not_exists("dv")
    schema = pa.schema([pa.field("writer", pa.int64()), pa.field("seq", pa.int64())])
    catalog.create_table("dv.t", schema, properties={"format-version": "3"})
    appender = V3Appender(server.url, "dv.t")
    for i in range(3):
        appender.append(pa.table({"writer": [0, 0], "seq": [i, i]}), tags(0, i))
    before = plan(server, catalog.load_table("dv.t"), {})
    target = before[1]["data-file"]["file-path"]
    vector = appender.delete_from(target, offset=4, size=40)
    tasks = plan(server, catalog.load_table("dv.t"), {})
    assert len(tasks) == 3
    for task in tasks:
        if task["data-file"]["file-path"] != target:
            assert task["deletes"] == [], task
            continue
        (applied,) = task["deletes"]
        assert applied["file-path"] == vector and applied["file-format"] == "puffin"
        assert applied["content"] == "position-deletes" and applied["referenced-data-file"] == target
        assert (applied["content-offset"], applied["content-size-in-bytes"]) == (4, 40)


# -- generated: random filters on tables of every shape, rows read from the plan against a model

EVOLVED_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "d", DateType(), required=False),
    NestedField(3, "n", LongType(), required=False),
    NestedField(4, "b", BinaryType(), required=False),
)
EVOLVED_ARROW = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("d", pa.date32()),
        pa.field("n", pa.int64()),
        pa.field("b", pa.binary()),
    ]
)


def evolved_rows(start: int, count: int) -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "d": date(2024, 1, 1) + timedelta(days=i % 5),
            "n": None if i % 6 == 0 else i % 23,
            "b": None if i % 7 == 0 else bytes([i % 4, 255]),
        }
        for i in range(start, start + count)
    ]


@pytest.fixture(scope="module")
def evolved(server: IsbreServer, catalog: RestCatalog) -> tuple[Table, list[dict[str, Any]]]:
    """A table partitioned by bucket and day, then by truncate over a nullable column (null
    partition values), with a position delete in one of its files: and the rows it holds."""
    from tests.row_deltas import commit_deletes, position_deletes

    catalog.create_namespace_if_not_exists("gen")
    spec = PartitionSpec(
        PartitionField(1, 1000, BucketTransform(4), "id_bucket"),
        PartitionField(2, 1001, DayTransform(), "d_day"),
    )
    table = catalog.create_table("gen.evolved", EVOLVED_SCHEMA, partition_spec=spec)
    model: list[dict[str, Any]] = []
    for start in (0, 20, 40):
        batch = evolved_rows(start, 20)
        table.append(pa.Table.from_pylist(batch, schema=EVOLVED_ARROW))
        model += batch
    with table.update_spec() as update:
        update.remove_field("d_day")
        update.add_field("n", TruncateTransform(10), "n_trunc")
    table = table.refresh()
    for start in (60, 80):
        batch = evolved_rows(start, 20)
        table.append(pa.Table.from_pylist(batch, schema=EVOLVED_ARROW))
        model += batch
    table = table.refresh()
    target = sorted(local_data_files(table), key=lambda f: f.file_path)[2]
    with table.io.new_input(target.file_path).open() as stream:
        held = pa.parquet.read_table(stream)["id"].to_pylist()  # type: ignore[attr-defined]
    table = commit_deletes(table, [position_deletes(table, target, [0, 1])])
    deleted = set(held[:2])
    return table, [row for row in model if row["id"] not in deleted]


def local_data_files(table: Table) -> list[Any]:
    return [task.file for task in StaticTable.from_metadata(str(table.metadata_location)).scan().plan_files()]


def rows_of_plan(table: Table, tasks: list[dict[str, Any]], row_filter: BooleanExpression) -> list[int]:
    """The ids a reader gets from the plan's tasks: each data file with the delete files the plan
    attached to it, read by PyIceberg's Arrow reader with the filter applied."""
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import FileScanTask

    local = {
        t.file.file_path: t
        for t in StaticTable.from_metadata(str(table.metadata_location)).scan().plan_files()
    }
    deletes = {d.file_path: d for t in local.values() for d in t.delete_files}
    scan_tasks = [
        FileScanTask(local[t["data-file"]["file-path"]].file, {deletes[d["file-path"]] for d in t["deletes"]})
        for t in tasks
    ]
    read = ArrowScan(table.metadata, table.io, table.schema(), row_filter).to_table(scan_tasks)
    return sorted(read["id"].to_pylist())


def model_ids(rows: list[dict[str, Any]], row_filter: BooleanExpression) -> list[int]:
    """The ids of the rows the test appended (less those it deleted) that the filter keeps, by
    Arrow's compute over those rows alone: no file, manifest or plan involved."""
    from pyiceberg.expressions.visitors import bind, rewrite_not
    from pyiceberg.io.pyarrow import expression_to_pyarrow

    bound = bind(EVOLVED_SCHEMA, rewrite_not(row_filter), case_sensitive=True)
    kept = pa.Table.from_pylist(rows, schema=EVOLVED_ARROW).filter(expression_to_pyarrow(bound))
    return sorted(kept["id"].to_pylist())


generated_ids = st.integers(-5, 105)
generated_leaves = st.one_of(
    generated_ids.map(lambda v: {"type": "lt", "term": "id", "value": v}),
    generated_ids.map(lambda v: {"type": "gt-eq", "term": "id", "value": v}),
    st.sets(generated_ids, min_size=1, max_size=4).map(
        lambda vs: {"type": "in", "term": "id", "values": sorted(vs)}
    ),
    st.sets(generated_ids, min_size=1, max_size=3).map(
        lambda vs: {"type": "not-in", "term": "id", "values": sorted(vs)}
    ),
    st.integers(-1, 25).map(lambda v: {"type": "gt", "term": "n", "value": v}),
    st.integers(0, 25).map(lambda v: {"type": "eq", "term": "n", "value": v}),
    st.integers(0, 4).map(lambda i: {"type": "eq", "term": "b", "value": bytes([i, 255]).hex()}),
    st.sampled_from(["is-null", "not-null"]).map(lambda kind: {"type": kind, "term": "n"}),
    st.sampled_from(["is-null", "not-null"]).map(lambda kind: {"type": kind, "term": "b"}),
    st.integers(0, 6).map(
        lambda i: {"type": "eq", "term": "d", "value": (date(2024, 1, 1) + timedelta(days=i)).isoformat()}
    ),
    st.sampled_from([True, False, {"type": "true"}, {"type": "false"}]),
)
generated_filters = st.recursive(
    generated_leaves,
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda pair: {"type": "and", "left": pair[0], "right": pair[1]}),
        st.tuples(inner, inner).map(lambda pair: {"type": "or", "left": pair[0], "right": pair[1]}),
        inner.map(lambda child: {"type": "not", "child": child}),
    ),
    max_leaves=5,
)


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(body=generated_filters)
def test_generated_filters_read_through_a_plan_are_the_model_s_rows(
    server: IsbreServer, evolved: tuple[Table, list[dict[str, Any]]], body: Any
) -> None:
    table, model = evolved
    tasks = plan(server, table, {"filter": body}, validate=False)  # null partition values: see above
    row_filter = spec_literals(parse_expression(bounded_filter(body, 10_000)), EVOLVED_SCHEMA, True)
    assert rows_of_plan(table, tasks, row_filter) == model_ids(model, row_filter)
