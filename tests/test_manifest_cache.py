"""The process's one manifest cache, for scan plans and the appends the catalog makes again:
decoded once, bounded in bytes, least recently used out, and every path checked for each table
that names the manifest."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from isbre.catalog.embedded import LmdbCatalog
from isbre.catalog.lru import Lru
from isbre.catalog.manifest_cache import DECODED_PER_BYTE, ManifestCache
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import ManifestFile
from pyiceberg.table import Table


@pytest.fixture
def table(tmp_path: Path) -> Table:
    catalog = SqlCatalog("cache", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=tmp_path.as_uri())
    catalog.create_namespace("n")
    created = catalog.create_table("n.t", pa.schema([pa.field("id", pa.int64())]))
    for batch in range(3):
        created.append(pa.table({"id": pa.array(range(batch * 10, batch * 10 + 10), pa.int64())}))
    return created


def manifests(table: Table, cache: ManifestCache) -> tuple[ManifestFile, ...]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return cache.manifests(table.io, snapshot.manifest_list, 2)


def passes(_: str) -> None:
    return None


def test_a_manifest_is_decoded_once_and_the_bound_holds(table: Table) -> None:
    listed = manifests(table, ManifestCache(1 << 20))
    assert len(listed) == 3
    one = listed[0].manifest_length * DECODED_PER_BYTE
    cache = ManifestCache(2 * one + one // 2)  # room for two manifests' entries and no more
    first = cache.entries(table.io, listed[0], "t", passes, 2)
    assert cache.entries(table.io, listed[0], "t", passes, 2) is first and (cache.hits, cache.misses) == (
        1,
        1,
    )
    for manifest in listed[1:]:
        cache.entries(table.io, manifest, "t", passes, 2)
    assert cache.weight <= 2 * one + one // 2
    assert cache.entries(table.io, listed[0], "t", passes, 2) is not first  # the oldest went out
    assert [entry.data_file.record_count for entry in first] == [10]


def test_paths_are_checked_for_each_table_that_names_the_manifest(table: Table) -> None:
    cache = ManifestCache(1 << 20)
    manifest = manifests(table, cache)[0]
    (data_file,) = [
        entry.data_file.file_path for entry in cache.entries(table.io, manifest, "owner", passes, 2)
    ]

    def refuses(path: str) -> None:
        if path == data_file:
            raise PermissionError(f"{path} is not this table's")

    with pytest.raises(PermissionError, match="not this table's"):
        cache.entries(table.io, manifest, "another", refuses, 2)
    with pytest.raises(PermissionError):  # refused again: a refusal is never remembered as a pass
        cache.entries(table.io, manifest, "another", refuses, 2)
    # Checked for its own table once, the manifest is not checked again for it.
    assert len(cache.entries(table.io, manifest, "owner", refuses, 2)) == 1


def test_the_bounded_map_forgets_the_least_recently_used_by_weight() -> None:
    held: Lru[str, bytes] = Lru(10, weigh=len)
    held.put("a", b"aaaa")
    held.put("b", b"bbbb")
    assert held.peek("a") == b"aaaa"  # now the most recently used
    held.put("c", b"cccc")  # 12 > 10: the least recently used goes
    assert (held.peek("b"), held.peek("a"), held.peek("c"), held.weight) == (None, b"aaaa", b"cccc", 8)
    held.put("a", b"x" * 11)  # heavier than all it may hold: not kept, nor its old value
    assert (held.peek("a"), held.peek("c"), held.weight) == (None, b"cccc", 4)


def test_an_append_made_again_is_planned_without_reading_its_list_back(tmp_path: Path) -> None:
    """One cache of decoded manifest lists per process: the list the catalog wrote for a stale
    append it made again is the one a plan of the new head then reads."""
    catalog = LmdbCatalog("one-cache", warehouse=str(tmp_path / "warehouse"))
    try:
        catalog.create_namespace("n")
        catalog.create_table("n.t", pa.schema([pa.field("id", pa.int64())]))
        first, stale = catalog.load_table("n.t"), catalog.load_table("n.t")
        first.append(pa.table({"id": pa.array([1], pa.int64())}))
        stale.append(pa.table({"id": pa.array([2], pa.int64())}))  # made again on `first`'s snapshot
        table = catalog.load_table("n.t")
        head, parent = table.current_snapshot(), first.current_snapshot()
        assert head is not None and parent is not None and head.parent_snapshot_id == parent.snapshot_id
        cache = catalog.service.plans.cache
        hits, misses = cache.hits, cache.misses
        listed = cache.manifests(table.io, head.manifest_list, table.format_version)
        assert (cache.hits, cache.misses) == (hits + 1, misses)
        assert {m.added_snapshot_id for m in listed} == {head.snapshot_id, parent.snapshot_id}
    finally:
        catalog.close()
