"""A table commit's metadata file is kept in the store, unsynced, until the settler syncs a group of
them; then it is forgotten. With `metadata_sync_s = 0` each commit syncs its own and keeps
nothing. (The crash side is in tests/test_crash_safety.py.)"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from isbre.catalog.file_settling import KEPT_FILE_MAX_BYTES
from isbre.catalog.file_uris import local_path
from isbre.catalog.identifiers import Identifier
from isbre.catalog.lmdb_store import LmdbStore
from isbre.catalog.service import CatalogService
from isbre.catalog.table_staging import TableChange
from isbre.catalog.warehouses import open_catalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import SetPropertiesUpdate
from pyiceberg.types import LongType, NestedField

from tests.http_client import http
from tests.server import ID_SCHEMA, InProcessServer
from tests.waiting import eventually

T = Identifier.of(("ns",), "t")


def _kept(service: CatalogService) -> list[str]:
    with service.core.store.read() as view:
        return sorted(pending.location for pending in view.pending_files(100))


def _commit_twice(service: CatalogService, between: Callable[[], object] = lambda: None) -> list[str]:
    """A table made and changed once (`between` called in between): its two metadata files."""
    service.namespaces.create(("ns",), {})
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    made = service.tables.create(T, schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER)
    between()
    changed = service.tables.commit(TableChange(T, (), (SetPropertiesUpdate(updates={"k": "v"}),)))
    return sorted(state.metadata_location or "" for state in (made, changed))


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every os.fsync of this process, counted (and done)."""
    calls: list[int] = []
    real = __import__("os").fsync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr("os.fsync", counted)
    return calls


def test_a_commit_keeps_its_file_unsynced_until_a_group_is_settled(tmp_path: Path, fsyncs: list[int]) -> None:
    service = open_catalog(tmp_path, metadata_sync_s=3600)
    try:
        settler = service.core.settler
        assert settler is not None and settler.grouping
        files = _commit_twice(service, between=fsyncs.clear)  # a new table syncs its new directories
        assert _kept(service) == files
        assert fsyncs == [], "a commit synced its metadata file itself"
        with service.core.store.read() as view:
            kept = {pending.location: pending for pending in view.pending_files(100)}
        for location in files:
            path = local_path(location)
            assert path is not None and path.read_bytes() == kept[location].data
            assert kept[location].owner == str(service.tables.load(T).metadata.table_uuid)
        assert settler.settle() == 2
        assert _kept(service) == []
    finally:
        service.close()


def test_the_settler_syncs_on_its_own_and_on_close(tmp_path: Path) -> None:
    service = open_catalog(tmp_path / "often", metadata_sync_s=0.05)
    try:
        _commit_twice(service)
        eventually(lambda: _kept(service) == [], "the kept files settled by the settler's round", timeout=30)
    finally:
        service.close()
    service = open_catalog(tmp_path / "seldom", metadata_sync_s=3600)
    _commit_twice(service)
    assert len(_kept(service)) == 2
    service.close()
    service = open_catalog(tmp_path / "seldom", metadata_sync_s=3600)
    try:
        assert _kept(service) == [], "closing left files kept"
    finally:
        service.close()


def test_without_grouping_each_commit_syncs_its_own_file_and_keeps_nothing(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    service = open_catalog(tmp_path, metadata_sync_s=0)
    try:
        assert service.core.settler is not None and not service.core.settler.grouping
        _commit_twice(service, between=fsyncs.clear)
        assert _kept(service) == []
        assert len(fsyncs) == 2  # the file and its directory
    finally:
        service.close()


def test_a_metadata_file_larger_than_the_store_keeps_is_synced_by_its_commit(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    service = open_catalog(tmp_path, metadata_sync_s=3600)
    try:
        _commit_twice(service)
        assert len(_kept(service)) == 2
        fsyncs.clear()
        large = {f"p{n}": "x" * (200 << 10) for n in range(2)}  # 400 KiB of properties
        state = service.tables.commit(TableChange(T, (), (SetPropertiesUpdate(updates=large),)))
        assert len(state.json) > KEPT_FILE_MAX_BYTES
        assert state.metadata_location not in _kept(service) and len(_kept(service)) == 2
        assert len(fsyncs) == 2  # the file and its directory
    finally:
        service.close()


def test_metrics_count_the_files_waiting_for_their_sync(tmp_path: Path) -> None:
    server = InProcessServer(tmp_path / "warehouse", env={"ISBRE_METADATA_SYNC_SECONDS": "3600"}).start()
    try:
        base = f"{server.url}/v1/namespaces"
        http.post(base, json={"namespace": ["ns"]}).raise_for_status()
        http.post(f"{base}/ns/tables", json={"name": "t", "schema": ID_SCHEMA}).raise_for_status()
        body = {"requirements": [], "updates": [{"action": "set-properties", "updates": {"k": "v"}}]}
        http.post(f"{base}/ns/tables/t", json=body).raise_for_status()
        assert "\nisbre_metadata_files_unsynced 2\n" in http.get(f"{server.url}/metrics").text
    finally:
        server.stop()


def test_a_lost_file_is_not_restored_through_a_link_into_another_tables_folder(tmp_path: Path) -> None:
    """A writer of a table swaps its metadata folder for a link to another table's while a kept file
    of its own is lost: the restore refuses the link instead of writing into the other folder."""
    service = open_catalog(tmp_path, metadata_sync_s=3600)
    try:
        _commit_twice(service)
        schema = Schema(NestedField(1, "id", LongType(), required=True))
        other = service.tables.create(
            Identifier.of(("ns",), "other"), schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER
        )
        current = service.tables.load(T)
        with service.core.store.read() as view:
            (lost,) = [p for p in view.pending_files(100) if p.location == current.metadata_location]
    finally:
        service.close()  # settles: the crash is made below
    store = LmdbStore(tmp_path / "isbre.lmdb")
    try:
        with store.write() as view:
            view.put_pending_file(lost)
    finally:
        store.close()
    lost_path, other_file = local_path(lost.location), local_path(other.metadata_location or "")
    assert lost_path is not None and other_file is not None
    shutil.rmtree(lost_path.parent)
    lost_path.parent.symlink_to(other_file.parent, target_is_directory=True)

    service = open_catalog(tmp_path, metadata_sync_s=3600)
    try:
        assert not (other_file.parent / lost_path.name).exists(), "restored into the other table's folder"
        assert _kept(service) == []
    finally:
        service.close()
