"""Scan plans exactly as the spec and clients expect, on the tables that broke them: file names
holding `%`, a partition source dropped since, null partition values under a residual, fixed and
binary literals, the deprecated `{"type": "true"}`, set residuals in the spec's words, a cursor
ahead of the log, and v3 tasks with their first row ids. Rows read through a plan are compared
with PyIceberg's local reading and with what the test appended (the model)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
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
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.io.pyarrow import PyArrowFileIO, schema_to_pyarrow
from pyiceberg.manifest import DataFileContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import StaticTable, Table
from pyiceberg.table.puffin import PuffinFile
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform, TruncateTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    DateType,
    FixedType,
    LongType,
    NestedField,
    StringType,
    UUIDType,
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


def plan(server: IsbreServer, table: Table, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every file scan task of a plan, its pages fetched, each answer checked against the spec
    (as tests/openapi.py reads it: a null partition value is JSON `null`)."""
    first = http.post(url(server, table), json=body)
    assert first.status_code == 200, first.text
    check(first)
    answers, pending = [first.json()], list(first.json()["plan-tasks"])
    while pending:
        page = http.post(url(server, table, "tasks"), json={"plan-task": pending.pop(0)})
        assert page.status_code == 200, page.text
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
    assert {task["data-file"]["file-path"] for task in plan(server, table, {})} == paths
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
    tasks = plan(server, table, {"filter": {"type": "gt", "term": "id", "value": 1}})
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
        tasks = plan(server, table, {"filter": body})
        nulls = [t for t in tasks if t["data-file"]["partition"] == [None]]
        assert all(task["residual-filter"] is not None for task in tasks)
        assert {t["data-file"]["file-path"] for t in tasks} >= {t["data-file"]["file-path"] for t in nulls}
    everything = plan(server, table, {"filter": {"type": "true"}})  # `true`, deprecated
    assert {t["data-file"]["file-path"] for t in everything} == local_files(table)
    # A null partition value is JSON null, as Java's `ContentFileParser` reads it.
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


def test_compaction_on_a_v3_table_keeps_each_row_s_id_and_sequence_number(
    server: IsbreServer, catalog: RestCatalog
) -> None:
    """The spec's row lineage: a row moved into a new file keeps its `_row_id` and its
    `_last_updated_sequence_number`, written out as columns of the new file; a second compaction
    reads them back from the file the first one wrote."""
    catalog.create_namespace_if_not_exists("compact3")
    catalog.create_table(
        "compact3.t",
        pa.schema([pa.field("writer", pa.int64()), pa.field("seq", pa.int64())]),
        properties={"format-version": "3", "isbre.maintenance.compact.min-input-files": "3"},
    )
    model: dict[tuple[int, int], tuple[int, int]] = {}  # (writer, seq) -> (row id, sequence number)
    # The spec's model: ids run on from the table's next-row-id, in commit order; every commit is
    # the table's next sequence number. A compaction's new files take ids for their rows too (as
    # Java's manifest list assigns them), which none of the rows moved into them uses.
    next_row_id, sequence_number = 0, 1
    for i, size in enumerate([3, 5, 2, 4, 2, 3]):
        model |= {(i, k): (next_row_id + k, sequence_number) for k in range(size)}
        batch = pa.table({"writer": [i] * size, "seq": list(range(size))})
        V3Appender(server.url, "compact3.t").append(batch, tags(0, i))
        next_row_id, sequence_number = next_row_id + size, sequence_number + 1
        if i in (3, 5):  # after the fourth append, and again after the sixth
            answer = httpx.post(
                url(server, catalog.load_table("compact3.t"), "maintenance"),
                json={"jobs": ["compact-data-files"]},
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
            (job,) = answer.json()["jobs"]
            assert job["committed"] and job["rewritten-files"] == (4 if i == 3 else 3), job
            compacted_from = next_row_id
            next_row_id, sequence_number = next_row_id + len(model), sequence_number + 1
    table = catalog.load_table("compact3.t")
    (task,) = plan(server, table, {})
    written = pyarrow.parquet.read_table(task["data-file"]["file-path"].removeprefix("file://"))
    read = {
        (row["writer"], row["seq"]): (row["_row_id"], row["_last_updated_sequence_number"])
        for row in written.to_pylist()
    }
    assert read == model
    scanned = table.scan().to_arrow()  # PyIceberg reads the table's own columns only
    assert sorted(zip(scanned["writer"].to_pylist(), scanned["seq"].to_pylist(), strict=True)) == sorted(
        model
    )
    assert task["data-file"]["first-row-id"] == compacted_from
    assert table.metadata.next_row_id == next_row_id  # type: ignore[attr-defined]


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
    vector = appender.delete_from(target, [1])
    with PyArrowFileIO().new_input(vector).open() as stream:
        blob = PuffinFile(stream.read()).footer.blobs[0]
    table = catalog.load_table("dv.t")
    tasks = plan(server, table, {})
    assert len(tasks) == 3
    for task in tasks:
        if task["data-file"]["file-path"] != target:
            assert task["deletes"] == [], task
            continue
        (applied,) = task["deletes"]
        assert applied["file-path"] == vector and applied["file-format"] == "puffin"
        assert applied["content"] == "position-deletes" and applied["referenced-data-file"] == target
        assert (applied["content-offset"], applied["content-size-in-bytes"]) == (blob.offset, blob.length)
    # Read as the plan says (PyIceberg reads the vector): the row at position 1 of that file is gone.
    read = rows_of_plan(table, tasks)
    assert sorted(zip(read["writer"].to_pylist(), read["seq"].to_pylist(), strict=True)) == [
        (0, 0),
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 2),
    ]


# -- generated: random filters on tables of every shape, rows read from the plan against a model


@dataclass
class Generated:
    """A table the generated filters plan on, and the rows it holds (the model): those appended,
    less those its deletes removed, each a dict of the current schema's columns."""

    table: Table
    model: list[dict[str, Any]]
    leaves: st.SearchStrategy[Any]


def evolved_rows(start: int, count: int, late: bool) -> list[dict[str, Any]]:
    """Rows of the v2 table: `late` ones are written after `g` was dropped and `u`, `f` added."""
    rows = []
    for i in range(start, start + count):
        row: dict[str, Any] = {
            "id": i,
            "d": date(2024, 1, 1) + timedelta(days=i % 5),
            "n": None if i % 6 == 0 else i % 23,
            "b": None if i % 7 == 0 else bytes([i % 4, 255]),
        }
        if late:
            row |= {"u": UUIDS[i % 3] if i % 4 else None, "f": bytes([i % 3, 7])}
        else:
            row["g"] = None if i % 9 == 0 else f"g{i % 3}"  # null identity partition values
        rows.append(row)
    return rows


UUIDS = [uuid.UUID(int=k * 0x1111_2222_3333_4444) for k in (1, 2, 3)]


def without(rows: list[dict[str, Any]], drop: Any) -> list[dict[str, Any]]:
    return [row for row in rows if not drop(row)]


@pytest.fixture(scope="module")
def evolved_v2(server: IsbreServer, catalog: RestCatalog) -> Generated:
    """Format v2, partitioned by bucket, day and identity (null partition values), then by
    truncate over a nullable column, its identity source dropped, `u` (uuid) and `f` (fixed)
    added, then unpartitioned; a position delete, a copy-on-write delete, a global equality
    delete, and rows appended after it that it does not reach."""
    from pyiceberg.expressions import EqualTo

    from tests.row_deltas import commit_deletes, equality_deletes, position_deletes

    catalog.create_namespace_if_not_exists("gen")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "d", DateType(), required=False),
        NestedField(3, "n", LongType(), required=False),
        NestedField(4, "b", BinaryType(), required=False),
        NestedField(5, "g", StringType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(1, 1000, BucketTransform(4), "id_bucket"),
        PartitionField(2, 1001, DayTransform(), "d_day"),
        PartitionField(5, 1002, IdentityTransform(), "g"),
    )
    table = catalog.create_table("gen.evolved_v2", schema, partition_spec=spec)
    model: list[dict[str, Any]] = []

    def append(rows: list[dict[str, Any]]) -> None:
        arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)
        table.append(pa.Table.from_pylist(rows, schema=arrow))
        model.extend(rows)

    for start in (0, 20, 40):
        append(evolved_rows(start, 20, late=False))
    # Both deletes before `g` is dropped: PyIceberg writes no manifest of a spec over a dropped
    # column. Copy-on-write: PyIceberg rewrites the files holding n = 7.
    table.delete(EqualTo("n", 7))
    model = without(model, lambda row: row["n"] == 7)
    table = table.refresh()
    target = sorted(data_files(table), key=lambda f: f.file_path)[2]
    held = pyarrow.parquet.read_table(target.file_path.removeprefix("file://"))["id"].to_pylist()
    table = commit_deletes(table, [position_deletes(table, target, [0, 1])])
    model = without(model, lambda row: row["id"] in held[:2])
    with table.update_spec() as update:
        update.remove_field("d_day")
        update.remove_field("g")
        update.add_field("n", TruncateTransform(10), "n_trunc")
    with table.update_schema() as evolve:
        evolve.delete_column("g")
        evolve.add_column("u", UUIDType())
        evolve.add_column("f", FixedType(2))
    model = [{k: v for k, v in row.items() if k != "g"} | {"u": None, "f": None} for row in model]
    for start in (60, 80):
        append(evolved_rows(start, 20, late=True))
    with table.update_spec() as update:
        update.remove_field("id_bucket")
        update.remove_field("n_trunc")
    table = table.refresh()
    table = commit_deletes(table, [equality_deletes(table, "n", [3, 11])])  # every partition's
    model = without(model, lambda row: row["n"] in (3, 11))
    append(evolved_rows(100, 20, late=True))  # after the equality delete: it reaches none of these
    leaves = st.one_of(
        ID_LEAVES,
        st.integers(-1, 25).map(lambda v: {"type": "gt", "term": "n", "value": v}),
        st.sets(st.integers(0, 25), min_size=1, max_size=3).map(
            lambda vs: {"type": "in", "term": "n", "values": sorted(vs)}
        ),
        st.integers(0, 4).map(lambda i: {"type": "eq", "term": "b", "value": bytes([i, 255]).hex()}),
        st.integers(0, 3).map(lambda i: {"type": "eq", "term": "f", "value": bytes([i, 7]).hex()}),
        st.sampled_from(UUIDS).map(lambda u: {"type": "eq", "term": "u", "value": str(u)}),
        st.sampled_from(["is-null", "not-null"]).flatmap(
            lambda kind: st.sampled_from(["n", "b", "u"]).map(lambda term: {"type": kind, "term": term})
        ),
        st.integers(0, 6).map(
            lambda i: {"type": "eq", "term": "d", "value": (date(2024, 1, 1) + timedelta(days=i)).isoformat()}
        ),
        CONSTANTS,
    )
    return Generated(table.refresh(), model, leaves)


@pytest.fixture(scope="module")
def evolved_v3(server: IsbreServer, catalog: RestCatalog) -> Generated:
    """Format v3, partitioned by identity (a written file is one partition's, as a v3 writer's
    are), with deletion vectors, an equality delete in one partition, and rows appended after it."""
    from isbre.catalog.manifest_entries import as_v3

    from tests.row_deltas import equality_deletes

    catalog.create_namespace_if_not_exists("gen")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "n", LongType(), required=False),
        NestedField(3, "u", UUIDType(), required=False),
        NestedField(4, "cat", StringType(), required=False),
    )
    spec = PartitionSpec(PartitionField(4, 1000, IdentityTransform(), "cat"))
    table = catalog.create_table(
        "gen.evolved_v3", schema, partition_spec=spec, properties={"format-version": "3"}
    )
    appender = V3Appender(server.url, "gen.evolved_v3")
    model: list[dict[str, Any]] = []
    arrow = schema_to_pyarrow(schema, include_field_ids=False)

    def append(start: int, cat: str) -> None:
        rows = [
            {"id": i, "n": None if i % 5 == 0 else i % 7, "u": UUIDS[i % 3] if i % 4 else None, "cat": cat}
            for i in range(start, start + 15)
        ]
        appender.append(pa.Table.from_pylist(rows, schema=arrow), tags(0, start))
        model.extend(rows)

    for start, cat in ((0, "a"), (15, "b"), (30, "a"), (45, "b")):
        append(start, cat)
    for target in sorted(data_files(catalog.load_table("gen.evolved_v3")), key=lambda f: f.file_path)[:2]:
        held = pyarrow.parquet.read_table(target.file_path.removeprefix("file://"))["id"].to_pylist()
        appender.delete_from(target.file_path, [0, 3, 14], target.partition)
        model = without(model, lambda row, held=held: row["id"] in (held[0], held[3], held[14]))
    table = catalog.load_table("gen.evolved_v3")
    deletes = equality_deletes(table, "n", [2, 4], Record("a"))
    appender.commit_deletes(as_v3(deletes, table.spec().spec_id), summary={"added-equality-deletes": "2"})
    model = without(model, lambda row: row["cat"] == "a" and row["n"] in (2, 4))
    append(60, "a")  # after the equality delete: it reaches none of these
    leaves = st.one_of(
        ID_LEAVES,
        st.integers(-1, 7).map(lambda v: {"type": "lt-eq", "term": "n", "value": v}),
        st.sets(st.integers(0, 7), min_size=1, max_size=3).map(
            lambda vs: {"type": "not-in", "term": "n", "values": sorted(vs)}
        ),
        st.sampled_from(UUIDS).map(lambda u: {"type": "not-eq", "term": "u", "value": str(u)}),
        st.sets(st.sampled_from(UUIDS), min_size=1).map(
            lambda us: {"type": "in", "term": "u", "values": sorted(map(str, us))}
        ),
        st.sampled_from(["a", "b", "c"]).map(lambda c: {"type": "eq", "term": "cat", "value": c}),
        st.sampled_from(["is-null", "not-null"]).map(lambda kind: {"type": kind, "term": "n"}),
        CONSTANTS,
    )
    return Generated(catalog.load_table("gen.evolved_v3"), model, leaves)


def data_files(table: Table) -> list[Any]:
    return [f for f, _ in live_files(table).values() if f.content == DataFileContent.DATA]


def live_files(table: Table) -> dict[str, tuple[Any, Any]]:
    """Every live data and delete file of the current snapshot, by path, with its manifest entry,
    read as the table's format version writes them."""
    from isbre.catalog.manifest_entries import read_entries
    from isbre.catalog.manifest_lists import read_manifests

    current = table.current_snapshot()
    assert current is not None
    version = table.metadata.format_version
    return {
        entry.data_file.file_path: (entry.data_file, entry)
        for manifest in read_manifests(table.io, current.manifest_list, version)
        for entry in read_entries(table.io, manifest, version)
    }


def rows_of_plan(table: Table, tasks: list[dict[str, Any]]) -> pa.Table:
    """The rows a reader gets from the plan's tasks: each data file with the delete files the plan
    attached to it. PyIceberg's Arrow reader applies the position deletes and deletion vectors;
    it reads no equality delete, so they are applied here, as the spec says: a row whose values
    in the delete's columns equal a deleted row's (null equal to null) is gone."""
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import FileScanTask

    files = live_files(table)
    read = []
    for task in tasks:
        data_file = files[task["data-file"]["file-path"]][0]
        attached = [files[d["file-path"]][0] for d in task["deletes"]]
        positional = {d for d in attached if d.content == DataFileContent.POSITION_DELETES}
        rows = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(
            [FileScanTask(data_file, positional)]
        )
        for equality in (d for d in attached if d.content == DataFileContent.EQUALITY_DELETES):
            names = [table.schema().find_column_name(field_id) for field_id in equality.equality_ids]
            deleted = pyarrow.parquet.read_table(equality.file_path.removeprefix("file://")).to_pylist()
            gone = {tuple(row[name] for name in names) for row in deleted}
            keep = [tuple(row[name] for name in names) not in gone for row in rows.select(names).to_pylist()]
            rows = rows.filter(pa.array(keep, pa.bool_()))
        read.append(rows)
    schema = schema_to_pyarrow(table.schema(), include_field_ids=False)
    return pa.concat_tables(read) if read else schema.empty_table()


def kept_ids(schema: Schema, rows: list[dict[str, Any]], row_filter: BooleanExpression) -> list[int]:
    """The ids of `rows` the filter keeps, by PyIceberg's Arrow expression over them; a uuid
    compared as its canonical string (Arrow compares no uuid values)."""
    from pyiceberg.expressions.visitors import bind, rewrite_not
    from pyiceberg.io.pyarrow import expression_to_pyarrow

    uuids = {f.name for f in schema.fields if isinstance(f.field_type, UUIDType)}
    as_strings = Schema(
        *(
            NestedField(f.field_id, f.name, StringType(), required=f.required) if f.name in uuids else f
            for f in schema.fields
        )
    )
    comparable = [{k: _uuid_string(v) if k in uuids else v for k, v in row.items()} for row in rows]
    bound = bind(as_strings, rewrite_not(row_filter), case_sensitive=True)
    arrow = schema_to_pyarrow(as_strings, include_field_ids=False)
    kept = pa.Table.from_pylist(comparable, schema=arrow).filter(expression_to_pyarrow(bound))
    return sorted(kept["id"].to_pylist())


def _uuid_string(value: uuid.UUID | bytes | None) -> str | None:
    if value is None:
        return None
    return str(value if isinstance(value, uuid.UUID) else uuid.UUID(bytes=value))


generated_ids = st.integers(-5, 125)
ID_LEAVES = st.one_of(
    generated_ids.map(lambda v: {"type": "lt", "term": "id", "value": v}),
    generated_ids.map(lambda v: {"type": "gt-eq", "term": "id", "value": v}),
    st.sets(generated_ids, min_size=1, max_size=4).map(
        lambda vs: {"type": "in", "term": "id", "values": sorted(vs)}
    ),
    st.sets(generated_ids, min_size=1, max_size=3).map(
        lambda vs: {"type": "not-in", "term": "id", "values": sorted(vs)}
    ),
)
CONSTANTS = st.sampled_from([True, False, {"type": "true"}, {"type": "false"}])


def generated_filters(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.tuples(inner, inner).map(lambda pair: {"type": "and", "left": pair[0], "right": pair[1]}),
            st.tuples(inner, inner).map(lambda pair: {"type": "or", "left": pair[0], "right": pair[1]}),
            inner.map(lambda child: {"type": "not", "child": child}),
        ),
        max_leaves=5,
    )


@pytest.mark.parametrize("shape", ["evolved_v2", "evolved_v3"])
@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_generated_filters_read_through_a_plan_are_the_model_s_rows(
    server: IsbreServer, request: pytest.FixtureRequest, shape: str, data: st.DataObject
) -> None:
    generated: Generated = request.getfixturevalue(shape)
    body = data.draw(generated_filters(generated.leaves))
    table = generated.table
    tasks = plan(server, table, {"filter": body})  # each answer validated against the spec
    row_filter = spec_literals(parse_expression(bounded_filter(body, 10_000)), table.schema(), True)
    read = rows_of_plan(table, tasks).to_pylist()
    assert kept_ids(table.schema(), read, row_filter) == kept_ids(table.schema(), generated.model, row_filter)
