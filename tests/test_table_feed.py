"""Tables as streams: consumer cursors the catalog keeps (compare-and-set, lag), and `TableFeed`,
which hands over each appended row once across restarts of the consumer and of the server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from isbre.events import TableFeed
from isbre.events.table_feed import FeedResyncError, RowsRewrittenError
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.expressions import LessThan
from pyiceberg.table import Table

from tests import zygote
from tests.http_client import http
from tests.server import InProcessServer, IsbreServer, sse_records
from tests.waiting import eventually

ROWS = 400  # 4 writers, 10 appends of 10 rows each
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("writer", pa.int64())])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    running = InProcessServer(tmp_path_factory.mktemp("feeds") / "warehouse").start()
    yield running
    running.stop()


def batch(first: int, count: int, writer: int = 0) -> pa.Table:
    return pa.table({"id": list(range(first, first + count)), "writer": [writer] * count}, schema=SCHEMA)


def new_table(server: IsbreServer, namespace: str, **properties: str) -> Table:
    """`namespace.t`, new, with `properties`."""
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace(namespace)
    return catalog.create_table(f"{namespace}.t", SCHEMA, properties=properties)


# Table properties under which expiry removes every snapshot but the current one at once.
EAGER_EXPIRY = {"history.expire.max-snapshot-age-ms": "1", "history.expire.min-snapshots-to-keep": "1"}


def strict_and_lenient(
    server: IsbreServer, table: str, rows: int, **lenient: str
) -> tuple[TableFeed, TableFeed]:
    """Two new consumers of `table` from its start, one opened with `lenient` options, each having
    read its `rows` rows and stored its cursor."""
    strict = TableFeed(server.url, table, consumer="strict", from_start=True)
    other = TableFeed(server.url, table, consumer="lenient", from_start=True, **lenient)  # type: ignore[arg-type]
    for feed in (strict, other):
        assert feed.read(timeout=5).num_rows == rows
        feed.commit()
    return strict, other


def consumers(server: IsbreServer, table: str, name: str = "") -> str:
    namespace, table_name = table.split(".")
    base = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{table_name}/consumers"
    return f"{base}/{name}" if name else base


def expire_now(server: IsbreServer, table: str) -> int:
    """Run snapshot expiry on `table` now; the number of snapshots it removed."""
    namespace, name = table.split(".")
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{name}/maintenance"
    answer = http.post(url, json={"jobs": ["expire-snapshots"]})
    assert answer.status_code == 200, answer.text
    return answer.json()["jobs"][0].get("removed-snapshots", 0)


def test_a_consumer_cursor_moves_by_compare_and_set(server: IsbreServer) -> None:
    table = new_table(server, "cas")
    table.append(batch(0, 10))
    cursor = consumers(server, "cas.t", "billing")
    assert http.get(cursor).status_code == 404
    created = http.put(cursor, json={"commit-seq": 1})
    assert created.status_code == 200, created.text
    assert created.json()["behind"] == {"commits": 1, "rows": 10}
    stale = http.put(cursor, json={"commit-seq": 2, "expected-commit-seq": 0})
    assert stale.status_code == 409 and "another instance moved it" in stale.json()["error"]["message"]
    again = http.put(cursor, json={"commit-seq": 1})  # "no cursor yet" no longer holds
    assert again.status_code == 409
    head = http.get(f"{server.url}/v1/events/cursor").json()["commit_seq"]
    moved = http.put(cursor, json={"commit-seq": head, "expected-commit-seq": 1})
    expected = {"name": "billing", "commit-seq": head, "behind": {"commits": 0, "rows": 0}, "expired": False}
    assert moved.json() == expected
    assert http.put(cursor, json={"commit-seq": head + 100, "expected-commit-seq": head}).status_code == 400
    assert http.put(consumers(server, "cas.t", "no/pe"), json={"commit-seq": 1}).status_code in (400, 404)
    assert http.put(consumers(server, "cas.t", "-x"), json={"commit-seq": 1}).status_code == 400
    table.append(batch(10, 5))
    (listed,) = http.get(consumers(server, "cas.t")).json()["consumers"]
    assert listed["name"] == "billing" and listed["behind"] == {"commits": 1, "rows": 5}
    assert http.delete(cursor).status_code == 204
    assert http.get(cursor).status_code == 404
    assert http.delete(cursor).status_code == 404


def test_a_table_s_consumers_go_with_it_and_stay_through_a_rename(server: IsbreServer) -> None:
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("kept")
    catalog.create_table("kept.t", SCHEMA)
    assert http.put(consumers(server, "kept.t", "c"), json={"commit-seq": 0}).status_code == 200
    catalog.rename_table("kept.t", "kept.u")
    assert http.get(consumers(server, "kept.u", "c")).json()["commit-seq"] == 0
    catalog.drop_table("kept.u")
    catalog.create_table("kept.u", SCHEMA)
    assert http.get(consumers(server, "kept.u", "c")).status_code == 404


def plan_and_load_requests(server: IsbreServer) -> int:
    scraped = http.get(f"{server.url}/metrics").text
    routes = r'route="/namespaces/\{namespace\}/tables/\{table\}(?:/plan|/tasks)?"'
    return sum(
        int(n)
        for n in re.findall(
            rf"isbre_http_requests_total\{{method=\"\w+\",{routes},status=\"\d+\"}} (\d+)", scraped
        )
    )


def test_a_feed_hands_over_every_appended_row_once(tmp_path: Path) -> None:
    port_server = InProcessServer(tmp_path / "warehouse").start()
    catalog = RestCatalog("isbre", uri=port_server.url)
    catalog.create_namespace("stream")
    catalog.create_table("stream.t", SCHEMA)
    seen: list[int] = []
    feed = TableFeed(port_server.url, "stream.t", consumer="counter", from_start=True)
    stop = threading.Event()

    def write(writer: int) -> None:
        table = catalog.load_table("stream.t")
        for n in range(10):
            for _ in range(20):  # PyIceberg's own retry, on the commits the other writers won
                try:
                    table.append(batch(writer * 1000 + n * 10, 10, writer))
                    break
                except CommitFailedException:
                    table = catalog.load_table("stream.t")

    writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in writers:
        thread.start()
    try:
        while len(seen) < ROWS:
            rows = feed.read(timeout=10)
            assert rows.num_rows, "no rows came while writers appended"
            seen += rows["id"].to_pylist()
            feed.commit()
            if len(seen) >= ROWS // 2 and not stop.is_set():
                # The consumer restarts: a new feed of the same name goes on from the stored cursor.
                stop.set()
                feed.close()
                feed = TableFeed(port_server.url, "stream.t", consumer="counter")
        for thread in writers:
            thread.join()
        expected = sorted(w * 1000 + n for w in range(4) for n in range(100))
        assert sorted(seen) == expected  # every row, none twice
        # Compaction rewrites every file: nothing comes again.
        compacted = http.post(
            f"{port_server.url}/v1/isbre/namespaces/stream/tables/t/maintenance",
            json={"jobs": ["compact-data-files"]},
            timeout=60,  # the job runs in a process started for it
        )
        assert compacted.status_code == 200, compacted.text
        assert feed.read(timeout=0.5).num_rows == 0
        # An idle feed asks nothing of the server but its open event stream.
        before = plan_and_load_requests(port_server)
        assert feed.read(timeout=5).num_rows == 0
        assert plan_and_load_requests(port_server) == before + 1  # the one plan it woke to make first
    finally:
        feed.close()
        port_server.stop()


def test_a_feed_follows_a_restarted_server(tmp_path: Path) -> None:
    first = InProcessServer(tmp_path / "warehouse").start()
    catalog = RestCatalog("isbre", uri=first.url)
    catalog.create_namespace("restart")
    catalog.create_table("restart.t", SCHEMA).append(batch(0, 3))
    feed = TableFeed(first.url, "restart.t", consumer="c", from_start=True)
    try:
        assert feed.read(timeout=5)["id"].to_pylist() == [0, 1, 2]
        feed.commit()
        first.stop()
        again = InProcessServer(tmp_path / "warehouse", port=first.port).start()
        try:
            RestCatalog("isbre", uri=again.url).load_table("restart.t").append(batch(3, 2))
            assert feed.read(timeout=30)["id"].to_pylist() == [3, 4]
        finally:
            again.stop()
    finally:
        feed.close()


def test_an_overwrite_is_raised_or_skipped_as_asked(server: IsbreServer) -> None:
    table = new_table(server, "rewrites")
    table.append(batch(0, 10))
    strict, lenient = strict_and_lenient(server, "rewrites.t", 10, on_rewrite="skip")
    try:
        table.overwrite(batch(100, 3), overwrite_filter=LessThan("id", 5))
        with pytest.raises(RowsRewrittenError, match="rewrote rows"):
            strict.read(timeout=5)
        assert sorted(lenient.read(timeout=5)["id"].to_pylist()) == [100, 101, 102]
    finally:
        strict.close()
        lenient.close()


def test_isbre_tail_prints_rows_as_they_land(server: IsbreServer) -> None:
    table = new_table(server, "tailed")
    table.append(batch(0, 2))
    command = [sys.executable, "-m", "isbre.rest.cli", "tail", "tailed.t", "--url", server.url]
    tail = zygote.popen(
        [*command, "--from-start", "--consumer", "cli"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert tail.stderr is not None and tail.stdout is not None
        line = tail.stderr.readline()
        assert "connected to" in line and "rows of tailed.t as it is, then each new one" in line, line
        assert [json.loads(tail.stdout.readline())["id"] for _ in range(2)] == [0, 1]
        table.append(batch(7, 1))
        assert json.loads(tail.stdout.readline()) == {"id": 7, "writer": 0}
        stored = eventually(
            lambda: http.get(consumers(server, "tailed.t", "cli")).json().get("commit-seq"), "the cursor"
        )
        assert stored >= 1
    finally:
        tail.terminate()
        tail.wait(timeout=30)
    missing = zygote.run(
        [*command[:4], "nope.t", "--url", server.url], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr


def test_a_new_consumer_of_a_table_without_rows_starts_at_the_log_s_last_commit(server: IsbreServer) -> None:
    """Not at 0: the table was created after other commits, and its rows come after the last."""
    new_table(server, "unwritten")
    head = server.high_water()
    command = [sys.executable, "-m", "isbre.rest.cli", "tail", "unwritten.t", "--url", server.url]
    tail = zygote.popen([*command, "--consumer", "fresh"], stderr=subprocess.PIPE, text=True)
    try:
        assert tail.stderr is not None
        line = tail.stderr.readline()
        assert f"rows of unwritten.t after commit_seq {head}" in line, line
    finally:
        tail.terminate()
        tail.wait(timeout=30)
    assert http.get(consumers(server, "unwritten.t", "fresh")).json()["commit-seq"] == head


def test_expiry_keeps_what_a_consumer_has_not_read_within_its_bounds(server: IsbreServer) -> None:
    table = new_table(server, "held", **EAGER_EXPIRY)
    table.append(batch(0, 5))
    feed = TableFeed(server.url, "held.t", consumer="slow", from_start=True)
    try:
        assert feed.read(timeout=5).num_rows == 5
        feed.commit()
        for n in range(1, 4):
            table.append(batch(n * 10, 5))
        assert expire_now(server, "held.t") == 1  # the one the consumer has read; its three unread stay
        state = http.get(consumers(server, "held.t", "slow")).json()
        assert state["expired"] is False and state["behind"] == {"commits": 3, "rows": 15}
        # Past its bound, the consumer is left behind: expiry goes on, and the feed is told to resync.
        table.catalog.load_table("held.t").transaction().set_properties(
            **{"isbre.consumers.max-snapshots": "2"}
        ).commit_transaction()
        assert expire_now(server, "held.t") >= 2
        state = http.get(consumers(server, "held.t", "slow")).json()
        assert state["expired"] is True and "read the table whole again" in state["message"]
        with pytest.raises(FeedResyncError, match="read the table whole again"):
            feed.read(timeout=5)
    finally:
        feed.close()


def test_closing_a_feed_ends_a_read_that_waits(server: IsbreServer) -> None:
    new_table(server, "closing").append(batch(0, 1))
    feed = TableFeed(server.url, "closing.t", consumer=None)  # from the next commit: nothing to read
    answers: list[pa.Table] = []
    reader = threading.Thread(target=lambda: answers.append(feed.read()))
    reader.start()
    feed.close()
    reader.join(timeout=30)
    assert not reader.is_alive() and answers[0].num_rows == 0
    with pytest.raises(ValueError, match="keeps no cursor"):
        feed.commit()


def test_every_row_of_200_appends_once_while_maintenance_runs_and_both_sides_restart(tmp_path: Path) -> None:
    """4 writers, 50 appends each, on a table the catalog compacts and expires as they go; the
    consumer restarts, then the server does: every row comes once. A second consumer, reading
    and committing at its own pace, gets the same rows on its own."""
    first = InProcessServer(tmp_path / "warehouse").start()
    maintained = {
        "isbre.maintenance.enabled": "true",
        "isbre.maintenance.compact.enabled": "true",
        "isbre.maintenance.compact.min-input-files": "5",
        "history.expire.max-snapshot-age-ms": "1",
        "history.expire.min-snapshots-to-keep": "2",
    }
    catalog = RestCatalog("isbre", uri=first.url)
    catalog.create_namespace("busy")
    catalog.create_table("busy.t", SCHEMA, properties=maintained)
    feed = TableFeed(first.url, "busy.t", consumer="main", from_start=True)
    other = TableFeed(first.url, "busy.t", consumer="other", from_start=True)
    servers = [first]
    # Appends in flight hold a permit: the server restarts between appends, so that none is left
    # not knowing whether it landed (and appended again, twice). Writers wait at the gate while it
    # restarts: a semaphore is not fair, and the restart asking for every permit one by one got
    # them only once the writers, taking them back at once, had all finished.
    appending = threading.Semaphore(4)
    gate = threading.Event()
    gate.set()
    appended: list[int] = []  # after each append, the appends so far
    restarted_after: list[int] = []

    def write(writer: int) -> None:
        for n in range(50):
            while True:
                gate.wait()
                with appending:
                    try:
                        table = RestCatalog("isbre", uri=servers[-1].url).load_table("busy.t")
                        table.append(batch(writer * 1000 + n, 1))
                        appended.append(len(appended) + 1)
                        break
                    # Lost the race; or PyIceberg's own retry found its base snapshot expired.
                    except (CommitFailedException, ValidationException):
                        continue

    writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in writers:
        thread.start()
    seen: list[int] = []
    others: list[int] = []
    try:
        while len(seen) < 200:
            rows = feed.read(timeout=30)
            assert rows.num_rows, f"no rows came with {len(seen)} of 200 read"
            seen += rows["id"].to_pylist()
            feed.commit()
            others += other.read(timeout=0)["id"].to_pylist()
            other.commit()  # a consumer with a stored cursor is one expiry keeps rows for
            if len(seen) >= 60 and feed is not None and len(servers) == 1 and feed.consumer == "main":
                feed.close()  # the consumer restarts from its stored cursor
                feed = TableFeed(first.url, "busy.t", consumer="main")
                gate.clear()
                for _ in range(4):
                    appending.acquire()
                first.stop()  # and then the server
                restarted_after.append(len(appended))
                servers.append(InProcessServer(tmp_path / "warehouse", port=first.port).start())
                for _ in range(4):
                    appending.release()
                gate.set()
        for thread in writers:
            thread.join()
        while len(others) < 200:
            others += other.read(timeout=30)["id"].to_pylist()
            other.commit()
        expected = sorted(w * 1000 + n for w in range(4) for n in range(50))
        assert sorted(seen) == expected and sorted(others) == expected
        assert restarted_after and restarted_after[0] < 150, f"the server restarted after {restarted_after}"
        # The commit log says what the catalog did: its replace snapshots themselves are expired
        # two appends later (the table keeps 2, a millisecond old at most).
        high = http.get(f"{servers[-1].url}/health").json()["components"]["store"]["commit_seq"]
        records = sse_records(servers[-1], until=high, after=0)
        assert any(r.get("job") == "compact-data-files" and r.get("name") == "t" for r in records), (
            "the catalog never compacted the table while it was read"
        )
    finally:
        feed.close()
        other.close()
        servers[-1].stop()


def test_from_start_reads_the_table_as_it_is_whatever_expiry_removed(server: IsbreServer) -> None:
    """A new consumer asking for everything gets the rows the table holds now (not those deleted
    before it came), though the snapshots that appended them were expired, then each new row."""
    table = new_table(server, "whole", **EAGER_EXPIRY)
    for n in range(3):
        table.append(batch(n * 10, 5))
    table.delete(LessThan("id", 3))
    assert expire_now(server, "whole.t") >= 3  # only the delete's snapshot is left
    model = sorted(set(range(0, 5)) - {0, 1, 2} | set(range(10, 15)) | set(range(20, 25)))
    feed = TableFeed(server.url, "whole.t", consumer="late", from_start=True)
    try:
        assert sorted(feed.read(timeout=5)["id"].to_pylist()) == model
        feed.commit()
        table.append(batch(100, 2))
        assert feed.read(timeout=5)["id"].to_pylist() == [100, 101]
        feed.commit()
    finally:
        feed.close()
    # The stored cursor is where the reading left off: a restart reads nothing again.
    again = TableFeed(server.url, "whole.t", consumer="late", from_start=True)
    try:
        assert again.read(timeout=0.5).num_rows == 0
    finally:
        again.close()


def test_a_consumer_past_its_bounds_may_resync_instead_of_failing(server: IsbreServer) -> None:
    table = new_table(server, "resync", **{**EAGER_EXPIRY, "isbre.consumers.max-snapshots": "2"})
    table.append(batch(0, 4))
    strict, lenient = strict_and_lenient(server, "resync.t", 4, on_expired="resync")
    try:
        for n in range(1, 5):
            table.append(batch(n * 10, 2))
        assert expire_now(server, "resync.t") >= 3  # past both consumers' bound of 2 snapshots
        with pytest.raises(FeedResyncError, match="read the table whole again"):
            strict.read(timeout=5)
        # The table as it is now: what the consumer read before comes again (at least once).
        model = [*range(0, 4), *(i for n in range(1, 5) for i in (n * 10, n * 10 + 1))]
        assert sorted(lenient.read(timeout=5)["id"].to_pylist()) == model
        lenient.commit()
        table.append(batch(90, 1))
        assert lenient.read(timeout=5)["id"].to_pylist() == [90]
    finally:
        strict.close()
        lenient.close()
    with pytest.raises(ValueError, match="on_expired"):
        TableFeed(server.url, "resync.t", consumer=None, on_expired="skip")  # type: ignore[arg-type]
