"""Table-to-table pipelines: a feed, a transform and a sink, each source row once in the target
across a SIGKILL at each step, with the source and the transform's column lineage in OpenLineage."""

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

from tests import zygote
from tests.lineage_receiver import Receiver
from tests.server import InProcessServer, IsbreServer
from tests.waiting import eventually

SOURCE = pa.schema([pa.field("id", pa.int64(), nullable=False)])


class Doubled:
    """Adds `doubled`, from `id`."""

    def apply(self, rows: pa.Table) -> pa.Table:
        return rows.append_column("doubled", pc.multiply(rows["id"], 2))

    def column_lineage(self) -> dict[str, list[str]]:
        return {"id": ["id"], "doubled": ["id"]}


# A hop that dies by SIGKILL at one step of its first batch: before the sink commits, between the
# sink's commit and the cursor's, or after both.
DYING_HOP = textwrap.dedent(
    """
    import os, signal, sys
    from pyiceberg.catalog.rest import RestCatalog
    from isbre.events import TableFeed
    from isbre.events.table_feed import TableFeed as Feed
    from isbre.sinks.iceberg import IcebergSink
    from isbre.sinks.pipeline import pipe
    from tests.test_pipeline import Doubled

    url, source, target, step = sys.argv[1:5]
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    if step == "before-sink-commit":
        IcebergSink.finish = lambda self: die()
    else:
        stored = Feed.commit
        def commit(self):
            if step == "after-both":
                stored(self)
            die()
        Feed.commit = commit
    feed = TableFeed(url, source, consumer="hop", from_start=True)
    pipe(feed, Doubled(), IcebergSink(RestCatalog("isbre", uri=url), target))
    """
)


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


@pytest.mark.parametrize("step", ["before-sink-commit", "between-commits", "after-both"])
def test_every_source_row_reaches_the_target_once_across_a_kill(server: IsbreServer, step: str) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    namespace = step.replace("-", "_")
    catalog.create_namespace(namespace)
    source, target = f"{namespace}.source", f"{namespace}.target"
    catalog.create_table(source, SOURCE)
    for first in (0, 10, 20):
        append(catalog, source, first, 10)
    root = Path(__file__).resolve().parent.parent
    hop = zygote.run(
        [sys.executable, "-c", DYING_HOP, server.url, source, target, step], cwd=root, timeout=120
    )
    assert hop.returncode == -9, hop
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
