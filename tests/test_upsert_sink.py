"""Keyed sinks: a row pushed replaces the row of its key, `delete` removes keys, each commit one
equality delete file beside its rows, exactly once per offset like an append. What the table
reads (DuckDB's iceberg extension applies equality deletes; PyIceberg 0.12 reads none) is
compared with a model: a dict from key to row, changed in push order."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from isbre.sinks.contract import OffsetSpan, Receipt, SinkError
from isbre.sinks.iceberg import IcebergSink
from isbre.sinks.lane import PipelinedSink
from pyiceberg.catalog.rest import RestCatalog

from tests import zygote
from tests.duck import connect
from tests.http_client import http
from tests.server import IsbreServer

KEYED = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


def span(start: int, end: int) -> OffsetSpan:
    return OffsetSpan("kafka-1", "people", 0, start, end)


def people(*rows: tuple[int, str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"id": i, "name": n} for i, n in rows], schema=KEYED)


def keys(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


def read(catalog: RestCatalog, ident: str, workdir: Path) -> dict[int, str]:
    table = catalog.load_table(ident)
    found = connect(workdir).execute("SELECT id, name FROM iceberg_scan(?)", [table.metadata_location])
    pairs = found.fetchall()
    assert len({i for i, _ in pairs}) == len(pairs), f"a key read twice: {sorted(pairs)}"
    return dict(pairs)


# The changes of the test below, in push order: (offset start, rows pushed or keys deleted).
CHANGES: list[tuple[int, list[tuple[int, str]] | list[int]]] = [
    (0, [(1, "ann"), (2, "bob"), (3, "cy")]),
    (3, [(2, "bo"), (4, "dee"), (2, "bobby")]),  # two rows of key 2 in one batch: the later stays
    (6, [3]),  # deletes key 3
    (7, [(5, "eve")]),
    (8, [5]),  # pushed and deleted in one commit: not written
    (9, [6]),  # a key no row has: nothing happens
    (10, [(6, "fay")]),  # deleted, then pushed in one commit: written
]
COMMITS = (1, 3, 7)  # finish() after these many changes


def apply(sink: IcebergSink, first: int, last: int) -> None:
    """Push the changes `first` to `last` (exclusive) of CHANGES, finishing where COMMITS says."""
    for number in range(first, last):
        start, change = CHANGES[number]
        if change and isinstance(change[0], tuple):
            sink.push(people(*change), span(start, start + len(change)))  # type: ignore[arg-type]
        else:
            sink.delete(keys(*change), span(start, start + len(change)))  # type: ignore[arg-type]
        if number + 1 in COMMITS:
            sink.finish()


def model(changes: int) -> dict[int, str]:
    state: dict[int, str] = {}
    for _, change in CHANGES[:changes]:
        for item in change:
            if isinstance(item, tuple):
                state[item[0]] = item[1]
            else:
                state.pop(item, None)
    return state


def test_rows_replace_their_key_and_deletes_remove_it(
    rest_catalog: RestCatalog, namespace: str, tmp_path: Path
) -> None:
    ident = f"{namespace}.people"
    with IcebergSink(rest_catalog, ident, key=["id"]) as sink:
        done = 0
        for commit in COMMITS:
            apply(sink, done, commit)
            done = commit
            assert read(rest_catalog, ident, tmp_path) == model(commit)
    assert model(len(CHANGES)) == {1: "ann", 2: "bobby", 4: "dee", 6: "fay"}
    table = rest_catalog.load_table(ident)
    key = table.schema().find_field("id")  # the sink made the table with its key as identity
    assert key.required and table.schema().identifier_field_ids == [key.field_id]
    snapshots = table.metadata.snapshots
    # Each commit after the first: one overwrite snapshot adding one equality delete file.
    summaries = [s.summary for s in snapshots if s.summary is not None]
    assert [s.operation.value for s in summaries] == ["overwrite"] * len(COMMITS)
    assert all(s.additional_properties.get("added-equality-delete-files") == "1" for s in summaries)


def test_a_replay_changes_nothing(rest_catalog: RestCatalog, namespace: str, tmp_path: Path) -> None:
    """A keyed sink restarted after a crash pushes its spans again: every offset is covered, so
    no row is written twice and no delete is applied again (it would remove a newer row)."""
    ident = f"{namespace}.people"
    with IcebergSink(rest_catalog, ident, key=["id"]) as sink:
        apply(sink, 0, len(CHANGES))
    before = rest_catalog.load_table(ident).metadata.current_snapshot_id
    with IcebergSink(rest_catalog, ident, key=["id"]) as again:
        apply(again, 0, len(CHANGES))
    assert rest_catalog.load_table(ident).metadata.current_snapshot_id == before
    assert read(rest_catalog, ident, tmp_path) == model(len(CHANGES))


def test_the_server_plans_the_equality_deletes(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    with IcebergSink(rest_catalog, f"{namespace}.people", key=["id"]) as sink:
        apply(sink, 0, 3)
    answer = http.post(f"{server.url}/v1/isbre/namespaces/{namespace}/tables/people/plan", json={})
    assert answer.status_code == 200, answer.text
    deletes = answer.json()["delete-files"]
    assert [(d["content"], d["equality-ids"], d["record-count"]) for d in deletes] == [
        ("equality-deletes", [1], 3)  # keys 2, 3 and 4 of the second commit
    ]


def test_what_a_keyed_sink_refuses(rest_catalog: RestCatalog, namespace: str) -> None:
    plain = IcebergSink(rest_catalog, f"{namespace}.plain")
    with pytest.raises(SinkError, match="only a keyed sink deletes by key"):
        plain.delete(keys(1), span(0, 1))
    with pytest.raises(ValueError, match="distinct column names"):
        IcebergSink(rest_catalog, f"{namespace}.people", key="id")  # type: ignore[arg-type]
    with IcebergSink(rest_catalog, f"{namespace}.people", key=["id"]) as sink:
        with pytest.raises(SinkError, match="does not exist yet"):
            sink.delete(keys(1), span(0, 1))
        sink.push(people((1, "ann")), span(0, 1))
        sink.finish()
        with pytest.raises(SinkError, match="lack \\['id'\\]"):
            sink.delete(pa.table({"name": ["ann"]}), span(1, 2))
    with IcebergSink(rest_catalog, f"{namespace}.people", key=["name"]) as by_name:
        nulls = pa.RecordBatch.from_pylist([{"id": 2, "name": None}], schema=KEYED)
        with pytest.raises(SinkError, match="is null"):
            by_name.push(nulls, span(2, 3))


def test_the_ack_lane_takes_a_keyed_sink_s_rows_and_deletes(
    rest_catalog: RestCatalog, namespace: str, tmp_path: Path
) -> None:
    """The same changes sent through the pipelined lane: bursts of any size, the same table."""
    ident = f"{namespace}.people"

    async def send_all() -> list[Receipt]:
        async with PipelinedSink(rest_catalog, ident, key=["id"]) as lane:
            for start, change in CHANGES:
                if isinstance(change[0], tuple):
                    await lane.send(people(*change), span(start, start + len(change)))  # type: ignore[arg-type]
                else:
                    await lane.delete(keys(*change), span(start, start + len(change)))  # type: ignore[arg-type]
            return await lane.flush()

    receipts = asyncio.run(send_all())
    assert [r.span.start for r in receipts] == [start for start, _ in CHANGES]
    assert read(rest_catalog, ident, tmp_path) == model(len(CHANGES))

    async def unkeyed() -> None:
        async with PipelinedSink(rest_catalog, f"{namespace}.plain") as lane:
            await lane.delete(keys(1), span(0, 1))

    with pytest.raises(SinkError, match="only a keyed sink deletes by key"):
        asyncio.run(unkeyed())


# A producer that applies the first N changes, committing where COMMITS says, and is killed with
# what follows its last commit pushed and not committed (at N = len(CHANGES): after its last
# commit, before anyone heard of it).
CRASHING_PRODUCER = """
import os, signal, sys
from pyiceberg.catalog.rest import RestCatalog
from isbre.sinks.iceberg import IcebergSink
from tests.test_upsert_sink import apply

sink = IcebergSink(RestCatalog("isbre", uri=sys.argv[1]), sys.argv[2], key=["id"])
apply(sink, 0, int(sys.argv[3]))
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("killed_after", [2, 5, len(CHANGES)])
def test_a_replay_after_kill_9_ends_as_the_model(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str, tmp_path: Path, killed_after: int
) -> None:
    ident = f"{namespace}.people"
    command = [sys.executable, "-c", CRASHING_PRODUCER, server.url, ident, str(killed_after)]
    assert zygote.run(command, timeout=120).returncode == -signal.SIGKILL
    with IcebergSink(rest_catalog, ident, key=["id"]) as sink:
        apply(sink, 0, len(CHANGES))
    assert read(rest_catalog, ident, tmp_path) == model(len(CHANGES))
    before = server.high_water()
    with IcebergSink(rest_catalog, ident, key=["id"]) as again:
        apply(again, 0, len(CHANGES))
    assert server.high_water() == before


def test_a_keyed_sink_goes_on_after_losing_a_race_on_the_table_it_made(
    rest_catalog: RestCatalog, namespace: str, tmp_path: Path
) -> None:
    """The sink that creates its table keeps a table it can refresh: its next commit, beaten by
    another writer's, is made again on top of it."""
    ident = f"{namespace}.raced"
    with IcebergSink(rest_catalog, ident, key=["id"]) as sink:
        sink.push(people((1, "ann"), (2, "bob")), span(0, 2))
        sink.finish()
        with IcebergSink(rest_catalog, ident, key=["id"]) as other:
            other.push(people((3, "cy")), OffsetSpan("kafka-2", "people", 0, 0, 1))
            other.finish()
        sink.push(people((2, "bo")), span(2, 3))
        sink.finish()
    assert read(rest_catalog, ident, tmp_path) == {1: "ann", 2: "bo", 3: "cy"}


def test_compaction_applies_a_keyed_table_s_deletes(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str, tmp_path: Path
) -> None:
    """A keyed table's equality deletes are applied by compaction: the table reads the same, from
    one file that no delete applies to."""
    ident = f"{namespace}.people"
    # Compacted when asked, not by the catalog after a commit (its three files are enough).
    properties = {"isbre.maintenance.enabled": "false", "isbre.maintenance.compact.min-input-files": "2"}
    with IcebergSink(rest_catalog, ident, key=["id"], table_properties=properties) as sink:
        apply(sink, 0, len(CHANGES))
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/people"
    answer = http.post(f"{url}/maintenance", json={"jobs": ["compact-data-files"]}, timeout=120)
    assert answer.status_code == 200, answer.text
    (report,) = answer.json()["jobs"]
    assert report["committed"] and report["added-files"] == 1, report
    assert read(rest_catalog, ident, tmp_path) == model(len(CHANGES))
    planned = http.post(f"{url}/plan", json={}).json()
    (task,) = planned["file-scan-tasks"]
    assert "delete-file-references" not in task and task["data-file"]["record-count"] == len(
        model(len(CHANGES))
    )
    # Its delete files applied to nothing left, and went in the same snapshot: PyIceberg, which
    # refuses any equality delete, reads the table again.
    table = rest_catalog.load_table(ident)
    summary = table.metadata.current_snapshot().summary  # type: ignore[union-attr]
    assert summary is not None and summary["total-delete-files"] == "0"
    found = table.scan().to_arrow()
    assert dict(zip(found["id"].to_pylist(), found["name"].to_pylist(), strict=True)) == model(len(CHANGES))
