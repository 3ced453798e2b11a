"""The `Store` contract, run against every store: the embedded LMDB one and PostgreSQL (a real
server started for these tests)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from isbre.catalog.coverage import Span, SpanKey
from isbre.catalog.identifiers import Identifier
from isbre.catalog.lmdb_store import LmdbStore
from isbre.catalog.postgres.store import PostgresStore
from isbre.catalog.records import CommitRecord
from isbre.catalog.sink_rows import SinkRows
from isbre.catalog.store import PendingFile, Pointer, Store, WriteView
from isbre.catalog.store_copy import NotEmptyError, load_store

from tests import zygote
from tests.postgres import PostgresServer
from tests.waiting import eventually

_databases = iter(range(10_000))


KINDS = ["lmdb", "postgresql"]


def open_fresh(kind: str, request: pytest.FixtureRequest, path: Path) -> Store:
    """A new, empty store of `kind` that knows the warehouse "second" besides the first."""
    if kind == "lmdb":
        return LmdbStore(path / f"isbre-{next(_databases)}.lmdb", warehouses=("second",))
    server: PostgresServer = request.getfixturevalue("postgres")
    return PostgresStore(server.database(f"contract_{next(_databases)}"), warehouses=("second",))


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened = open_fresh(request.param, request, tmp_path)
    yield opened
    opened.close()


def record(seq: int, ts: int = 1, namespace: str = "n") -> CommitRecord:
    stamped = CommitRecord("namespace.create", [namespace])
    stamped.stamp(seq, ts)
    return stamped


def test_namespaces_list_children_in_key_order_with_pages(store: Store) -> None:
    with store.write() as view:
        for namespace in [("b",), ("a",), ("a", "x"), ("a", "y"), ("a", "x", "deep"), ("c",)]:
            view.put_namespace(namespace, {"name": ".".join(namespace)})
    with store.read() as view:
        assert view.namespaces((), None, None) == [("a",), ("b",), ("c",)]
        assert view.namespaces((), ("a",), 1) == [("b",)]
        assert view.namespaces(("a",), None, None) == [("a", "x"), ("a", "y")]
        assert view.namespace(("a", "x")) == {"name": "a.x"}
        assert view.namespace(("z",)) is None
        assert not view.is_empty(("a",)) and view.is_empty(("b",))
    with store.write() as view:
        view.delete_namespace(("c",))
    with store.read() as view:
        assert view.namespaces((), None, None) == [("a",), ("b",)]


def test_pointers_and_identifiers(store: Store) -> None:
    with store.write() as view:
        view.put_namespace(("n",), {})
        for name in ("t2", "t1", "t3"):
            view.put_pointer("table", Identifier.of(("n",), name), Pointer(f"file:///{name}", name))
        view.put_pointer("view", Identifier.of(("n",), "v"), Pointer("file:///v", "v"))
    with store.read() as view:
        names = [i.name for i in view.identifiers("table", ("n",), None, None)]
        assert names == ["t1", "t2", "t3"]
        assert [i.name for i in view.identifiers("table", ("n",), "t1", 1)] == ["t2"]
        assert view.pointer("table", Identifier.of(("n",), "t2")) == Pointer("file:///t2", "t2")
        assert view.pointer("table", Identifier.of(("n",), "v")) is None
        assert not view.is_empty(("n",))
    with store.write() as view:
        view.delete_pointer("table", Identifier.of(("n",), "t2"))
    with store.read() as view:
        assert [i.name for i in view.identifiers("table", ("n",), None, None)] == ["t1", "t3"]


def test_the_log_is_gapless_trims_oldest_first_and_keeps_its_high_water(store: Store) -> None:
    with store.read() as view:
        assert (view.commit_seq(), view.log_floor()) == (0, 1)
    with store.write() as view:
        for seq in range(1, 6):
            view.append(record(seq, ts=seq * 10))
        with pytest.raises(AssertionError):
            view.append(record(9))
    with store.read() as view:
        assert [r.commit_seq for r in view.records(2, 2)] == [3, 4]
        assert view.commit_seq() == 5
    with store.write() as view:
        # Records up to 2 may go by count; older than ts 40 by age; none above the ceiling 3.
        assert view.trim_log(keep_after=2, older_than_us=40, ceiling=3, limit=10) == 3
    with store.read() as view:
        assert (view.log_floor(), view.commit_seq()) == (4, 5)
    with store.write() as view:
        assert view.trim_log(keep_after=10, older_than_us=0, ceiling=10, limit=10) == 2
    with store.read() as view:
        assert (view.log_floor(), view.commit_seq(), view.records(0, 10)) == (6, 5, [])


def test_cursors_markers_and_idempotent_responses(store: Store) -> None:
    with store.write() as view:
        view.put_cursor("lineage", 3)
        view.put_cursor("lineage", 4)
        view.set_marker("locations")
        for key, ts in (("k-old", 1), ("k-mid", 2), ("k-new", 3)):
            view.put_idempotent_response(key, {"ts": ts, "outcome": key})
    with store.read() as view:
        assert view.cursors() == {"lineage": 4}
    with store.write() as view:
        view.put_cursor("gone", 1)
        view.delete_cursor("gone")
        view.delete_cursor("never")
    with store.read() as view:
        assert view.cursors() == {"lineage": 4}
        assert view.marker("locations") and not view.marker("other")
        assert view.idempotent_response("k-mid") == {"ts": 2, "outcome": "k-mid"}
    with store.write() as view:
        assert view.trim_idempotency(older_than_us=3, limit=1) == 1  # the oldest first
    with store.read() as view:
        assert view.idempotent_response("k-old") is None and view.idempotent_response("k-mid") is not None


def test_pending_files_are_kept_with_their_bytes_until_forgotten_and_a_savepoint_undoes_them(
    store: Store,
) -> None:
    # Longer than LMDB's largest key: the location is kept whole all the same.
    far = PendingFile("file:///" + "d/" * 400 + "00002-x.metadata.json", "uuid-2", b"\x00{}\xff")
    near = PendingFile("file:///t/metadata/00001-x.metadata.json", "uuid-1", b'{"a": 1}')
    with store.write() as view:
        view.put_pending_file(near)
        with view.savepoint() as inner:
            inner.put_pending_file(far)
        with pytest.raises(RuntimeError), view.savepoint() as inner:
            inner.put_pending_file(PendingFile("file:///undone", "u", b""))
            raise RuntimeError
    with store.read() as view:
        assert sorted(view.pending_files(10), key=lambda f: f.location) == sorted(
            [near, far], key=lambda f: f.location
        )
        assert len(view.pending_files(1)) == 1 and view.pending_count() == 2
        assert {f.data for f in view.pending_files(10, with_data=False)} == {b""}
    with store.write() as view:
        view.delete_pending_files([far.location, "file:///never-kept"])
    with store.read() as view:
        assert view.pending_files(10) == [near] and view.pending_count() == 1


def test_locations_overlap_above_at_and_below(store: Store) -> None:
    with store.write() as view:
        view.place("a", "file:///w/ns/a")
        view.place("b", "file:///w/ns/b")
    with store.read() as view:
        assert view.overlapping("file:///w/ns/a/data") == [("file:///w/ns/a", "a")]
        assert view.overlapping("file:///w/ns") == [("file:///w/ns/a", "a"), ("file:///w/ns/b", "b")]
        assert view.overlapping("file:///w/ns/a") == [("file:///w/ns/a", "a")]
        assert view.overlapping("file:///w/ns/ab") == []  # a sibling that starts alike
        assert (view.placed("a"), view.placed("b"), view.placed("c")) == (
            "file:///w/ns/a",
            "file:///w/ns/b",
            None,
        )
    with store.write() as view:
        view.place("a", "file:///w/ns/moved")  # a move replaces the old place
        view.unplace("b")
    with store.read() as view:
        assert view.overlapping("file:///w/ns") == [("file:///w/ns/moved", "a")]
        assert (view.placed("a"), view.placed("b")) == ("file:///w/ns/moved", None)


def test_a_key_is_kept_for_its_purpose(store: Store) -> None:
    with store.read() as view:
        assert view.key("plan-tokens") is None
    with store.write() as view:
        view.put_key("plan-tokens", bytes(range(32)))
    with store.read() as view:
        assert view.key("plan-tokens") == bytes(range(32)) and view.key("other") is None


def test_coverage_merges_and_is_dropped_with_the_table(store: Store) -> None:
    key = SpanKey("kafka-1", "orders", 0)
    with store.write() as view:
        view.add_coverage("t", [Span(key, 0, 10), Span(key, 20, 30)], 7, 1)
        view.add_coverage("t", [Span(key, 10, 20), Span(SpanKey("kafka-1", "orders", 1), 5, 6)], None, 2)
    with store.read() as view:
        assert view.coverage("t").ranges == {key: [(0, 30)], SpanKey("kafka-1", "orders", 1): [(5, 6)]}
        assert view.snapshot_commit("t", 7) == 1 and view.snapshot_commit("t", 8) is None
    with store.write() as view:
        view.drop_coverage("t")
    with store.read() as view:
        assert view.coverage("t").ranges == {} and view.snapshot_commit("t", 7) is None


def test_row_counts_add_up_per_table_under_its_latest_name_and_go_with_it(store: Store) -> None:
    with store.write() as view:
        view.add_sink_rows(SinkRows("t", "isbre", "n.t", {"accepted": 5, "quarantined.dq": 1}))
        view.add_sink_rows(SinkRows("u", "isbre", "n.u", {"accepted": 1}))
    with store.write() as view:  # the same transaction sees its own addition
        view.add_sink_rows(SinkRows("t", "isbre", "n.renamed", {"accepted": 2, "shed.dq": 1}))
        view.add_sink_rows(SinkRows("t", "isbre", "n.renamed", {"accepted": 1}))
    with store.read() as view:
        assert view.sink_rows("t") == [
            SinkRows("t", "isbre", "n.renamed", {"accepted": 8, "quarantined.dq": 1, "shed.dq": 1})
        ]
        assert sorted(found.table_uuid for found in view.sink_rows(None)) == ["t", "u"]
    with store.write() as view:
        view.drop_coverage("t")
    with store.read() as view:
        assert view.sink_rows("t") == [] and [found.table for found in view.sink_rows(None)] == ["n.u"]


def test_a_failed_transaction_and_a_failed_savepoint_leave_nothing(store: Store) -> None:
    with pytest.raises(RuntimeError), store.write() as view:
        view.put_namespace(("gone",), {})
        raise RuntimeError
    with store.write() as view:
        view.put_namespace(("kept",), {})
        with pytest.raises(RuntimeError), view.savepoint() as inner:
            inner.put_namespace(("undone",), {})
            raise RuntimeError
    with store.read() as view:
        assert view.namespaces((), None, None) == [("kept",)]


def test_a_transaction_sees_its_own_writes_and_a_savepoint_undoes_its_own_only(store: Store) -> None:
    t, u = Identifier.of(("n",), "t"), Identifier.of(("n",), "u")
    with store.write() as view:
        view.put_namespace(("n",), {"v": "1"})
        view.put_pointer("table", t, Pointer("file:///t1", "t"))
        view.put_pointer("table", t, Pointer("file:///t2", "t"))  # the last write of a key wins
        assert view.pointer("table", t) == Pointer("file:///t2", "t")
        view.append(record(1))
        with pytest.raises(RuntimeError), view.savepoint() as inner:
            inner.put_pointer("table", u, Pointer("file:///u", "u"))
            inner.put_namespace(("n",), {"v": "2"})
            assert [i.name for i in inner.identifiers("table", ("n",), None, None)] == ["t", "u"]  # a listing
            inner.append(record(2))
            inner.delete_pointer("table", t)
            assert inner.pointer("table", t) is None and inner.commit_seq() == 2
            raise RuntimeError
        assert view.pointer("table", u) is None and view.namespace(("n",)) == {"v": "1"}
        assert view.pointer("table", t) == Pointer("file:///t2", "t") and view.commit_seq() == 1
        with view.savepoint() as inner:
            inner.put_namespace(("n", "child"), {})
            assert inner.namespaces(("n",), None, None) == [("n", "child")]
            inner.delete_namespace(("n", "child"))
        assert view.namespaces(("n",), None, None) == []
        view.put_idempotent_response("k", {"ts": 5, "outcome": "x"})
        assert view.idempotent_response("k") == {"ts": 5, "outcome": "x"}
    with store.read() as view:
        assert view.pointer("table", t) == Pointer("file:///t2", "t") and view.pointer("table", u) is None
        assert view.namespace(("n",)) == {"v": "1"} and view.namespaces(("n",), None, None) == []
        assert [r.commit_seq for r in view.records(0, 10)] == [1] and view.commit_seq() == 1
        assert view.idempotent_response("k") == {"ts": 5, "outcome": "x"}


def test_warehouses_see_their_own_namespaces_and_objects_only(store: Store) -> None:
    with store.write() as view:
        view.put_namespace(("n",), {"in": "first"})
        second = view.scoped("second")
        second.put_namespace(("n",), {"in": "second"})
        second.put_pointer("table", Identifier.of(("n",), "t"), Pointer("file:///t", "t"))
    with store.read() as first, store.read("second") as second:
        assert first.namespace(("n",)) == {"in": "first"} and second.namespace(("n",)) == {"in": "second"}
        assert first.identifiers("table", ("n",), None, None) == []
        assert [i.name for i in second.identifiers("table", ("n",), None, None)] == ["t"]


def test_concurrent_writers_append_one_gapless_log(store: Store) -> None:
    def append(count: int) -> None:
        for _ in range(count):
            with store.write() as view:
                view.append(record(view.commit_seq() + 1))

    threads = [threading.Thread(target=append, args=(25,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with store.read() as view:
        assert [r.commit_seq for r in view.records(0, 1000)] == list(range(1, 101))


def test_a_database_password_never_shows() -> None:
    store = PostgresStore("postgresql://isbre:hunter2@127.0.0.1:1/catalog", migrate=False)
    try:
        assert "hunter2" not in store.url and "hunter2" not in str(store.describe())
    finally:
        store.close()


def test_a_schema_newer_than_this_isbre_is_refused(postgres: PostgresServer) -> None:
    url = postgres.database(f"contract_{next(_databases)}")
    PostgresStore(url).close()
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("UPDATE isbre_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(RuntimeError, match="schema 99; this isbre knows up to 1"):
        PostgresStore(url)


def test_a_warehouse_the_store_was_not_opened_with_is_a_key_error(store: Store) -> None:
    with pytest.raises(KeyError, match="nosuch"), store.read("nosuch"):
        pass
    with store.write() as view, pytest.raises(KeyError, match="nosuch"):
        view.scoped("nosuch")


def test_prefetched_pointers_read_as_unprefetched_ones(store: Store) -> None:
    t, missing = Identifier.of(("n",), "t"), Identifier.of(("n",), "missing")
    with store.write() as view:
        view.put_pointer("table", t, Pointer("file:///t", "t"))
        view.scoped("second").put_pointer("table", t, Pointer("file:///second-t", "t2"))
    with store.write() as view:
        view.prefetch("table", [("", t), ("", missing), ("second", t)])
        assert view.pointer("table", t) == Pointer("file:///t", "t")
        assert view.pointer("table", missing) is None
        assert view.scoped("second").pointer("table", t) == Pointer("file:///second-t", "t2")


def test_transact_commits_what_the_work_did_or_nothing(store: Store) -> None:
    def work(view: WriteView) -> int:
        view.put_namespace(("done",), {})
        return 7

    assert store.transact(work) == 7

    def failing(view: WriteView) -> None:
        view.put_namespace(("undone",), {})
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        store.transact(failing)
    with store.read() as view:
        assert view.namespaces((), None, None) == [("done",)]


# Another process's commit to the LMDB store at argv[1] (one process may not open it twice).
_COMMIT_ELSEWHERE = """
import sys
from pathlib import Path
from isbre.catalog.lmdb_store import LmdbStore
store = LmdbStore(Path(sys.argv[1]))
with store.write() as view:
    view.put_namespace(("elsewhere",), {})
store.close()
"""


def test_another_stores_commit_notifies_whoever_listens_or_the_store_says_to_poll(store: Store) -> None:
    """Listeners hear of commits made through another open store (another process), and of the
    store's own only where the store cannot tell them apart (LMDB: None, look)."""
    heard: list[int | None] = []
    if not store.on_commit(heard.append):
        assert isinstance(store, LmdbStore) and sys.platform != "linux"  # readers poll the file
        return
    if isinstance(store, LmdbStore):
        time.sleep(0.6)  # what opening the store wrote has settled (file_changes.SETTLE_S)
        heard.clear()
        time.sleep(0.3)
        assert heard == [], "an idle store's listeners were called: it polls"
        zygote.run([sys.executable, "-c", _COMMIT_ELSEWHERE, str(store.path)], check=True)
        eventually(lambda: heard, "another process's commit notified")
        assert set(heard) == {None}
        with store.read() as view:
            assert ("elsewhere",) in view.namespaces((), None, None)
        return
    assert isinstance(store, PostgresStore)
    other = PostgresStore(store.url)
    seq = 0

    def other_commits() -> int:
        nonlocal seq
        seq += 1
        with other.write() as view:
            view.append(record(seq))
        return seq

    try:
        # The listener connects on a thread of its own: the other store commits until it is heard.
        eventually(lambda: other_commits() - 1 in heard, "the other store's commits notified")
        with store.write() as view:
            own = seq = seq + 1
            view.append(record(own))
        last = other_commits()
        eventually(lambda: last in heard, "the other store's commit after the store's own notified")
        assert own not in heard, "the store's own commit, notified before the other's, reached its listener"
    finally:
        other.close()


def test_catching_up_changes_nothing_and_reads_see_the_latest_commit(store: Store) -> None:
    with store.write() as view:
        view.append(record(1))
    store.catch_up()
    store.catch_up()  # with nothing new
    with store.read() as view:
        assert [r.commit_seq for r in view.records(0, 10)] == [1]


def test_a_lease_is_held_until_released(store: Store) -> None:
    lease = store.try_lease("contract")
    assert lease is not None and lease.held()
    assert store.try_lease("contract") is None  # one holder at a time
    lease.release()
    again = store.try_lease("contract")
    assert again is not None and again.held()
    again.release()


def _fill(store: Store) -> None:
    key = SpanKey("kafka-1", "orders", 0)
    with store.write() as view:
        view.put_namespace(("n",), {"p": "1"})
        view.put_namespace(("n", "deep"), {})
        view.put_pointer("table", Identifier.of(("n",), "t"), Pointer("file:///w/n/t/metadata/1.json", "t"))
        view.put_pointer("view", Identifier.of(("n",), "v"), Pointer("file:///w/n/v/metadata/1.json", "v"))
        second = view.scoped("second")
        second.put_namespace(("other",), {})
        second.put_pointer("table", Identifier.of(("other",), "t"), Pointer("file:///w2/t/m.json", "t2"))
        for seq in range(1, 6):
            view.append(record(seq, ts=seq))
        view.trim_log(keep_after=2, older_than_us=0, ceiling=5, limit=10)  # the log starts at 3
        view.put_cursor("lineage", 4)
        view.set_marker("locations")
        view.put_idempotent_response("k", {"ts": 9, "outcome": "x"})
        view.place("t", "file:///w/n/t")
        view.add_coverage("t", [Span(key, 0, 10), Span(key, 20, 30)], 77, 4)
        view.put_sink_rows(SinkRows("t", "isbre", "n.t", {"accepted": 7}))
        view.put_pending_file(PendingFile("file:///w/n/t/metadata/1.json", "t", b"{}"))


def _state(store: Store) -> set[object]:
    return {repr(entry) for entry in store.export()}


@pytest.mark.parametrize("target_kind", KINDS)
def test_export_then_load_into_either_kind_keeps_everything(
    store: Store, target_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    _fill(store)
    target = open_fresh(target_kind, request, tmp_path)
    try:
        counts = load_store(target, store.export())
        assert counts["record"] == 3 and counts["pointer"] == 3 and counts["coverage"] == 2
        assert counts["pending_file"] == 1
        assert _state(target) == _state(store)
        with target.read() as view:
            assert (view.log_floor(), view.commit_seq()) == (3, 5)
            assert view.coverage("t").ranges == {SpanKey("kafka-1", "orders", 0): [(0, 10), (20, 30)]}
            assert view.snapshot_commit("t", 77) == 4
            assert view.sink_rows("t") == [SinkRows("t", "isbre", "n.t", {"accepted": 7})]
            assert view.overlapping("file:///w/n/t/data") == [("file:///w/n/t", "t")]
        with target.write() as view:  # the log goes on from the loaded high-water
            view.append(record(6))
        with pytest.raises(NotEmptyError):  # into a store that holds a catalog: nothing lands
            load_store(target, store.export())
        with target.read() as view:
            assert view.commit_seq() == 6
    finally:
        target.close()
