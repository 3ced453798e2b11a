"""A change plan nets out the rows a copy-on-write commit carried over: its tasks, each read alone
with its delete files applied (PyIceberg's reader, which applies position deletes, the catalog's
among them; equality deletes applied as the spec says), hand over exactly the rows the commit
changed, no reader netting anything. The model is the difference between the table's states as
DuckDB's iceberg extension reads them (PyIceberg on format v3)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from isbre.catalog.change_types import CHANGE_TYPE
from isbre.catalog.file_uris import local_path
from isbre.events import TableFeed
from isbre.events.change_reads import read_tasks
from isbre.sinks.iceberg import IcebergSink
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.rest.scan_planning import PlanCompleted
from pyiceberg.expressions import EqualTo, In
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from tests.appenders import SCHEMA, V3Appender, tags
from tests.http_client import http
from tests.openapi import check
from tests.row_deltas import commit_deletes, position_deletes
from tests.server import InProcessServer, IsbreServer, on_threads
from tests.test_change_feed import (
    Change,
    Model,
    differences,
    maintain,
    new_table,
    plan,
    position_of,
    rows,
    span,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    running = InProcessServer(tmp_path_factory.mktemp("carried") / "warehouse").start()
    yield running
    running.stop()


def cursor(server: IsbreServer, name: str) -> int:
    found: int = plan(server, name, {"filter": False}).json()["isbre-commit-seq"]
    return found


def planned_changes(server: IsbreServer, table: Table, after: int) -> tuple[list[Change], dict[str, Any]]:
    """What a change plan after `after` says each commit did, its tasks read one by one with
    PyIceberg's reader as they come (no netting of the reader's own), and the plan."""
    name = ".".join(table.name())
    answer = plan(server, name, {"isbre-after-commit-seq": after, "isbre-changes": True})
    assert answer.status_code == 200, answer.text
    check(answer)  # the catalog's position delete files as the spec's content files
    found = answer.json()
    parsed = PlanCompleted.model_validate(found)
    table.refresh()
    commits: dict[int, Change] = {}
    for task, raw in zip(parsed.file_scan_tasks or [], found["file-scan-tasks"], strict=True):
        change = raw["isbre-change"]
        assert change["type"] != "deleted-rows"  # copy-on-write commits only here
        deleted, inserted = commits.setdefault(change["commit-seq"], (Counter(), Counter()))
        read = read_tasks(table, [task], parsed.delete_files or [])
        side = inserted if change["type"] == "added-rows" else deleted
        side.update(tuple(row.values()) for row in read.to_pylist())
    return [commits[seq] for seq in sorted(commits)], found


def test_a_copy_on_write_commit_s_tasks_read_only_the_rows_it_changed(
    server: IsbreServer, tmp_path: Path
) -> None:
    table = new_table(server, "cow", keyed=True, version=2)
    model = Model(tmp_path)
    table.append(rows(*((n, f"v{n}") for n in range(1, 101))))
    table.append(rows((101, "x"), (102, "y")))
    model.step(table)
    after = cursor(server, "cow.t")
    table.delete(EqualTo("id", 50))  # one of 100 rows goes; 99 are written again
    model.step(table)
    table.overwrite(rows((7, "seven"), (200, "new")), overwrite_filter=In("id", [7, 101]))
    model.step(table)
    table.upsert(rows((8, "eight"), (9, "v9"), (300, "z")))  # 9 unchanged: no change
    model.step(table)

    changes, found = planned_changes(server, table, after)
    assert changes == differences(model.states[1:])
    carried = [
        found["delete-files"][i]
        for task in found["file-scan-tasks"]
        for i in task.get("delete-file-references", [])
    ]
    assert carried, "the catalog's position delete files name the carried rows"
    # Answered whole: the plan id the spec asks of a completed answer has nothing left to fetch.
    fetched = http.get(f"{server.url}/v1/isbre/namespaces/cow/tables/t/plan/{found['plan-id']}")
    assert fetched.status_code == 404 and fetched.json()["error"]["type"] == "NoSuchPlanIdException"
    for task in found["file-scan-tasks"]:
        assert "carried-rows-included" not in task["isbre-change"]
        for i in task.get("delete-file-references", []):
            deletes = found["delete-files"][i]
            assert deletes["content"] == "position-deletes"
            assert deletes["referenced-data-file"] == task["data-file"]["file-path"]
    # Worked out once: a second plan names the same files, not written again.
    written = {d["file-path"]: local_path(d["file-path"]).stat().st_mtime_ns for d in found["delete-files"]}  # type: ignore[union-attr]
    again = planned_changes(server, table, after)[1]["delete-files"]
    assert {d["file-path"]: local_path(d["file-path"]).stat().st_mtime_ns for d in again} == written  # type: ignore[union-attr]


def test_plans_racing_to_net_one_commit_all_hand_over_its_change(server: IsbreServer, tmp_path: Path) -> None:
    """Six plans at once, each finding the commit not netted yet: every one is answered with files
    whole (each written beside and renamed), and each reads the one row deleted."""
    table = new_table(server, "raced", keyed=False, version=2)
    table.append(rows(*((n, f"v{n}") for n in range(2000))))
    after = cursor(server, "raced.t")
    table.delete(EqualTo("id", 1234))
    found: list[list[Change]] = []
    on_threads(lambda _: found.append(planned_changes(server, table, after)[0]), range(6))
    assert found == [[(Counter({(1234, "v1234"): 1}), Counter())]] * 6


def test_a_removed_file_s_own_deletes_apply_before_netting(server: IsbreServer, tmp_path: Path) -> None:
    table = new_table(server, "predeleted", keyed=False, version=2)
    model = Model(tmp_path)
    table.append(rows((1, "a"), (2, "b"), (3, "c"), (2, "b")))
    commit_deletes(table, [position_deletes(table, *position_of(table, 1))])
    table.refresh()
    model.step(table)
    after = cursor(server, "predeleted.t")
    table.delete(EqualTo("id", 3))  # 2 twice carried over; 1, deleted before, is not deleted again
    model.step(table)
    changes, _ = planned_changes(server, table, after)
    assert changes == differences(model.states[1:]) == [(Counter({(3, "c"): 1}), Counter())]


def test_a_partitioned_table_s_rewrites_are_netted_in_each_partition(
    server: IsbreServer, tmp_path: Path
) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("parted")
    fields = (NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name"))
    table = catalog.create_table("parted.t", Schema(*fields, identifier_field_ids=[1]), partition_spec=spec)
    model = Model(tmp_path)
    table.append(rows((1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c")))
    model.step(table)
    after = cursor(server, "parted.t")
    table.delete(EqualTo("id", 2))
    model.step(table)
    table.upsert(rows((1, "b"), (6, "c")))  # 1 moves from partition a to b
    model.step(table)
    changes, _ = planned_changes(server, table, after)
    assert changes == differences(model.states[1:])


def test_an_upsert_table_s_equality_deletes_apply_before_netting(server: IsbreServer, tmp_path: Path) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("upserted")
    model = Model(tmp_path)
    with IcebergSink(catalog, "upserted.people", key=["id"]) as sink:
        sink.push(rows((1, "ann"), (2, "bob"), (3, "cy")).to_batches()[0], span(0, 3))
        sink.push(
            rows(
                (2, "bo"),
            ).to_batches()[0],
            span(3, 4),
        )  # an equality delete of 2 and the new row
        sink.finish()
    table = catalog.load_table("upserted.people")
    model.step(table)
    after = cursor(server, "upserted.people")
    # Every file goes; the rows of 1 and 2 (with the sink's provenance) are written again.
    columns = table.schema().as_arrow()
    kept = [row for row in model.states[-1] if row[0] != 3]
    added = (5, "eve", *[None] * (len(columns) - 2))
    table.overwrite(
        pa.Table.from_pylist([dict(zip(columns.names, r, strict=True)) for r in [*kept, added]], columns)
    )
    model.step(table)
    changes, _ = planned_changes(server, table, after)
    assert changes == differences(model.states[1:])
    ((deleted, inserted),) = changes
    assert [row[:2] for row in deleted] == [(3, "cy")] and list(inserted) == [added]


def test_a_format_v3_rewrite_is_netted_whole_rows_alike(server: IsbreServer, tmp_path: Path) -> None:
    """An engine's copy-on-write rewrite of a v3 table (PyIceberg 0.12 writes no v3 commit): a row
    written again the same is carried over, whether the engine kept its `_row_id` or not."""
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("rewritten_v3")
    table = catalog.create_table("rewritten_v3.t", SCHEMA, properties={"format-version": "3"})
    appender = V3Appender(server.url, "rewritten_v3.t")
    model = Model(tmp_path)
    appender.append(pa.table({"writer": [0, 0, 0, 0], "seq": [0, 1, 2, 3]}, schema=SCHEMA), tags(0, 0))
    model.step(table)
    after = cursor(server, "rewritten_v3.t")
    (task,) = table.scan().plan_files()
    first = table.metadata.snapshots[-1].first_row_id
    assert first is not None
    rewritten = {"writer": [0, 0, 0, 7], "seq": [0, 1, 20, 7], "_row_id": [first, None, first + 2, None]}
    appender.rewrite(
        task.file.file_path, pa.table(rewritten, schema=SCHEMA.append(pa.field("_row_id", pa.int64())))
    )
    model.step(table)
    changes, _ = planned_changes(server, table, after)
    assert changes == differences(model.states[1:])
    assert changes == [(Counter({(0, 2): 1, (0, 3): 1}), Counter({(0, 20): 1, (7, 7): 1}))]


def test_an_index_a_writer_planted_hands_out_no_file_but_the_catalog_s(server: IsbreServer) -> None:
    """A writer may write anything in its table's folders, an index of carried rows included: one
    naming a file elsewhere (another table's) is not believed; the catalog nets the commit again."""
    victim = new_table(server, "victim", keyed=False, version=2)
    victim.append(rows((1, "a")))
    (their_file,) = [task.file.file_path for task in victim.scan().plan_files()]
    table = new_table(server, "planted", keyed=False, version=2)
    table.append(rows((1, "a"), (2, "b"), (3, "c")))
    after = cursor(server, "planted.t")
    table.delete(EqualTo("id", 2))
    table.refresh()
    snapshot = table.current_snapshot()
    assert snapshot is not None
    removed = [task.file.file_path for task in table.scan().plan_files()]
    folder = local_path(snapshot.manifest_list)
    assert folder is not None
    planted = {"data-file": removed[0], "location": their_file, "record-count": 1, "file-size-in-bytes": 1}
    (folder.parent / f"isbre-carried-{snapshot.snapshot_id}").mkdir()
    (folder.parent / f"isbre-carried-{snapshot.snapshot_id}" / "index.json").write_text(
        json.dumps({"files": [planted]})
    )
    changes, found = planned_changes(server, table, after)
    assert their_file not in [d["file-path"] for d in found["delete-files"]]
    assert changes == [(Counter({(2, "b"): 1}), Counter())]


def test_the_carried_files_stay_while_their_snapshot_does_and_go_with_it(
    server: IsbreServer, tmp_path: Path
) -> None:
    table = new_table(server, "kept", keyed=False, version=2)
    table.append(rows((1, "a"), (2, "b"), (3, "c")))
    after = cursor(server, "kept.t")
    table.delete(EqualTo("id", 2))
    found = planned_changes(server, table, after)[1]
    paths = [local_path(d["file-path"]) for d in found["delete-files"]]
    assert paths and all(p is not None and p.exists() for p in paths)
    index = paths[0].parent / "index.json"  # type: ignore[union-attr]
    assert index.exists()
    with table.transaction() as change:
        change.set_properties({"isbre.maintenance.orphan-files.min-age-ms": "1"})
    maintain(server, table, "remove-orphan-files")
    assert all(p.exists() for p in paths if p is not None), "kept while the snapshot is the table's"

    with table.transaction() as change:
        change.set_properties({"history.expire.max-snapshot-age-ms": "1"})
    table.append(rows((4, "d")))
    maintain(server, table, "expire-snapshots")
    table.refresh()
    assert len(table.metadata.snapshots) == 1
    maintain(server, table, "remove-orphan-files")
    assert not any(p.exists() for p in paths if p is not None) and not index.exists()


def test_a_purge_removes_the_carried_files(server: IsbreServer) -> None:
    table = new_table(server, "purged", keyed=False, version=2)
    table.append(rows((1, "a"), (2, "b")))
    after = cursor(server, "purged.t")
    table.delete(EqualTo("id", 1))
    found = planned_changes(server, table, after)[1]
    folder = local_path(found["delete-files"][0]["file-path"])
    assert folder is not None and folder.exists()
    RestCatalog("isbre", uri=server.url).purge_table("purged.t")
    assert not folder.parent.exists()


def test_a_format_v1_table_gets_no_delete_files(server: IsbreServer, tmp_path: Path) -> None:
    """Format v1 has no delete files: a reader may refuse a task that lists one. Its copy-on-write
    commits are left to the reader to net, and say so."""
    table = new_table(server, "old", keyed=False, version=1)
    model = Model(tmp_path)
    table.append(rows((1, "a"), (2, "b"), (3, "c")))
    model.step(table)
    after = cursor(server, "old.t")
    table.delete(EqualTo("id", 2))
    model.step(table)
    changes, found = planned_changes(server, table, after)
    assert found["delete-files"] == []
    assert all(task["isbre-change"]["carried-rows-included"] for task in found["file-scan-tasks"])
    ((deleted, inserted),) = changes
    assert [(deleted - inserted, inserted - deleted)] == differences(model.states[1:])


def test_a_commit_over_the_limit_is_left_to_the_reader_to_net(tmp_path: Path) -> None:
    env = {"ISBRE_CHANGE_NET_MAX_ROWS": "3"}
    server = InProcessServer(tmp_path / "warehouse", env=env).start()
    try:
        table = new_table(server, "large", keyed=False, version=2)
        table.append(rows((1, "a"), (2, "b"), (3, "c")))
        after = cursor(server, "large.t")
        feed = TableFeed(server.url, "large.t", consumer=None, changes=True)  # from here on
        try:
            table.delete(EqualTo("id", 2))  # 3 rows removed, 2 written: 5 rows to read
            changes, found = planned_changes(server, table, after)
            assert found["delete-files"] == []
            assert all(task["isbre-change"]["carried-rows-included"] for task in found["file-scan-tasks"])
            ((deleted, inserted),) = changes
            assert (deleted - inserted, inserted - deleted) == (Counter({(2, "b"): 1}), Counter())
            read = feed.read(timeout=5).to_pylist()  # the feed nets them itself
            assert [(row["id"], row[CHANGE_TYPE]) for row in read] == [(2, "delete")]
        finally:
            feed.close()
    finally:
        server.stop()
