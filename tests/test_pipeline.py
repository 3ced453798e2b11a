"""Table-to-table pipelines: a feed, a transform and a sink, each source row once in the target
across a SIGKILL at each step, with the source and the transform's column lineage in OpenLineage;
and of a change feed into a keyed sink, the target equal to the transform of the source under
inserts, updates and deletes (the model: the source as PyIceberg reads it, transformed here; the
target as DuckDB reads it, equality deletes applied)."""

from __future__ import annotations

import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from isbre.events import TableFeed
from isbre.sinks.iceberg import IcebergSink
from isbre.sinks.pipeline import pipe
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.expressions import In
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from tests import zygote
from tests.duck import connect
from tests.lineage_receiver import Receiver
from tests.server import InProcessServer, IsbreServer
from tests.waiting import eventually

SOURCE = pa.schema([pa.field("id", pa.int64(), nullable=False)])
KEYED_SOURCE = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("amount", pa.int64())])


class Doubled:
    """Adds `doubled`, from `id`."""

    def apply(self, rows: pa.Table) -> pa.Table:
        return rows.append_column("doubled", pc.multiply(rows["id"], 2))

    def column_lineage(self) -> dict[str, list[str]]:
        return {"id": ["id"], "doubled": ["id"]}


class AmountDoubled:
    """Adds `doubled`, from `amount` (a change feed's change columns pass through as every column does)."""

    def apply(self, rows: pa.Table) -> pa.Table:
        return rows.append_column("doubled", pc.multiply(rows["amount"], 2))

    def column_lineage(self) -> dict[str, list[str]]:
        return {"id": ["id"], "amount": ["amount"], "doubled": ["amount"]}


# A hop that dies by SIGKILL at one step of its first batch: before the sink commits, between the
# sink's commit and the cursor's, or after both. Of rows, or of changes into a keyed sink.
DYING_HOP = textwrap.dedent(
    """
    import os, signal, sys
    from pyiceberg.catalog.rest import RestCatalog
    from isbre.events.table_feed import TableFeed
    from isbre.sinks.iceberg import IcebergSink
    from isbre.sinks.pipeline import pipe
    from tests.test_pipeline import AmountDoubled, Doubled

    url, source, target, step, kind = sys.argv[1:6]
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    changes = kind == "changes"
    # Made first: a new consumer stores its cursor at once, which is not the step that dies.
    feed = TableFeed(url, source, consumer="hop", from_start=True, changes=changes)
    if step == "before-sink-commit":
        IcebergSink.finish = lambda self: die()
    else:
        stored = TableFeed.commit
        def commit(self):
            if step == "after-both":
                stored(self)
            die()
        TableFeed.commit = commit
    sink = IcebergSink(RestCatalog("isbre", uri=url), target, **({"key": ["id"]} if changes else {}))
    pipe(feed, AmountDoubled() if changes else Doubled(), sink)
    """
)
STEPS = ["before-sink-commit", "between-commits", "after-both"]


def die_in_a_hop(server: IsbreServer, source: str, target: str, step: str, kind: str) -> None:
    """Run a hop of `kind` ("rows" or "changes") that dies at `step` of its first batch."""
    root = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-c", DYING_HOP, server.url, source, target, step, kind]
    hop = zygote.run(command, cwd=root, timeout=120)
    assert hop.returncode == -9, hop
    unwritten = RestCatalog("isbre", uri=server.url).load_table(target).metadata.current_snapshot_id is None
    assert unwritten == (step == "before-sink-commit")  # it died where it was told


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[IsbreServer]:
    env = {"ISBRE_LINEAGE_URL": receiver.url}
    running = InProcessServer(tmp_path_factory.mktemp("pipes") / "warehouse", env=env).start()
    yield running
    running.stop()


def append(catalog: RestCatalog, table: str, first: int, count: int) -> None:
    catalog.load_table(table).append(pa.table({"id": list(range(first, first + count))}, schema=SOURCE))


def held(catalog: RestCatalog, table: str) -> int:
    return len(ids(catalog, table)) if catalog.table_exists(table) else 0


def ids(catalog: RestCatalog, table: str) -> list[int]:
    return sorted(catalog.load_table(table).scan().to_arrow()["id"].to_pylist())


@pytest.mark.parametrize("step", STEPS)
def test_every_source_row_reaches_the_target_once_across_a_kill(server: IsbreServer, step: str) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    namespace = step.replace("-", "_")
    catalog.create_namespace(namespace)
    source, target = f"{namespace}.source", f"{namespace}.target"
    catalog.create_table(source, SOURCE)
    for first in (0, 10, 20):
        append(catalog, source, first, 10)
    die_in_a_hop(server, source, target, step, "rows")
    for first in (30, 40):
        append(catalog, source, first, 10)
    # The hop again, from where the catalog says it is (from the start if it stored nothing),
    # until the target holds what there is, or a minute has passed.
    feed = TableFeed(server.url, source, consumer="hop", from_start=True)
    sink = IcebergSink(catalog, target)
    deadline = time.monotonic() + 60
    try:
        pipe(feed, Doubled(), sink, until=lambda: time.monotonic() > deadline or held(catalog, target) >= 50)
    finally:
        feed.close()
        sink.close()
    assert ids(catalog, target) == list(range(50))  # each once
    rows = catalog.load_table(target).scan().to_arrow()
    assert rows["doubled"].to_pylist() == [2 * i for i in rows["id"].to_pylist()]


def test_the_target_s_commits_name_the_source_and_the_column_lineage(
    server: IsbreServer, receiver: Receiver
) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("traced")
    catalog.create_table("traced.source", SOURCE)
    append(catalog, "traced.source", 0, 5)
    feed = TableFeed(server.url, "traced.source", consumer="traced", from_start=True)
    sink = IcebergSink(catalog, "traced.target")
    deadline = time.monotonic() + 60
    try:
        pipe(
            feed,
            Doubled(),
            sink,
            until=lambda: time.monotonic() > deadline or held(catalog, "traced.target") > 0,
        )
    finally:
        feed.close()
        sink.close()

    def run_of_the_target() -> dict | None:
        for event in receiver.snapshot():
            outputs = [o["name"] for o in event.get("outputs", [])]
            if event.get("eventType") == "COMPLETE" and "traced.target" in outputs and event.get("inputs"):
                return event
        return None

    event = eventually(run_of_the_target, "no run of the target's commit named its input")
    assert [i["name"] for i in event["inputs"]] == ["traced.source"]
    fields = event["outputs"][0]["facets"]["columnLineage"]["fields"]
    assert [f["field"] for f in fields["doubled"]["inputFields"]] == ["id"]
    assert fields["doubled"]["inputFields"][0]["name"] == "traced.source"


def rows(amounts: dict[int, int]) -> pa.Table:
    return pa.table({"id": list(amounts), "amount": list(amounts.values())}, schema=KEYED_SOURCE)


def expected(catalog: RestCatalog, source: str) -> dict[int, tuple[int, int]]:
    """The transform of the source as it is: id to (amount, doubled)."""
    found = catalog.load_table(source).scan().to_arrow()
    return {i: (a, 2 * a) for i, a in zip(found["id"].to_pylist(), found["amount"].to_pylist(), strict=True)}


def target_rows(catalog: RestCatalog, target: str, workdir: Path) -> dict[int, tuple[int, int]] | None:
    """The target as DuckDB reads it (equality deletes applied); None before it exists."""
    if not catalog.table_exists(target):
        return None
    location = catalog.load_table(target).metadata_location
    found = connect(workdir).execute("SELECT id, amount, doubled FROM iceberg_scan(?)", [location]).fetchall()
    assert len({i for i, _, _ in found}) == len(found), f"a key twice: {sorted(found)}"
    return {i: (a, d) for i, a, d in found}


@pytest.mark.parametrize("step", STEPS)
def test_a_change_hop_keeps_the_target_the_transform_of_the_source_across_a_kill(
    server: IsbreServer, step: str, tmp_path: Path
) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    namespace = "changes_" + step.replace("-", "_")
    catalog.create_namespace(namespace)
    source, target = f"{namespace}.source", f"{namespace}.target"
    fields = (NestedField(1, "id", LongType(), required=True), NestedField(2, "amount", LongType()))
    table = catalog.create_table(source, Schema(*fields, identifier_field_ids=[1]))
    table.append(rows({i: i for i in range(10)}))
    table.upsert(rows({i: 100 + i for i in range(5)}))  # five updates
    table.delete(In("id", [9]))
    die_in_a_hop(server, source, target, step, "changes")
    table.upsert(rows({5: 200, 6: 201, 10: 210}))  # updates and an insert
    table.delete(In("id", [0, 7]))
    table.append(rows({11: 11, 12: 12}))
    # The hop again, from where the catalog says it is, until the target is what it must be.
    want = expected(catalog, source)
    feed = TableFeed(server.url, source, consumer="hop", from_start=True, changes=True)
    sink = IcebergSink(catalog, target, key=["id"])
    deadline = time.monotonic() + 60
    try:
        pipe(
            feed,
            AmountDoubled(),
            sink,
            until=lambda: time.monotonic() > deadline or target_rows(catalog, target, tmp_path) == want,
        )
    finally:
        feed.close()
        sink.close()
    assert target_rows(catalog, target, tmp_path) == want
    assert want[5] == (200, 400) and 0 not in want and 9 not in want  # the model moved as the source did


def test_a_change_feed_needs_a_keyed_sink(server: IsbreServer) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("unkeyed")
    catalog.create_table("unkeyed.source", KEYED_SOURCE).append(rows({1: 1}))
    feed = TableFeed(server.url, "unkeyed.source", consumer=None, from_start=True, changes=True)
    sink = IcebergSink(catalog, "unkeyed.target")
    try:
        with pytest.raises(ValueError, match="keyed sink"):
            pipe(feed, None, sink, until=lambda: False)
    finally:
        feed.close()
        sink.close()
