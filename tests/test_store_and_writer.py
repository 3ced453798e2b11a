"""The chokepoint itself: group commit, savepoint isolation, map growth, monotonic commit_seq."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from isbre.catalog import CatalogService, Identifier, TableChange
from isbre.catalog.lmdb_store import LmdbStore
from isbre.catalog.warehouses import open_catalog
from isbre.catalog.writer import Writer, WriterOverloadedError
from pyiceberg.exceptions import NamespaceAlreadyExistsError
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import SetPropertiesUpdate
from pyiceberg.types import LongType, NestedField

from tests.waiting import eventually


def test_concurrent_mutations_share_transactions(service: CatalogService) -> None:
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda i: service.namespaces.create((f"ns{i}",), {}), range(400)))
    stats = service.core.writer.stats
    assert stats.mutations == 400
    assert stats.batches < 400, "no two mutations ever shared a transaction"
    assert [r.commit_seq for r in service.core.commit_log.records()] == list(range(1, 401))


def test_a_failing_mutation_does_not_spoil_its_batch(service: CatalogService) -> None:
    service.namespaces.create(("taken",), {})
    start = threading.Barrier(17)

    def create(name: str) -> str:
        start.wait()
        try:
            service.namespaces.create((name,), {})
        except NamespaceAlreadyExistsError:
            return "exists"
        return "ok"

    names = ["taken" if i % 4 == 0 else f"fresh{i}" for i in range(17)]
    with ThreadPoolExecutor(17) as pool:
        outcomes = list(pool.map(create, names))
    assert outcomes == ["exists" if n == "taken" else "ok" for n in names]
    listed = {ns[0] for ns in service.namespaces.listing(())}
    assert listed == {"taken"} | {n for n in names if n != "taken"}
    kinds = [r.kind for r in service.core.commit_log.records()]
    assert kinds == ["namespace.create"] * len(listed)


def test_map_grows_instead_of_failing(tmp_path: Path) -> None:
    service = open_catalog(tmp_path / "wh", map_size=1 << 20)
    try:
        payload = {"blob": "x" * 4000}
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: service.namespaces.create((f"big{i}",), payload), range(1500)))
        assert service.core.store.capacity() > 1 << 20
        assert len(service.namespaces.listing(())) == 1500
        assert service.namespaces.load(("big1499",)) == payload
        assert service.core.commit_log.commit_seq() == 1500
    finally:
        service.close()


def test_commit_seq_continues_after_reopen(tmp_path: Path) -> None:
    service = open_catalog(tmp_path / "wh")
    for i in range(5):
        service.namespaces.create((f"a{i}",), {})
    service.close()
    service = open_catalog(tmp_path / "wh")
    try:
        service.namespaces.create(("after",), {})
        assert [r.commit_seq for r in service.core.commit_log.records()] == [1, 2, 3, 4, 5, 6]
        assert [r.commit_seq for r in service.core.commit_log.records(after=4)] == [5, 6]
    finally:
        service.close()


def test_store_refuses_an_unknown_format(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "db")
    with store.env.begin(write=True) as txn:
        txn.put(b"format", b"99", db=store.dbs["meta"])
    store.close()
    with pytest.raises(RuntimeError, match="format"):
        LmdbStore(tmp_path / "db")


def test_many_writers_on_one_table_never_starve(service: CatalogService) -> None:
    """Commits that need no rebase-sensitive requirement all land, however many race for one table."""
    service.namespaces.create(("ns",), {})
    ident = Identifier.of(["ns"], "hot")
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    service.tables.create(ident, schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER)

    def commit(i: int) -> None:
        service.tables.commit(TableChange(ident, (), (SetPropertiesUpdate(updates={f"k{i}": "v"}),)))

    with ThreadPoolExecutor(48) as pool:
        list(pool.map(commit, range(600)))
    assert {f"k{i}" for i in range(600)} <= set(service.tables.load(ident).metadata.properties)


def test_trimming_keeps_the_newest_records(service: CatalogService) -> None:
    for i in range(25):
        service.namespaces.create((f"n{i}",), {})
    assert service.core.commit_log.log_bounds() == (1, 25)
    year = 365 * 24 * 3600 * 10**6
    assert service.core.commit_log.trim_log(keep_records=10, keep_us=year, chunk=4) == 15
    assert service.core.commit_log.log_bounds() == (16, 25)
    assert [r.commit_seq for r in service.core.commit_log.records()] == list(range(16, 26))
    assert service.core.commit_log.trim_log(keep_records=10, keep_us=year) == 0
    # By age: everything is older than "zero microseconds ago".
    assert service.core.commit_log.trim_log(keep_records=10**9, keep_us=0) == 10
    assert service.core.commit_log.log_bounds() == (26, 25)
    service.namespaces.create(("after",), {})
    assert [r.commit_seq for r in service.core.commit_log.records()] == [26]


def test_trimming_keeps_what_a_consumer_has_not_handled(service: CatalogService) -> None:
    for i in range(20):
        service.namespaces.create((f"n{i}",), {})
    service.core.commit_log.set_consumer_cursor("lineage", 7)
    assert service.core.commit_log.consumer_cursor("lineage") == 7
    # Everything is "old" and only 2 records need keeping, but the consumer is at 7.
    assert service.core.commit_log.trim_log(keep_records=2, keep_us=0) == 7
    assert service.core.commit_log.log_bounds() == (8, 20)
    service.core.commit_log.set_consumer_cursor("lineage", 20)
    assert service.core.commit_log.trim_log(keep_records=2, keep_us=0) == 13
    assert service.core.commit_log.log_bounds() == (21, 20)


def test_a_full_queue_refuses_instead_of_growing(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "db")
    writer = Writer(store, max_queue=2)
    release, busy = threading.Event(), threading.Event()

    def hold(batch: object) -> bool:
        busy.set()
        return release.wait(10)

    try:
        blocked = writer.submit(hold)  # the writer is busy with this one
        assert busy.wait(10)
        queued = [writer.submit(lambda batch: "ok") for _ in range(2)]
        with pytest.raises(WriterOverloadedError):
            writer.submit(lambda batch: "one too many")
        release.set()
        assert blocked.result(10) is True
        assert [f.result(10) for f in queued] == ["ok", "ok"]
        assert writer.submit(lambda batch: "room again").result(10) == "room again"
    finally:
        release.set()
        writer.close()
        store.close()


def test_a_transaction_waits_for_more_mutations_to_join_it(tmp_path: Path) -> None:
    """With `group_wait_s`, the writer's next transaction waits up to that long from its oldest
    mutation's arrival for others: a mutation submitted once the writer holds the first still joins
    it (here the transaction starts as soon as it is full, at `max_batch`)."""
    store = LmdbStore(tmp_path / "db")
    writer = Writer(store, max_batch=2, group_wait_s=60)
    try:
        first = writer.submit(lambda batch: "first")
        eventually(lambda: writer.queue_depth() == 0, "the writer holding the first mutation")
        second = writer.submit(lambda batch: "second")
        assert [first.result(30), second.result(30)] == ["first", "second"]
        assert (writer.stats.batches, writer.stats.mutations) == (1, 2)
    finally:
        writer.close()
        store.close()
