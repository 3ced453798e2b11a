"""Change feeds: `TableFeed(..., changes=True)` and the change plans under it hand over what each
commit inserted and deleted. The model is the spec's meaning of a change: the difference, as a
multiset of rows, between the table before a commit and after it, the table read by another
engine (DuckDB's iceberg extension, which applies equality deletes; PyIceberg on format v3)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from isbre.catalog.change_types import CHANGE_TYPE, COMMIT_SEQ
from isbre.events import TableFeed
from isbre.sinks.contract import OffsetSpan
from isbre.sinks.iceberg import IcebergSink
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.expressions import EqualTo, In
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from tests import zygote
from tests.appenders import SCHEMA, V3Appender, tags
from tests.duck import connect
from tests.http_client import http
from tests.row_deltas import commit_deletes, equality_deletes, position_deletes
from tests.server import InProcessServer, IsbreServer

ROWS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
Rows = Counter[tuple[Any, ...]]
# One commit's changes: (the rows it deleted, the rows it inserted).
Change = tuple[Rows, Rows]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    running = InProcessServer(tmp_path_factory.mktemp("changes") / "warehouse").start()
    yield running
    running.stop()


def rows(*pairs: tuple[int, str]) -> pa.Table:
    return pa.table({"id": [i for i, _ in pairs], "name": [n for _, n in pairs]}, schema=ROWS)


def new_table(server: IsbreServer, namespace: str, keyed: bool, version: int) -> Table:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace(namespace)
    fields = (NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()))
    schema = Schema(*fields, identifier_field_ids=[1] if keyed else [])
    properties = {"format-version": str(version), "isbre.maintenance.compact.min-input-files": "2"}
    return catalog.create_table(f"{namespace}.t", schema, properties=properties)


class Model:
    """The table's states after each step, read by another engine, and their differences."""

    def __init__(self, workdir: Path) -> None:
        self.duck = connect(workdir)
        self.states: list[Rows] = [Counter()]

    def read(self, table: Table) -> Rows:
        table.refresh()
        if table.metadata.format_version >= 3:  # DuckDB's extension reads format v2
            found = table.scan().to_arrow().to_pylist()
            return Counter(tuple(row.values()) for row in found)
        query = "SELECT * FROM iceberg_scan(?)"
        return Counter(self.duck.execute(query, [table.metadata_location]).fetchall())

    def step(self, table: Table) -> None:
        self.states.append(self.read(table))

    def changes(self) -> list[Change]:
        return differences(self.states)


def differences(states: list[Rows]) -> list[Change]:
    """Each state's difference from the one before, where it made one."""
    found = []
    for before, after in itertools.pairwise(states):
        change = (before - after, after - before)
        if change != (Counter(), Counter()):
            found.append(change)
    return found


def by_commit(read: list[dict[str, Any]]) -> list[Change]:
    """The feed's changes grouped by commit, in commit order: deletes and `update_before` rows
    are deleted rows, inserts and `update_after` rows inserted ones."""
    commits: dict[int, Change] = {}
    for row in read:
        deleted, inserted = commits.setdefault(row[COMMIT_SEQ], (Counter(), Counter()))
        values = tuple(v for k, v in row.items() if k not in (CHANGE_TYPE, COMMIT_SEQ))
        (inserted if row[CHANGE_TYPE] in ("insert", "update_after") else deleted)[values] += 1
    assert list(commits) == sorted(commits), "changes come in commit order"
    return list(commits.values())


def check_updates_pair_up(read: list[dict[str, Any]], keyed: bool) -> None:
    """On a keyed table a key deleted and inserted by one commit is an update: `update_before`
    directly followed by the `update_after` of its key; nothing else is ever an update."""
    kinds = [row[CHANGE_TYPE] for row in read]
    if not keyed:
        assert set(kinds) <= {"insert", "delete"}
        return
    for position, row in enumerate(read):
        if row[CHANGE_TYPE] == "update_before":
            after = read[position + 1]
            assert after[CHANGE_TYPE] == "update_after" and after["id"] == row["id"]
            assert after[COMMIT_SEQ] == row[COMMIT_SEQ]
    for commit_seq in {row[COMMIT_SEQ] for row in read}:
        plain = [
            row for row in read if row[COMMIT_SEQ] == commit_seq and not row[CHANGE_TYPE].startswith("u")
        ]
        deleted = {row["id"] for row in plain if row[CHANGE_TYPE] == "delete"}
        inserted = {row["id"] for row in plain if row[CHANGE_TYPE] == "insert"}
        assert not deleted & inserted, f"commit {commit_seq}: a key deleted and inserted, not paired"


def position_of(table: Table, key: int) -> tuple[Any, list[int]]:
    """The data file holding the row of `key`, and the row's position in it."""
    for task in table.scan().plan_files():
        with table.io.new_input(task.file.file_path).open() as stream:
            ids = pq.read_table(stream, columns=["id"])["id"].to_pylist()
        if key in ids:
            return task.file, [ids.index(key)]
    raise AssertionError(f"no row of {key}")


def maintain(server: IsbreServer, table: Table, job: str) -> None:
    namespace, name = table.name()
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{name}/maintenance"
    answer = http.post(url, json={"jobs": [job]}, timeout=120)  # compaction starts a process
    assert answer.status_code == 200, answer.text


def steps(server: IsbreServer, table: Table, keyed: bool) -> list[Callable[[], object]]:
    """What the test does to the table, one commit a step (compaction and expiry change no row)."""
    join = {} if keyed else {"join_cols": ["id"]}
    found: list[Callable[[], object]] = [
        lambda: table.append(rows((1, "a"), (2, "b"), (3, "c"))),
        lambda: table.append(rows((4, "d"), (5, "e"), (6, "f"))),
        lambda: maintain(server, table, "compact-data-files"),
        lambda: table.delete(EqualTo("id", 2)),  # copy-on-write: the file's other rows carried over
        lambda: table.overwrite(rows((5, "E"), (7, "g")), overwrite_filter=In("id", [5, 7])),
        lambda: table.upsert(rows((1, "A"), (8, "h"), (3, "c")), **join),  # 3 unchanged: no change
        lambda: maintain(server, table, "expire-snapshots"),
    ]
    if not keyed:  # the same row twice: a multiset (the equality delete below removes both)
        found.append(lambda: table.append(rows((6, "f"))))
    return [
        *found,
        # Delete files, as engines write them (PyIceberg writes none).
        lambda: commit_deletes(table, [position_deletes(table, *position_of(table, 3))]),
        lambda: commit_deletes(table, [position_deletes(table, *position_of(table, 1))]),
        lambda: table.delete(EqualTo("id", 8)),
        lambda: commit_deletes(table, [equality_deletes(table, "id", [4, 6])]),  # PyIceberg reads none after
        lambda: maintain(server, table, "compact-data-files"),  # applies the deletes: no change
    ]


@pytest.mark.parametrize("keyed", [True, False], ids=["identifier-fields", "no-identifier-fields"])
def test_changes_are_the_differences_of_consecutive_table_states(
    server: IsbreServer, tmp_path: Path, keyed: bool
) -> None:
    namespace = f"changes_{'keyed' if keyed else 'plain'}"
    table = new_table(server, namespace, keyed, version=2)
    model = Model(tmp_path)
    read: list[dict[str, Any]] = []
    feed = TableFeed(server.url, f"{namespace}.t", consumer="mirror", changes=True)
    todo = steps(server, table, keyed)
    for number, step in enumerate(todo):
        step()
        table.refresh()
        model.step(table)
        read += feed.read(timeout=0.5).to_pylist()
        feed.commit()
        if number == len(todo) // 2:  # the consumer restarts: it goes on from its stored cursor
            feed.close()
            feed = TableFeed(server.url, f"{namespace}.t", consumer="mirror", changes=True)
    feed.close()
    assert by_commit(read) == model.changes()
    check_updates_pair_up(read, keyed)
    if keyed:  # the upsert of key 1 and the overwrite of key 5
        assert [row["id"] for row in read if row[CHANGE_TYPE] == "update_after"] == [5, 1]


def test_a_partitioned_table_s_changes_are_the_differences_of_its_states(
    server: IsbreServer, tmp_path: Path
) -> None:
    """Partitioned by `name`: an update that changes a row's name moves it to another partition's
    file; a position delete applies in its file's partition only."""
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("changes_partitioned")
    fields = (NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name"))
    table = catalog.create_table(
        "changes_partitioned.t", Schema(*fields, identifier_field_ids=[1]), partition_spec=spec
    )
    model = Model(tmp_path)
    read: list[dict[str, Any]] = []
    feed = TableFeed(server.url, "changes_partitioned.t", consumer=None, changes=True)
    try:
        for step in (
            lambda: table.append(rows((1, "a"), (2, "a"), (3, "b"), (4, "c"))),
            lambda: table.delete(EqualTo("id", 2)),
            lambda: table.upsert(rows((1, "b"), (5, "c"))),  # 1 moves from partition a to b
            lambda: table.overwrite(rows((6, "a")), overwrite_filter=EqualTo("name", "c")),
            lambda: commit_deletes(table, [position_deletes(table, *position_of(table, 3))]),
        ):
            step()
            table.refresh()
            model.step(table)
            read += feed.read(timeout=0.5).to_pylist()
    finally:
        feed.close()
    assert by_commit(read) == model.changes()
    check_updates_pair_up(read, keyed=True)
    assert [(row["id"], row["name"]) for row in read if row[CHANGE_TYPE] == "update_after"] == [(1, "b")]


def test_a_format_v3_table_s_appends_are_inserts_and_its_compaction_no_change(
    server: IsbreServer, tmp_path: Path
) -> None:
    """PyIceberg 0.12 writes no format v3 commit: the appends are an engine's (tests/appenders.py);
    compaction keeps each row's lineage and changes no row."""
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("changes_v3")
    properties = {"format-version": "3", "isbre.maintenance.compact.min-input-files": "2"}
    table = catalog.create_table("changes_v3.t", SCHEMA, properties=properties)
    appender = V3Appender(server.url, "changes_v3.t")
    model = Model(tmp_path)
    feed = TableFeed(server.url, "changes_v3.t", consumer=None, changes=True)
    read: list[dict[str, Any]] = []
    try:
        for number in range(3):
            appender.append(pa.table({"writer": [number] * 2, "seq": [0, 1]}, schema=SCHEMA), tags(0, number))
            model.step(table)
            read += feed.read(timeout=5).to_pylist()
        maintain(server, table, "compact-data-files")
        table.refresh()
        assert table.metadata.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]
        model.step(table)
        assert feed.read(timeout=0.5).num_rows == 0
    finally:
        feed.close()
    assert by_commit(read) == model.changes()
    assert len(model.changes()) == 3


def v3_changes(
    server: IsbreServer,
    workdir: Path,
    namespace: str,
    first: pa.Table,
    then: Callable[[Table, V3Appender, str], object],
) -> list[dict[str, Any]]:
    """A change feed's rows over two commits of a new format v3 table (written by an engine:
    PyIceberg 0.12 writes no v3 commit): the append of `first`, then what `then` does given the
    table, its writer and the path of the one data file; checked against the model."""
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace(namespace)
    table = catalog.create_table(f"{namespace}.t", SCHEMA, properties={"format-version": "3"})
    appender = V3Appender(server.url, f"{namespace}.t")
    model = Model(workdir)
    feed = TableFeed(server.url, f"{namespace}.t", consumer=None, changes=True)
    try:
        appender.append(first, tags(0, 0))
        model.step(table)
        read = feed.read(timeout=5).to_pylist()
        table.refresh()
        (task,) = table.scan().plan_files()
        then(table, appender, task.file.file_path)
        model.step(table)
        read += feed.read(timeout=5).to_pylist()
    finally:
        feed.close()
    assert by_commit(read) == model.changes()
    return read


def test_a_format_v3_table_pairs_updates_by_row_lineage(server: IsbreServer, tmp_path: Path) -> None:
    """On format v3 a row's identity is its `_row_id`: a copy-on-write update that keeps it (as
    an engine that keeps row lineage writes one) is an update pair on a table without identifier
    fields; a row the rewrite drops is a delete, a row new to the table an insert."""

    def rewrite(table: Table, appender: V3Appender, path: str) -> None:
        first = table.metadata.snapshots[-1].first_row_id
        assert first is not None
        rewritten = {"writer": [0, 0, 5], "seq": [0, 10, 99], "_row_id": [first, first + 1, None]}
        appender.rewrite(path, pa.table(rewritten, schema=SCHEMA.append(pa.field("_row_id", pa.int64()))))

    appended = pa.table({"writer": [0, 0, 0], "seq": [0, 1, 2]}, schema=SCHEMA)
    read = v3_changes(server, tmp_path, "lineage_v3", appended, rewrite)
    last = read[-1][COMMIT_SEQ]
    assert [(row[CHANGE_TYPE], row["writer"], row["seq"]) for row in read if row[COMMIT_SEQ] == last] == [
        ("delete", 0, 2),
        ("update_before", 0, 1),
        ("update_after", 0, 10),
        ("insert", 5, 99),
    ]


def test_a_format_v3_table_s_deletion_vectors_are_deletes_each_row_once(
    server: IsbreServer, tmp_path: Path
) -> None:
    """A deletion vector deletes rows by position: the feed, which reads a v3 table's files whole
    to give each row its id (row lineage) and applies the vector after, hands over the row it
    deleted and nothing else."""
    appended = pa.table({"writer": [0] * 4, "seq": [0, 1, 2, 3]}, schema=SCHEMA)
    read = v3_changes(
        server, tmp_path, "vectors_v3", appended, lambda _, appender, path: appender.delete_from(path, [1])
    )
    assert [(row[CHANGE_TYPE], row["seq"]) for row in read[4:]] == [("delete", 1)]


def test_changes_go_on_across_a_server_restart_each_once(tmp_path: Path) -> None:
    first = InProcessServer(tmp_path / "warehouse").start()
    table = new_table(first, "restarted", keyed=True, version=2)
    model = Model(tmp_path)
    feed = TableFeed(first.url, "restarted.t", consumer="mirror", changes=True)
    read: list[dict[str, Any]] = []
    try:
        table.append(rows((1, "a"), (2, "b")))
        model.step(table)
        read += feed.read(timeout=5).to_pylist()
        feed.commit()
        table.upsert(rows((2, "B"), (3, "c")))
        model.step(table)
        first.stop()
        again = InProcessServer(tmp_path / "warehouse", port=first.port).start()
        try:
            catalog = RestCatalog("isbre", uri=again.url)
            reloaded = catalog.load_table("restarted.t")
            reloaded.delete(EqualTo("id", 1))
            model.step(reloaded)
            for _ in range(2):  # the upsert's commit and the delete's, in one read or two
                if len(by_commit(read)) < 3:
                    read += feed.read(timeout=30).to_pylist()
            feed.commit()
        finally:
            again.stop()
    finally:
        feed.close()
    assert by_commit(read) == model.changes()
    assert [row[CHANGE_TYPE] for row in read] == [
        "insert",
        "insert",
        "update_before",
        "update_after",
        "insert",
        "delete",
    ]


def span(start: int, end: int) -> OffsetSpan:
    return OffsetSpan("kafka-1", "people", 0, start, end)


def test_an_upsert_sink_s_commits_are_updates_inserts_and_deletes(
    server: IsbreServer, tmp_path: Path
) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("sunk")
    model = Model(tmp_path)
    with IcebergSink(catalog, "sunk.people", key=["id"]) as sink:
        sink.push(rows((1, "ann"), (2, "bob"), (3, "cy")).to_batches()[0], span(0, 3))
        sink.finish()
        table = catalog.load_table("sunk.people")
        model.step(table)
        feed = TableFeed(server.url, "sunk.people", consumer=None, from_start=True, changes=True)
        read = feed.read(timeout=5).to_pylist()
        sink.push(rows((2, "bo"), (4, "dee")).to_batches()[0], span(3, 5))
        sink.delete(pa.table({"id": pa.array([3, 9], pa.int64())}), span(5, 7))
        sink.finish()
        model.step(table)
    read += feed.read(timeout=5).to_pylist()
    feed.close()
    assert by_commit(read) == model.changes()
    assert [(row[CHANGE_TYPE], row["id"]) for row in read] == [
        *[("insert", key) for key in (1, 2, 3)],  # from the start: the table as it was
        ("delete", 3),
        ("update_before", 2),
        ("update_after", 2),
        ("insert", 4),
    ]


def test_from_start_is_the_table_as_it_is_then_its_changes(server: IsbreServer) -> None:
    table = new_table(server, "from_start", keyed=False, version=2)
    table.append(rows((1, "a"), (2, "b")))
    table.delete(EqualTo("id", 1))
    table.append(rows((3, "c")))
    maintain(server, table, "expire-snapshots")  # no consumer holds the first snapshots back
    feed = TableFeed(server.url, "from_start.t", consumer="late", from_start=True, changes=True)
    try:
        first = feed.read(timeout=5).to_pylist()
        assert sorted((r["id"], r[CHANGE_TYPE]) for r in first) == [(2, "insert"), (3, "insert")]
        assert {r[COMMIT_SEQ] for r in first} == {feed.position}  # the commit that made the snapshot
        feed.commit()
        table.delete(EqualTo("id", 2))
        assert [(r["id"], r[CHANGE_TYPE]) for r in feed.read(timeout=5).to_pylist()] == [(2, "delete")]
    finally:
        feed.close()


def plan(server: IsbreServer, table: str, body: dict[str, Any]) -> Any:
    namespace, name = table.split(".")
    return http.post(f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{name}/plan", json=body)


def test_a_change_plan_names_each_task_s_change(server: IsbreServer) -> None:
    table = new_table(server, "planned", keyed=False, version=2)
    table.append(rows((1, "a"), (2, "b"), (3, "c")))
    after = plan(server, "planned.t", {"filter": False}).json()["isbre-commit-seq"]
    commit_deletes(table, [position_deletes(table, *position_of(table, 1))])
    table.refresh()
    commit_deletes(table, [position_deletes(table, *position_of(table, 2))])
    table.refresh()
    table.delete(EqualTo("id", 3))  # the whole file goes (its deletes with it)
    answer = plan(server, "planned.t", {"isbre-after-commit-seq": after, "isbre-changes": True})
    assert answer.status_code == 200, answer.text
    found = answer.json()
    changes = [task["isbre-change"] for task in found["file-scan-tasks"]]
    assert [change["type"] for change in changes] == ["deleted-rows", "deleted-rows", "deleted-data-file"]
    commits = [change["commit-seq"] for change in changes]
    assert commits == sorted(commits) and len(set(commits)) == 3 and found["isbre-commit-seq"] == commits[-1]
    first, second, removed = found["file-scan-tasks"]
    # The second delete's rows: read without its own delete file and with it.
    assert len(second["isbre-change"]["existing-delete-file-references"]) == 1
    assert len(second["delete-file-references"]) == 2
    assert first["isbre-change"]["existing-delete-file-references"] == []
    assert len(removed["delete-file-references"]) == 2  # the rows it held were read with both
    assert all(task["residual-filter"] is True for task in found["file-scan-tasks"])


def test_a_removed_file_s_rows_deleted_before_are_not_deleted_again(
    server: IsbreServer, tmp_path: Path
) -> None:
    """A file removed by a commit held rows an earlier delete file had deleted: the commit deletes
    only the rows that were still there."""
    table = new_table(server, "redeleted", keyed=False, version=2)
    model = Model(tmp_path)
    table.append(rows((1, "a"), (2, "b"), (3, "c")))
    model.step(table)
    feed = TableFeed(server.url, "redeleted.t", consumer=None, from_start=True, changes=True)
    try:
        read = feed.read(timeout=5).to_pylist()
        commit_deletes(table, [position_deletes(table, *position_of(table, 1))])
        table.refresh()
        model.step(table)
        table.delete(EqualTo("id", 3))  # copy-on-write: the file goes, 2 is written again
        model.step(table)
        for _ in range(6):  # the two commits, in one read or two (each read waits up to 5 s)
            if len(by_commit(read)) == 3:
                break
            read += feed.read(timeout=5).to_pylist()
    finally:
        feed.close()
    assert by_commit(read) == model.changes()
    assert [(row[CHANGE_TYPE], row["id"]) for row in read[3:]] == [("delete", 1), ("delete", 3)]


def test_a_change_plan_needs_a_cursor(server: IsbreServer) -> None:
    new_table(server, "refused", keyed=False, version=2)
    answer = plan(server, "refused.t", {"isbre-changes": True})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "BadRequestException" and "isbre-after-commit-seq is required" in error["message"]


def test_a_filtered_change_plan_has_the_tasks_of_files_whose_rows_may_match(server: IsbreServer) -> None:
    """A filter prunes a change plan's tasks as it prunes a scan's (partitions, then column
    bounds), on both sides of each commit alike, and each task carries its residual: the rows
    read and kept by it are the changes of the rows that match."""
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("filtered")
    fields = (NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name"))
    table = catalog.create_table("filtered.t", Schema(*fields), partition_spec=spec)
    after = plan(server, "filtered.t", {"filter": False}).json()["isbre-commit-seq"]
    table.append(rows((1, "a"), (2, "b"), (3, "a"), (40, "b")))
    table.delete(EqualTo("id", 2))  # a copy-on-write rewrite of partition b's file
    whole = plan(server, "filtered.t", {"isbre-after-commit-seq": after, "isbre-changes": True}).json()
    by_partition: dict[str, set[str]] = {"a": set(), "b": set()}
    for task in whole["file-scan-tasks"]:
        by_partition[task["data-file"]["partition"][0]].add(task["data-file"]["file-path"])
    assert by_partition["a"] and by_partition["b"]
    body = {"isbre-after-commit-seq": after, "isbre-changes": True}
    only_a = plan(server, "filtered.t", {**body, "filter": {"type": "eq", "term": "name", "value": "a"}})
    assert only_a.status_code == 200, only_a.text
    tasks = only_a.json()["file-scan-tasks"]
    assert {task["data-file"]["file-path"] for task in tasks} == by_partition["a"]
    assert all(task["residual-filter"] is True for task in tasks)  # the partition decides it whole
    # Column bounds prune as well: partition b's files hold ids 2 to 40; ids above 100 match none.
    above = {"type": "gt", "term": "id", "value": 100}
    assert plan(server, "filtered.t", {**body, "filter": above}).json()["file-scan-tasks"] == []
    # A task that may hold rows that do not match carries what is left of the filter to apply.
    some = plan(server, "filtered.t", {**body, "filter": {"type": "lt", "term": "id", "value": 3}}).json()
    assert some["file-scan-tasks"] and all(
        task["residual-filter"] == {"type": "lt", "term": "id", "value": 3}
        for task in some["file-scan-tasks"]
    )


def test_a_filtered_feed_hands_over_the_changes_of_the_rows_that_match(
    server: IsbreServer, tmp_path: Path
) -> None:
    """`row_filter`: the changes of the rows that match it, each once: a row an update moves out
    of the filter is a delete, one it moves in an insert; an appends feed with the same filter
    reads the matching rows only."""
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("filtered_feed")
    fields = (NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()))
    # Unpartitioned: each file holds both names, and the feed applies the filter to the rows.
    table = catalog.create_table("filtered_feed.t", Schema(*fields, identifier_field_ids=[1]))
    model = Model(tmp_path)
    changes = TableFeed(server.url, "filtered_feed.t", consumer=None, changes=True, row_filter="name = 'a'")
    appends = TableFeed(server.url, "filtered_feed.t", consumer=None, row_filter=EqualTo("name", "a"))
    read: list[dict[str, Any]] = []
    try:
        table.append(rows((1, "a"), (2, "b"), (3, "a")))
        model.step(table)
        read += changes.read(timeout=5).to_pylist()
        assert sorted(appends.read(timeout=5).to_pylist(), key=lambda r: r["id"]) == [
            {"id": 1, "name": "a"},
            {"id": 3, "name": "a"},
        ]
        # A commit none of whose rows match is nothing to hand over, so that `read` waits on
        # (its file's bounds, "0" to "z", do not rule "a" out: the rows are read and none kept).
        before = appends.position
        catalog.load_table("filtered_feed.t").append(rows((7, "0"), (8, "z")))
        assert appends._read_new() is None and appends.position > before
        table.upsert(rows((3, "b"), (4, "a"), (2, "a")))  # 3 moves out of the filter, 2 into it
        model.step(table)
        read += changes.read(timeout=5).to_pylist()
        table.delete(EqualTo("id", 1))
        model.step(table)
        read += changes.read(timeout=5).to_pylist()
    finally:
        changes.close()
        appends.close()
    matching = [Counter({row: n for row, n in state.items() if row[1] == "a"}) for state in model.states]
    assert by_commit(read) == differences(matching)
    moved = [(row[CHANGE_TYPE], row["id"]) for row in read if row[COMMIT_SEQ] == read[2][COMMIT_SEQ]]
    assert sorted(moved) == [("delete", 3), ("insert", 2), ("insert", 4)]


def test_isbre_tail_prints_changes(server: IsbreServer) -> None:
    """Of the rows its filter matches: the row of id 9 is never printed."""
    table = new_table(server, "tailed", keyed=True, version=2)
    table.append(rows((1, "a"), (9, "z")))
    command = [sys.executable, "-m", "isbre.rest.cli", "tail", "tailed.t", "--url", server.url]
    tail = zygote.popen(
        [*command, "--changes", "--from-start", "--filter", "id < 5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert tail.stdout is not None and tail.stderr is not None
        assert "changes of tailed.t" in tail.stderr.readline().decode()
        first = json.loads(tail.stdout.readline())
        assert (first["id"], first["name"], first[CHANGE_TYPE]) == (1, "a", "insert")
        table.upsert(rows((1, "b")))
        before, after = json.loads(tail.stdout.readline()), json.loads(tail.stdout.readline())
        assert (before["name"], before[CHANGE_TYPE]) == ("a", "update_before")
        assert (after["name"], after[CHANGE_TYPE]) == ("b", "update_after")
        assert before[COMMIT_SEQ] == after[COMMIT_SEQ]
    finally:
        tail.terminate()
        tail.wait(timeout=30)


def test_a_change_plan_ends_at_a_commit_and_the_next_one_goes_on_from_it(tmp_path: Path) -> None:
    """Plans of at most about `plan_page_size` tasks, whole commits each (one at least): the
    feed reads every change, in order, in as many plans as it takes."""
    paged = InProcessServer(tmp_path / "warehouse", env={"ISBRE_PLAN_PAGE_SIZE": "2"}).start()
    try:
        table = new_table(paged, "paged", keyed=False, version=2)
        table.append(rows((0, "z")))
        after = plan(paged, "paged.t", {"filter": False}).json()["isbre-commit-seq"]
        for first in range(1, 10, 3):  # three commits of three files each: one commit a plan
            with table.transaction() as tx:
                for i in range(first, first + 3):
                    tx.append(rows((i, str(i))))
        answer = plan(paged, "paged.t", {"isbre-after-commit-seq": after, "isbre-changes": True}).json()
        commits = {task["isbre-change"]["commit-seq"] for task in answer["file-scan-tasks"]}
        assert len(answer["file-scan-tasks"]) == 3 and commits == {answer["isbre-commit-seq"]}
        feed = TableFeed(paged.url, "paged.t", consumer=None, changes=True)
        feed.position = after
        read: list[dict[str, Any]] = []
        try:
            for _ in range(3):
                read += feed.read(timeout=5).to_pylist()
        finally:
            feed.close()
        assert [row["id"] for row in read] == list(range(1, 10))
        assert [row[COMMIT_SEQ] for row in read] == sorted(row[COMMIT_SEQ] for row in read)
    finally:
        paged.stop()
