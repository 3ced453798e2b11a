"""Table maintenance the catalog runs: snapshot expiry and old metadata files, each change an
ordinary commit, files deleted only once unreachable and only the table's own."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from isbre.catalog import CatalogService, Identifier, TableChange
from isbre.catalog.embedded import LmdbCatalog
from isbre.catalog.file_uris import local_path
from isbre.catalog.job_process import JobProcessError, JobProcesses
from isbre.catalog.maintenance import JobReport, plan_expiry
from isbre.catalog.maintenance_policy import STREAMING_DEFAULTS
from isbre.catalog.warehouse_config import Warehouse, default_store
from isbre.catalog.warehouses import open_warehouses
from isbre.rest.settings import Settings, warehouses
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.table import Table
from pyiceberg.table.update import SetPropertiesUpdate

from tests.http_client import http
from tests.server import InProcessServer, IsbreServer, job_process
from tests.sink_helpers import compacted, offsets_in, rows, span, write_once
from tests.waiting import eventually

FAR_FUTURE_MS = 10**13  # every snapshot is older than any age limit then
POLICY = {"history.expire.max-snapshot-age-ms": "1", "history.expire.min-snapshots-to-keep": "3"}


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    embedded = LmdbCatalog("local", warehouse=str(tmp_path / "warehouse"))
    embedded.create_namespace("db")
    return embedded


def service_of(catalog: Catalog) -> CatalogService:
    assert isinstance(catalog, LmdbCatalog)
    return catalog.service


def batch(start: int) -> pa.Table:
    return pa.table({"n": pa.array([start, start + 1], pa.int64())})


def appended(catalog: Catalog, count: int, properties: dict[str, str] | None = None) -> Table:
    table = catalog.create_table("db.t", schema=batch(0).schema, properties=properties or POLICY)
    for i in range(count):
        table.append(batch(2 * i))
    return table.refresh()


def data_files(table: Table) -> set[str]:
    return {task.file.file_path for task in table.scan().plan_files()}


def read_files(table: Table) -> set[str]:
    """Every file a reader of the table may open: its metadata file, each kept snapshot's manifest
    list and manifests, and the data files they hold as added or existing. A deleted entry is a
    tombstone that no reader opens: expiry deletes its file with the last snapshot that read it."""
    assert table.metadata_location is not None
    files = {table.metadata_location}
    for snapshot in table.metadata.snapshots:
        files.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            files.add(manifest.manifest_path)
            files |= {entry.data_file.file_path for entry in manifest.fetch_manifest_entry(table.io)}
    return files


def exists(location: str) -> bool:
    path = local_path(location)
    assert path is not None
    return path.exists()


def test_expiry_keeps_the_newest_snapshots_and_every_live_data_file(catalog: Catalog) -> None:
    table = appended(catalog, 8)
    snapshots = table.metadata.snapshots
    live = data_files(table)
    (report,) = service_of(catalog).maintenance.run(
        Identifier.of(("db",), "t"), ["expire-snapshots"], FAR_FUTURE_MS
    )
    assert report.committed and report.removed_snapshots == 5
    table = table.refresh()
    assert [s.snapshot_id for s in table.metadata.snapshots] == [s.snapshot_id for s in snapshots[-3:]]
    assert not any(exists(s.manifest_list) for s in snapshots[:5])  # the expired manifest lists are gone
    assert all(exists(s.manifest_list) for s in snapshots[-3:])
    assert data_files(table) == live and all(map(exists, live))  # appends share every data file
    assert report.deleted_files == 5 and not report.problems
    assert sorted(table.scan().to_arrow()["n"].to_pylist()) == list(range(16))
    oldest_kept = snapshots[-3].snapshot_id  # time travel to a retained snapshot still works
    assert len(table.scan(snapshot_id=oldest_kept).to_arrow()) == 12
    record = list(service_of(catalog).core.commit_log.records())[-1]
    assert (record.kind, record.job) == ("table.commit", "expire-snapshots")


def test_an_overwrite_s_replaced_files_go_with_the_snapshots_that_named_them(catalog: Catalog) -> None:
    table = appended(catalog, 3, {**POLICY, "history.expire.min-snapshots-to-keep": "1"})
    before = data_files(table)
    table.overwrite(batch(100))
    table = table.refresh()
    after = data_files(table)
    (report,) = service_of(catalog).maintenance.run(
        Identifier.of(("db",), "t"), ["expire-snapshots"], FAR_FUTURE_MS
    )
    assert len(table.refresh().metadata.snapshots) == 1
    assert not any(map(exists, before - after)) and all(map(exists, after))
    assert report.deleted_files >= len(before - after) + 3  # data files, manifests, manifest lists
    assert table.refresh().scan().to_arrow()["n"].to_pylist() == [100, 101]


def test_nothing_due_commits_nothing(catalog: Catalog) -> None:
    appended(catalog, 2)
    service = service_of(catalog)
    high = service.core.commit_log.commit_seq()
    (report,) = service.maintenance.run(Identifier.of(("db",), "t"), ["expire-snapshots"], FAR_FUTURE_MS)
    assert not report.committed and service.core.commit_log.commit_seq() == high


def test_a_file_outside_the_table_that_a_snapshot_named_is_left_alone(
    catalog: Catalog, tmp_path: Path
) -> None:
    table = appended(catalog, 1, {**POLICY, "history.expire.min-snapshots-to-keep": "1"})
    outside = tmp_path / "elsewhere" / "shared.parquet"
    outside.parent.mkdir()
    pq.write_table(batch(50), outside)
    table.add_files([outside.as_uri()])  # a commit that names a file outside the table
    table.overwrite(batch(200))  # now only expired snapshots name it
    (report,) = service_of(catalog).maintenance.run(
        Identifier.of(("db",), "t"), ["expire-snapshots"], FAR_FUTURE_MS
    )
    assert outside.exists() and outside.as_uri() in report.skipped_files
    assert table.refresh().scan().to_arrow()["n"].to_pylist() == [200, 201]


def test_an_append_that_lands_while_expiry_plans_is_kept(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = appended(catalog, 5)
    service = service_of(catalog)
    commit = service.tables.commit
    raced: list[int] = []

    def append_first(change: Any, **options: Any) -> Any:
        if not raced:  # another writer's append lands between the plan and the expiry's commit
            raced.append(1)
            table.append(batch(1000))
        return commit(change, **options)

    monkeypatch.setattr(service.tables, "commit", append_first)
    (report,) = service.maintenance.run(Identifier.of(("db",), "t"), ["expire-snapshots"], FAR_FUTURE_MS)
    table = table.refresh()
    assert report.committed and raced == [1]
    assert len(table.metadata.snapshots) == 3  # planned again, from the table with the append
    assert 1000 in table.scan().to_arrow()["n"].to_pylist()


def test_old_metadata_files_are_capped_at_previous_versions_max(catalog: Catalog) -> None:
    properties = {
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "3",
    }
    table = catalog.create_table("db.t", schema=batch(0).schema, properties=properties)
    service, ident = service_of(catalog), Identifier.of(("db",), "t")
    for i in range(10):  # through the catalog service, as a REST commit goes (PyIceberg's own
        # catalogs delete old files themselves when they commit)
        service.tables.commit(TableChange(ident, (), (SetPropertiesUpdate(updates={"step": str(i)}),)))
    table = table.refresh()
    directory = local_path(table.metadata_location.rsplit("/", 1)[0])
    assert directory is not None and len(os.listdir(directory)) == 11
    (report,) = service_of(catalog).maintenance.run(Identifier.of(("db",), "t"), ["remove-metadata-files"])
    kept = {table.metadata_location, *(e.metadata_file for e in table.metadata.metadata_log)}
    assert len(kept) == 4 and report.deleted_files == 7
    assert {f"{table.metadata_location.rsplit('/', 1)[0]}/{n}" for n in os.listdir(directory)} == kept


def test_orphan_files_older_than_the_safety_age_go_and_nothing_the_table_reaches(catalog: Catalog) -> None:
    """Files under the table that no metadata reaches: old ones are deleted, young ones (a commit
    under way writes files first) are kept, and every file the table reaches stays, the data
    files an overwrite replaced that older snapshots still name included."""
    table = appended(catalog, 3)
    table.overwrite(batch(100))
    table = table.refresh()
    root = local_path(table.metadata.location)
    assert root is not None
    before = {p for p in root.rglob("*") if p.is_file()}
    old_data, old_manifest = root / "data" / "lost.parquet", root / "metadata" / "lost-m0.avro"
    young = root / "data" / "in-flight.parquet"
    nested = root / "data" / "region=eu" / "lost.parquet"
    nested.parent.mkdir()
    for path in (old_data, old_manifest, young, nested):
        path.write_bytes(b"not referenced")
    day_ago = time.time() - 86_400
    for path in (old_data, old_manifest, nested):
        os.utime(path, (day_ago, day_ago))
    service, ident = service_of(catalog), Identifier.of(("db",), "t")
    catalog.load_table("db.t").transaction().set_properties(
        {"isbre.maintenance.orphan-files.min-age-ms": "3600000"}
    ).commit_transaction()
    (report,) = service.maintenance.run(ident, ["remove-orphan-files"])
    assert report.deleted_files == 3 and not report.problems, report
    after = {p for p in root.rglob("*") if p.is_file()}
    assert young in after and not {old_data, old_manifest, nested} & after
    assert before <= after  # every file the table had, the new metadata file besides
    assert sorted(catalog.load_table("db.t").scan().to_arrow()["n"].to_pylist()) == [100, 101]
    first = catalog.load_table("db.t").metadata.snapshots[0].snapshot_id
    assert catalog.load_table("db.t").scan(snapshot_id=first).to_arrow().num_rows == 2  # time travel


def test_orphan_removal_deletes_nothing_when_a_manifest_cannot_be_read(catalog: Catalog) -> None:
    table = appended(catalog, 2, {"isbre.maintenance.orphan-files.min-age-ms": "1"})
    root = local_path(table.metadata.location)
    assert root is not None
    lost = root / "data" / "lost.parquet"
    lost.write_bytes(b"not referenced")
    os.utime(lost, (time.time() - 60, time.time() - 60))
    manifest = local_path(table.current_snapshot().manifests(table.io)[0].manifest_path)  # type: ignore[union-attr]
    assert manifest is not None
    manifest.write_bytes(b"garbage")
    (report,) = service_of(catalog).maintenance.run(Identifier.of(("db",), "t"), ["remove-orphan-files"])
    assert report.deleted_files == 0 and "cannot list the table's files" in report.problems[0]
    assert lost.exists()


@pytest.mark.parametrize("merging", [True, False])
def test_a_sink_merges_small_manifests_when_the_table_asks(catalog: Catalog, merging: bool) -> None:
    properties = {
        "commit.manifest-merge.enabled": str(merging).lower(),
        "commit.manifest.min-count-to-merge": "4",
    }
    for start in range(0, 120, 10):
        write_once(
            catalog,
            "db.merged",
            rows(start, start + 10),
            span(start, start + 10),
            table_properties=properties,
        )
    table = catalog.load_table("db.merged")
    manifests = table.current_snapshot().manifests(table.io)  # type: ignore[union-attr]
    assert (len(manifests) < 4) if merging else (len(manifests) == 12), len(manifests)
    assert offsets_in(table) == [(0, n) for n in range(120)]  # every row once
    first = table.metadata.snapshots[0].snapshot_id
    assert table.scan(snapshot_id=first).to_arrow().num_rows == 10  # time travel intact


def test_a_sink_replays_nothing_after_expiry(catalog: Catalog) -> None:
    write_once(catalog, "db.sunk", rows(0, 100), span(0, 100))
    write_once(catalog, "db.sunk", rows(100, 200), span(100, 200))
    table = catalog.load_table("db.sunk")
    assert {k: table.properties[k] for k in STREAMING_DEFAULTS} == STREAMING_DEFAULTS
    service = service_of(catalog)
    service.maintenance.run(Identifier.of(("db",), "sunk"), ["expire-snapshots"], FAR_FUTURE_MS)
    assert len(table.refresh().metadata.snapshots) == 2  # its min-snapshots-to-keep is 20
    table.transaction().set_properties(**{"history.expire.min-snapshots-to-keep": "1"}).commit_transaction()
    service.maintenance.run(Identifier.of(("db",), "sunk"), ["expire-snapshots"], FAR_FUTURE_MS)
    assert len(table.refresh().metadata.snapshots) == 1
    high = service.core.commit_log.commit_seq()
    write_once(catalog, "db.sunk", rows(0, 200), span(0, 200))  # a replay of both spans
    assert service.core.commit_log.commit_seq() == high  # committed nothing
    assert offsets_in(table) == [(0, n) for n in range(200)]


COMPACTING = {**POLICY, "isbre.maintenance.compact.min-input-files": "5"}
T = Identifier.of(("db",), "t")


def numbers(table: Table, snapshot_id: int | None = None) -> list[int]:
    return sorted(table.scan(snapshot_id=snapshot_id).to_arrow()["n"].to_pylist())


def test_thirty_appends_compact_into_one_file_with_the_same_rows(catalog: Catalog) -> None:
    table = appended(catalog, 30, COMPACTING)
    before, small = table.metadata.snapshots, data_files(table)
    (report,) = service_of(catalog).maintenance.run(T, ["compact-data-files"])
    table = table.refresh()
    assert report.committed and not report.problems
    assert (report.rewritten_files, report.added_files) == (30, 1)
    assert report.rewritten_bytes == sum(int(s.summary["added-files-size"]) for s in before)
    assert numbers(table) == list(range(60))
    assert len(data_files(table)) == 1 and not data_files(table) & small
    current = table.current_snapshot()
    assert current is not None and current.summary is not None
    assert current.summary.operation.value == "replace"
    assert current.summary["isbre.maintenance.job"] == "compact-data-files"
    assert (current.summary["total-records"], current.summary["total-data-files"]) == ("60", "1")
    # Time travel to the snapshots before it reads the small files, which are all still there.
    assert numbers(table, before[9].snapshot_id) == list(range(20)) and all(map(exists, small))
    record = list(service_of(catalog).core.commit_log.records())[-1]
    assert (record.kind, record.job) == ("table.commit", "compact-data-files")
    # Expiry deletes them with the last snapshots that read them: the compaction's is all it keeps.
    service_of(catalog).maintenance.run(T, ["expire-snapshots"], FAR_FUTURE_MS)
    assert all(map(exists, small))  # two appends, kept by min-snapshots-to-keep = 3, still read them
    table.transaction().set_properties(**{"history.expire.min-snapshots-to-keep": "1"}).commit_transaction()
    service_of(catalog).maintenance.run(T, ["expire-snapshots"], FAR_FUTURE_MS)
    assert not any(map(exists, small)) and numbers(table.refresh()) == list(range(60))


def test_too_few_small_files_are_left_as_they_are(catalog: Catalog) -> None:
    appended(catalog, 4, COMPACTING)
    service = service_of(catalog)
    high = service.core.commit_log.commit_seq()
    (report,) = service.maintenance.run(T, ["compact-data-files"])
    assert not report.committed and service.core.commit_log.commit_seq() == high


def compact_while(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[Table], object]
) -> tuple[Table, JobReport, list[str]]:
    """Compact six appends while `meanwhile` changes the table (after the job planned, while it
    writes its files); the table, the report and the files the job wrote."""
    table = appended(catalog, 6, COMPACTING)
    service = service_of(catalog)
    rewrite = service.maintenance._rewritten
    written: list[str] = []

    def changed_first(metadata: Any, rows: pa.Table, io: Any) -> Any:
        meanwhile(table)
        files = rewrite(metadata, rows, io)
        written.extend(f.file_path for f in files)
        return files

    monkeypatch.setattr(service.maintenance, "_rewritten", changed_first)
    (report,) = service.maintenance.run(T, ["compact-data-files"])
    return table.refresh(), report, written


def test_an_append_that_lands_while_compaction_rewrites_is_kept(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, report, _ = compact_while(catalog, monkeypatch, lambda table: table.append(batch(1000)))
    assert report.committed and report.rewritten_files == 6
    assert numbers(table) == [*range(12), 1000, 1001]
    assert len(data_files(table)) == 2  # the compacted file and the append's
    append, replace = table.metadata.snapshots[-2:]
    assert append.summary is not None and append.summary.operation.value == "append"
    assert replace.parent_snapshot_id == append.snapshot_id  # made again on top of it
    assert replace.sequence_number == append.sequence_number + 1
    assert replace.summary is not None and replace.summary["total-records"] == "14"
    entries = [e for m in replace.manifests(table.io) for e in m.fetch_manifest_entry(table.io)]
    written = [e for e in entries if e.snapshot_id == replace.snapshot_id]
    # The data sequence number of the snapshot the files were read at, not the replace's own:
    # Java's rewrite with the starting sequence number (catalog/conflicts.py).
    started = table.metadata.snapshot_by_id(append.parent_snapshot_id)  # type: ignore[arg-type]
    assert started is not None and started.sequence_number == append.sequence_number - 1
    assert [e.sequence_number for e in written] == [started.sequence_number]


def test_an_append_that_lands_while_a_v3_table_compacts_is_kept_and_no_row_changes_id(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compaction's snapshot is moved onto the append (catalog/rebase.py): its new file takes
    row ids after the append's, and the rows it moved keep theirs (catalog/row_lineage.py)."""
    from isbre.catalog.manifest_entries import first_row_id, inherit_first_row_ids, read_entries
    from isbre.catalog.manifest_lists import first_row_id as manifest_first_row_id
    from isbre.catalog.manifest_lists import read_manifests

    from tests.appenders import SCHEMA, V3Appender, tags

    catalog.create_table("db.t", schema=SCHEMA, properties={**COMPACTING, "format-version": "3"})
    appender = V3Appender("", "db.t", embedded=catalog)
    for i in range(6):
        appender.append(pa.table({"writer": [i, i], "seq": [0, 1]}, schema=SCHEMA), tags(0, i))
    # The spec's model: two ids an append, in commit order; append i is sequence number i + 1.
    model = {(i, k): (2 * i + k, i + 1) for i in range(6) for k in (0, 1)}
    rewrite = service_of(catalog).maintenance._rewritten

    def append_first(metadata: Any, rows: pa.Table, io: Any) -> Any:
        appender.append(pa.table({"writer": [100], "seq": [0]}, schema=SCHEMA), tags(0, 100))
        return rewrite(metadata, rows, io)

    monkeypatch.setattr(service_of(catalog).maintenance, "_rewritten", append_first)
    (report,) = service_of(catalog).maintenance.run(T, ["compact-data-files"])
    assert report.committed and report.rewritten_files == 6, report
    table = catalog.load_table("db.t")
    replace = table.current_snapshot()
    assert replace is not None and replace.parent_snapshot_id == table.metadata.snapshots[-2].snapshot_id
    files: dict[str, int | None] = {}
    for manifest in read_manifests(table.io, replace.manifest_list, 3):
        entries = read_entries(table.io, manifest, 3)
        inherit_first_row_ids(entries, manifest_first_row_id(manifest))
        files |= {entry.data_file.file_path: first_row_id(entry.data_file) for entry in entries}
    (compacted_path,) = [path for path in files if pq.read_schema(local_path(path)).names[-1] != "seq"]
    written = pq.read_table(local_path(compacted_path)).to_pylist()
    assert {
        (r["writer"], r["seq"]): (r["_row_id"], r["_last_updated_sequence_number"]) for r in written
    } == model
    # The append's row took id 12; the compaction's file, made again after it, the 12 ids after.
    assert sorted(files.values()) == [12, 13]
    assert table.metadata.next_row_id == 25  # type: ignore[attr-defined]


def test_compaction_is_made_again_on_an_append_whose_manifest_lists_a_file_as_existing(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replace is moved onto commits that only added files (catalog/rebase.py) as their
    manifests' entries say, not as their counters claim: an append whose manifest lists its file
    as EXISTING (while its counters say ADDED) gets the replace made again from the manifests."""
    from isbre.catalog import own_commits

    from tests.appenders import SCHEMA, V3Appender, tags

    catalog.create_table("db.t", schema=SCHEMA, properties={**COMPACTING, "format-version": "3"})
    appender = V3Appender("", "db.t", embedded=catalog)
    for i in range(6):
        appender.append(pa.table({"writer": [i, i], "seq": [0, 1]}, schema=SCHEMA), tags(0, i))
    rewrite = service_of(catalog).maintenance._rewritten
    made: list[object] = []
    make = own_commits.replaced_v3
    monkeypatch.setattr(own_commits, "replaced_v3", lambda *a: made.append(a) or make(*a))

    def disguised_first(metadata: Any, rows: pa.Table, io: Any) -> Any:
        appender.append(pa.table({"writer": [100], "seq": [0]}, schema=SCHEMA), tags(0, 100), disguised=True)
        return rewrite(metadata, rows, io)

    monkeypatch.setattr(service_of(catalog).maintenance, "_rewritten", disguised_first)
    (report,) = service_of(catalog).maintenance.run(T, ["compact-data-files"])
    assert report.committed and report.rewritten_files == 6, report
    assert len(made) == 2
    rows = catalog.load_table("db.t").scan().to_arrow()
    assert sorted(zip(rows["writer"].to_pylist(), rows["seq"].to_pylist(), strict=True)) == sorted(
        [(i, k) for i in range(6) for k in (0, 1)] + [(100, 0)]
    )


def test_compaction_commits_nothing_when_its_files_went_meanwhile(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    high = service_of(catalog).core.commit_log.commit_seq() + 6  # after the appends
    table, report, written = compact_while(catalog, monkeypatch, lambda table: table.overwrite(batch(500)))
    assert not report.committed and not report.problems
    (abandoned,) = report.abandoned
    assert abandoned.startswith("6 file(s) left as they were") and "no longer in the table" in abandoned
    assert service_of(catalog).core.commit_log.commit_seq() == high + 2  # the create, the overwrite
    assert numbers(table) == [500, 501]
    assert written and not any(map(exists, written))  # its own new files, never committed, are gone


def manifests_of(table: Table) -> list[str]:
    current = table.current_snapshot()
    assert current is not None
    return [m.manifest_path for m in current.manifests(table.io)]


def test_the_manifests_of_twelve_fast_appends_are_merged_into_one(catalog: Catalog) -> None:
    table = appended(catalog, 12)
    before, snapshots = manifests_of(table), table.metadata.snapshots
    assert len(before) == 12  # PyIceberg's fast append: a manifest a commit
    (report,) = service_of(catalog).maintenance.run(T, ["rewrite-manifests"])
    table = table.refresh()
    assert report.committed and (report.rewritten_files, report.added_files) == (12, 1)
    assert len(manifests_of(table)) == 1 and numbers(table) == list(range(24))
    current = table.current_snapshot()
    assert current is not None and current.summary is not None
    assert current.summary.operation.value == "replace" and current.summary["total-data-files"] == "12"
    assert current.summary["isbre.maintenance.job"] == "rewrite-manifests"
    assert numbers(table, snapshots[5].snapshot_id) == list(range(12))  # time travel intact
    record = list(service_of(catalog).core.commit_log.records())[-1]
    assert (record.kind, record.job) == ("table.commit", "rewrite-manifests")
    (again,) = service_of(catalog).maintenance.run(T, ["rewrite-manifests"])
    assert not again.committed  # one manifest: nothing to merge


def test_after_commits_the_catalog_merges_a_table_s_many_manifests(catalog: Catalog) -> None:
    from isbre.catalog.maintainer import Maintainer

    policy = {"isbre.maintenance.enabled": "true", "commit.manifest.min-count-to-merge": "5"}
    table = appended(catalog, 4, policy)
    maintainer = Maintainer([service_of(catalog)])
    assert maintainer.run_due(service_of(catalog), T) == []  # 4 manifests: not due yet
    table.append(batch(100))
    (report,) = maintainer.run_due(service_of(catalog), T)
    assert report.job == "rewrite-manifests" and report.committed
    assert len(manifests_of(table.refresh())) == 1 and numbers(table) == [*range(8), 100, 101]


def test_a_sink_replays_nothing_after_compaction(catalog: Catalog) -> None:
    for start in range(0, 300, 50):
        write_once(catalog, "db.sunk", rows(start, start + 50), span(start, start + 50))
    table = catalog.load_table("db.sunk")
    table.transaction().set_properties(
        **{"isbre.maintenance.compact.min-input-files": "5"}
    ).commit_transaction()
    service = service_of(catalog)
    (report,) = service.maintenance.run(Identifier.of(("db",), "sunk"), ["compact-data-files"])
    assert report.committed and report.rewritten_files == 6
    high = service.core.commit_log.commit_seq()
    write_once(catalog, "db.sunk", rows(0, 300), span(0, 300))  # a replay of every span
    assert service.core.commit_log.commit_seq() == high  # committed nothing
    assert offsets_in(table) == [(0, n) for n in range(300)]


def test_expiry_keeps_a_tag_and_drops_a_branch_past_its_age(catalog: Catalog) -> None:
    table = appended(catalog, 4, {**POLICY, "history.expire.min-snapshots-to-keep": "1"})
    first = table.metadata.snapshots[0].snapshot_id
    with table.manage_snapshots() as refs:
        refs.create_tag(first, "release")
        refs.create_branch(table.metadata.snapshots[1].snapshot_id, "old", max_ref_age_ms=1)
    plan = plan_expiry(table.refresh().metadata, FAR_FUTURE_MS)
    assert plan.refs == ("old",) and first not in plan.snapshot_ids
    service_of(catalog).maintenance.run(Identifier.of(("db",), "t"), ["expire-snapshots"], FAR_FUTURE_MS)
    table = table.refresh()
    assert set(table.metadata.refs) == {"main", "release"}
    assert {s.snapshot_id for s in table.metadata.snapshots} == {first, table.metadata.current_snapshot_id}


# -- through the server


@pytest.fixture(scope="module")
def maintained(tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = InProcessServer(tmp_path_factory.mktemp("maintained") / "warehouse").start()
    yield server
    server.stop()


def table_url(server: IsbreServer, name: str) -> str:
    return f"{server.url}/v1/isbre/namespaces/m/tables/{name}"


def commit_properties(server: IsbreServer, name: str, updates: dict[str, str]) -> httpx.Response:
    body = {"requirements": [], "updates": [{"action": "set-properties", "updates": updates}]}
    return http.post(table_url(server, name), json=body)


@pytest.fixture(scope="module")
def rest(maintained: IsbreServer) -> Catalog:
    from pyiceberg.catalog.rest import RestCatalog

    catalog = RestCatalog("isbre", uri=maintained.url)
    catalog.create_namespace("m")
    return catalog


def test_invalid_policies_are_refused_naming_the_property(maintained: IsbreServer, rest: Catalog) -> None:
    rest.create_table("m.policies", schema=batch(0).schema)
    for key, value in [
        ("history.expire.min-snapshots-to-keep", "0"),
        ("history.expire.max-snapshot-age-ms", "soon"),
        ("write.metadata.delete-after-commit.enabled", "yes"),
        ("isbre.maintenance.orphan-files.min-age-ms", "-5"),
        ("isbre.maintenance.orphan-files.interval-ms", "0"),
        ("isbre.maintenance.compact.enabled", "maybe"),
        ("isbre.maintenance.compact.min-input-files", "0"),
        ("isbre.maintenance.compact.target-file-size-bytes", "big"),
    ]:
        answer = commit_properties(maintained, "policies", {key: value})
        assert answer.status_code == 400, answer.text
        assert key in answer.json()["error"]["message"]
    created = http.post(
        f"{maintained.url}/v1/isbre/namespaces/m/tables",
        json={
            "name": "bad",
            "schema": {"type": "struct", "fields": []},
            "properties": {"isbre.maintenance.enabled": "1"},
        },
    )
    assert created.status_code == 400 and "isbre.maintenance.enabled" in created.text
    assert http.head(table_url(maintained, "bad")).status_code == 404


def test_the_endpoint_runs_jobs_now_and_refuses_unknown_ones(maintained: IsbreServer, rest: Catalog) -> None:
    table = rest.create_table("m.now", schema=batch(0).schema, properties=POLICY)
    for i in range(5):
        table.append(batch(i))
    answer = http.post(
        f"{table_url(maintained, 'now')}/maintenance",
        json={"jobs": ["expire-snapshots", "remove-orphan-files"]},
    )
    assert answer.status_code == 200, answer.text
    job, orphans = answer.json()["jobs"]
    assert job["job"] == "expire-snapshots" and job["committed"] and job["removed-snapshots"] == 2
    # The expired snapshots' files went with the expiry; nothing else is old enough to be an orphan.
    assert orphans == {
        "job": "remove-orphan-files",
        "committed": False,
        "removed-snapshots": 0,
        "removed-refs": [],
        "deleted-files": 0,
    }
    unknown = http.post(f"{table_url(maintained, 'now')}/maintenance", json={"jobs": ["defragment"]})
    assert unknown.status_code == 400 and "defragment" in unknown.json()["error"]["message"]
    empty = http.post(f"{table_url(maintained, 'now')}/maintenance", json={"jobs": []})
    assert empty.status_code == 400
    metrics = http.get(f"{maintained.url}/metrics").text
    assert 'isbre_maintenance_jobs_total{job="expire-snapshots",outcome="ok"} 1' in metrics


def test_after_commits_the_catalog_expires_what_the_policy_makes_due(
    maintained: IsbreServer, rest: Catalog
) -> None:
    policy = {**POLICY, "isbre.maintenance.enabled": "true", "history.expire.min-snapshots-to-keep": "2"}
    table = rest.create_table("m.auto", schema=batch(0).schema, properties=policy)
    for i in range(6):
        table.append(batch(i))
    eventually(lambda: len(table.refresh().metadata.snapshots) == 2, "expired down to 2 snapshots")
    health = http.get(f"{maintained.url}/health").json()["components"]["maintenance"]
    assert health["status"] == "ok" and health["maintaining"]
    assert sorted(table.scan().to_arrow()["n"].to_pylist()) == sorted(n for i in range(6) for n in (i, i + 1))


def _orphan(table: Table, name: str, age_s: float) -> Path:
    root = local_path(table.location())
    assert root is not None
    path = root / "data" / name
    path.write_bytes(b"not referenced")
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def test_after_commits_the_catalog_removes_old_orphans_once_an_interval_has_passed(
    maintained: IsbreServer, rest: Catalog
) -> None:
    """A table whose orphan-files interval has passed since the catalog last looked loses its old
    orphans after a commit, and keeps its young ones; a table with the default interval (a day)
    keeps them through commits that the catalog handled before."""
    policy = {"isbre.maintenance.enabled": "true", "isbre.maintenance.orphan-files.min-age-ms": "3600000"}
    eager = rest.create_table(
        "m.orphans",
        schema=batch(0).schema,
        properties={**policy, "isbre.maintenance.orphan-files.interval-ms": "1"},
    )
    daily = rest.create_table("m.orphans_daily", schema=batch(0).schema, properties=policy)
    eager.append(batch(0))
    daily.append(batch(0))
    old, young = _orphan(eager, "lost.parquet", 86_400), _orphan(eager, "in-flight.parquet", 0)
    kept = _orphan(daily, "lost.parquet", 86_400)

    def commits_until_removed() -> bool:
        daily.append(batch(2))  # handled before the eager table's commit that follows
        eager.append(batch(2))
        return not old.exists()

    eventually(commits_until_removed, "the old orphan removed after a commit", every=0.2)
    assert young.exists() and kept.exists()
    assert numbers(eager.refresh())[:2] == [0, 1] and all(map(exists, read_files(eager)))


def test_after_commits_the_catalog_compacts_in_a_process_of_its_own(
    maintained: IsbreServer, rest: Catalog
) -> None:
    policy = {**COMPACTING, "isbre.maintenance.enabled": "true", "isbre.maintenance.compact.enabled": "true"}
    table = rest.create_table("m.compacted", schema=batch(0).schema, properties=policy)
    for i in range(7):
        table.append(batch(2 * i))

    eventually(lambda: compacted(table), "a replace snapshot", timeout=60)
    assert numbers(table) == list(range(14)) and len(data_files(table)) < 7

    def counted() -> bool:  # once the job's process has answered
        metrics = http.get(f"{maintained.url}/metrics").text
        return 'isbre_maintenance_jobs_total{job="compact-data-files",outcome="ok"}' in metrics

    eventually(counted, "the compaction counted in /metrics")
    assert "isbre_maintenance_files_rewritten_total 0" not in http.get(f"{maintained.url}/metrics").text
    status = http.get(f"{table_url(maintained, 'compacted')}/maintenance").json()
    assert "compact-data-files" not in status["due"] and status["last-maintenance-at"] is not None
    # Asked for, it runs in a job process too, and answers what it did.
    for i in range(5):
        table.append(batch(100 + 2 * i))
    answer = http.post(
        f"{table_url(maintained, 'compacted')}/maintenance", json={"jobs": ["compact-data-files"]}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    (job,) = answer.json()["jobs"]
    if job["committed"]:  # unless the maintainer was there first
        assert job["rewritten-files"] >= 5 and job["added-files"] == 1 and job["rewritten-bytes"] > 0
    eventually(lambda: len(data_files(table.refresh())) == 1, "the new appends compacted too", timeout=60)
    assert numbers(table) == [*range(14), *range(100, 110)]


def test_a_table_that_does_not_ask_is_never_maintained(maintained: IsbreServer, rest: Catalog) -> None:
    table = rest.create_table("m.untouched", schema=batch(0).schema, properties=POLICY)
    for i in range(4):
        table.append(batch(i))
    marker = rest.create_table(
        "m.marker", schema=batch(0).schema, properties={**POLICY, "isbre.maintenance.enabled": "true"}
    )
    for i in range(4):
        marker.append(batch(i))
    eventually(lambda: len(marker.refresh().metadata.snapshots) == 3, "the marker table maintained")
    assert len(table.refresh().metadata.snapshots) == 4  # the maintainer passed it by


def test_a_table_s_maintenance_status_says_what_is_due(maintained: IsbreServer, rest: Catalog) -> None:
    table = rest.create_table("m.status", schema=batch(0).schema, properties=POLICY)
    for i in range(4):
        table.append(batch(i))
    status = http.get(f"{table_url(maintained, 'status')}/maintenance").json()
    assert status["snapshots"] == 4 and status["due"] == ["expire-snapshots"] and not status["maintained"]
    assert status["data-files"] == 4 and status["average-data-file-bytes"] > 0
    assert status["metadata-file-bytes"] > 0 and status["last-maintenance-at"] is None
    http.post(f"{table_url(maintained, 'status')}/maintenance", json={"jobs": ["expire-snapshots"]})
    status = http.get(f"{table_url(maintained, 'status')}/maintenance").json()
    assert status["snapshots"] == 3 and status["due"] == [] and status["last-maintenance-at"] is not None
    assert http.get(f"{table_url(maintained, 'nosuch')}/maintenance").status_code == 404


def test_a_path_spelled_into_another_table_is_never_deleted(catalog: Catalog) -> None:
    """A snapshot that names another table's file by a path through `..`: the deleter judges the
    path as it resolves, so expiry leaves the file and says it skipped it."""
    victim = catalog.create_table("db.victim", schema=batch(0).schema)
    victim.append(batch(7))
    (target,) = data_files(victim.refresh())
    table = appended(catalog, 1, {**POLICY, "history.expire.min-snapshots-to-keep": "1"})
    relative = target.removeprefix(victim.metadata.location.rsplit("/", 1)[0] + "/")
    hostile = f"{table.metadata.location}/../{relative}"
    table.add_files([hostile])  # a commit that names the victim's file, spelled as the table's
    table.overwrite(batch(300))  # now only expired snapshots name it
    (report,) = service_of(catalog).maintenance.run(
        Identifier.of(("db",), "t"), ["expire-snapshots"], FAR_FUTURE_MS
    )
    assert report.committed and hostile in report.skipped_files
    assert exists(target) and victim.refresh().scan().to_arrow()["n"].to_pylist() == [7, 8]


def test_new_tables_get_the_warehouse_s_and_namespace_s_defaults_under_their_own(tmp_path: Path) -> None:
    defaults = {
        "isbre": {"isbre.maintenance.enabled": "true", "history.expire.min-snapshots-to-keep": "5"},
        "isbre.raw": {"history.expire.min-snapshots-to-keep": "50"},
        "isbre.raw.deep": {"history.expire.max-snapshot-age-ms": "60000"},
    }
    server = InProcessServer(
        tmp_path / "warehouse", env={"ISBRE_TABLE_DEFAULTS": json.dumps(defaults)}
    ).start()
    try:
        catalog = RestCatalog("defaults", uri=server.url)
        for namespace in ("raw", "raw.deep", "other"):
            catalog.create_namespace(namespace)
        schema = batch(0).schema
        deep = catalog.create_table(
            "raw.deep.t", schema, properties={"history.expire.min-snapshots-to-keep": "7"}
        )
        raw, other = catalog.create_table("raw.t", schema), catalog.create_table("other.t", schema)
        keys = (
            "isbre.maintenance.enabled",
            "history.expire.min-snapshots-to-keep",
            "history.expire.max-snapshot-age-ms",
        )

        def policy(table: Table) -> list[str | None]:
            return [table.properties.get(key) for key in keys]

        assert policy(deep) == ["true", "7", "60000"]  # its own wins, then the innermost namespace's
        assert policy(raw) == ["true", "50", None]
        assert policy(other) == ["true", "5", None]
    finally:
        server.stop()


def test_table_defaults_that_cannot_apply_are_refused_at_start(tmp_path: Path) -> None:
    unknown = Settings(warehouse=str(tmp_path), table_defaults={"elsewhere.raw": {"a": "b"}})
    with pytest.raises(ValueError, match=r"'elsewhere\.raw' names no warehouse served"):
        warehouses(unknown)
    invalid = Settings(
        warehouse=str(tmp_path), table_defaults={"isbre.raw": {"history.expire.min-snapshots-to-keep": "0"}}
    )
    with pytest.raises(ValueError, match=r"table_defaults of 'isbre\.raw': .*min-snapshots-to-keep"):
        open_warehouses(tmp_path / "store", warehouses(invalid))


@pytest.mark.parametrize("appends", [12, 30])
def test_kill_9_while_maintenance_runs_leaves_no_table_pointing_at_a_deleted_file(
    tmp_path: Path, appends: int
) -> None:
    """Appends to a table whose every commit makes expiry and metadata removal due (and every
    third compaction), and kill -9 of the server among them (at a different point in each run):
    after a restart every file the table's metadata reaches is there, and every snapshot it keeps
    can be read."""
    server = IsbreServer(tmp_path / "warehouse", env={"ISBRE_MAINTENANCE_INTERVAL_SECONDS": "0.02"}).start()
    catalog = RestCatalog("crash", uri=server.url)
    catalog.create_namespace("db")
    eager = {
        "isbre.maintenance.enabled": "true",
        "history.expire.max-snapshot-age-ms": "1",
        "history.expire.min-snapshots-to-keep": "2",
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "2",
        "isbre.maintenance.compact.enabled": "true",
        "isbre.maintenance.compact.min-input-files": "3",
    }
    table = catalog.create_table("db.t", schema=batch(0).schema, properties=eager)
    for i in range(appends):
        table.append(batch(2 * i))
    # Killed once expiry has run at least once (on a busy machine a job's process starts slowly),
    # while the jobs the later appends made due are still running or waiting.
    eventually(
        lambda: len(catalog.load_table("db.t").metadata.snapshots) < appends,
        "expiry ran among the appends",
        timeout=120,
    )
    server.kill()
    restarted = IsbreServer(server.warehouse).start()
    try:
        table = RestCatalog("after", uri=restarted.url).load_table("db.t")
        assert table.metadata_location is not None
        reached = read_files(table)
        missing = [uri for uri in reached if not exists(uri)]
        assert missing == [], missing[:5]
        for snapshot in table.metadata.snapshots:
            table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()
        assert table.scan().to_arrow().num_rows == 2 * appends  # every acknowledged append
        assert len(table.metadata.snapshots) < appends  # expiry ran among the appends
    finally:
        restarted.stop()


Files = set[str]  # "data/<name>" and "metadata/<name>" of a table


def _files(root: Path) -> Files:
    return {f"{place}/{name}" for place in ("data", "metadata") for name in os.listdir(root / place)}


def _written(before: Files, now: Files, matches: Callable[[str], bool]) -> bool:
    return any(matches(path) for path in now - before)


def _deleted(before: Files, now: Files) -> bool:
    return bool(before - now)


def _manifest(path: str) -> bool:
    return path.endswith(".avro") and not path.startswith("metadata/snap-")


def _metadata_file(path: str) -> bool:
    return path.endswith(".metadata.json")


# Each step of each job, as the files it leaves show it (what it has written, that it has begun
# to delete); the job's process is killed as soon as its step shows.
STEPS: dict[str, dict[str, Callable[[Files, Files], bool]]] = {
    "compact-data-files": {
        "started": lambda before, now: True,
        "data file written": lambda before, now: _written(before, now, lambda p: p.endswith(".parquet")),
        "manifest list written": lambda before, now: _written(before, now, lambda p: "/snap-" in p),
        "metadata file written": lambda before, now: _written(before, now, _metadata_file),
    },
    "rewrite-manifests": {
        "started": lambda before, now: True,
        "manifest written": lambda before, now: _written(before, now, _manifest),
        "manifest list written": lambda before, now: _written(before, now, lambda p: "/snap-" in p),
        "metadata file written": lambda before, now: _written(before, now, _metadata_file),
    },
    "expire-snapshots": {
        "started": lambda before, now: True,
        "metadata file written": lambda before, now: _written(before, now, _metadata_file),
        "deleting": _deleted,
    },
    "remove-metadata-files": {"started": lambda before, now: True, "deleting": _deleted},
    "remove-orphan-files": {"started": lambda before, now: True, "deleting": _deleted},
}
# Every job has work to do on the table the test builds.
EVERY_JOB_DUE = {
    **COMPACTING,
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "2",
    "isbre.maintenance.orphan-files.min-age-ms": "3600000",
}
KILLED_APPENDS = 12
# Files the removals delete besides the table's own, so that their deleting lasts long enough to
# be seen: old metadata files of a long history, and files no snapshot names, a day old.
PILED_UP = 300


def _metadata_files(table: Table) -> set[str]:
    root = local_path(table.location())
    assert root is not None
    return {name for name in os.listdir(root / "metadata") if _metadata_file(name)}


# What each job leaves once it has run to its end, whatever an earlier run of it was killed at.
FINISHED: dict[str, Callable[[Table, set[Path]], bool]] = {
    "compact-data-files": lambda table, _: len(data_files(table)) == 1,
    "rewrite-manifests": lambda table, _: len(table.current_snapshot().manifests(table.io)) == 1,  # type: ignore[union-attr]
    "expire-snapshots": lambda table, _: len(table.metadata.snapshots) == 3,
    "remove-metadata-files": lambda table, _: (
        len(_metadata_files(table)) == 1 + len(table.metadata.metadata_log)
    ),
    "remove-orphan-files": lambda _, orphans: not any(path.exists() for path in orphans),
}


@pytest.mark.parametrize(("job", "step"), [(job, step) for job, steps in STEPS.items() for step in steps])
def test_kill_9_of_a_job_s_process_at_each_step_leaves_the_table_whole(
    catalog: Catalog, job: str, step: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The process running `job` killed once it has reached `step`: every file the table reaches
    is there, every snapshot it keeps reads the same rows, and the job run again finishes the work.
    A server runs compaction and manifest rewriting in a process of its own; expiry and the
    removals run in the server itself, and their process here stands for it (a server kill -9
    among appends is the test above). A step the job passed before the kill reached it is killed
    later: what must hold, holds at every point."""
    table = appended(catalog, KILLED_APPENDS, EVERY_JOB_DUE)
    root = local_path(table.location())
    assert root is not None
    orphans = {_orphan(table, f"lost-{i}.parquet", 86_400) for i in range(PILED_UP)}
    for _ in range(PILED_UP):
        (root / "metadata" / f"00000-{uuid.uuid4()}.metadata.json").write_bytes(b"{}")
    expected = list(range(2 * KILLED_APPENDS))
    kept = {s.snapshot_id: numbers(table, s.snapshot_id) for s in table.metadata.snapshots}
    service = service_of(catalog)
    warehouse = Warehouse(service.name, service.core.warehouse)
    processes = JobProcesses(str(default_store(warehouse)), [warehouse])
    before, reached, ran = _files(root), STEPS[job][step], threading.Event()

    def job_running() -> psutil.Process | bool:
        return job_process(psutil.Process()) or ran.is_set()

    def kill_at_the_step() -> None:
        child = eventually(job_running, f"{job}'s process", 60, 0.001)
        eventually(lambda: ran.is_set() or reached(before, _files(root)), f"{job} at {step}", 60, 0.0005)
        if isinstance(child, psutil.Process):
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()

    killer = threading.Thread(target=kill_at_the_step)
    killer.start()
    with contextlib.suppress(JobProcessError):  # killed before it answered
        processes.run(service.name, T, job, int(time.time() * 1000))
    ran.set()
    killer.join()
    table = table.refresh()
    assert all(map(exists, read_files(table)))
    assert numbers(table) == expected
    # A snapshot the job committed before the kill replaced the head's files: it reads the head's rows.
    assert all(
        numbers(table, s.snapshot_id) == kept.get(s.snapshot_id, expected) for s in table.metadata.snapshots
    )
    caplog.set_level(logging.INFO, logger="isbre.catalog")
    (report,) = service.maintenance.run(T, [job])
    assert not report.problems, (report, caplog.text)
    table = table.refresh()
    assert FINISHED[job](table, orphans) and numbers(table) == expected


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server whose maintenance thread looks at quiet tables every 2 s (ten 0.2 s intervals)."""
    warehouse = tmp_path_factory.mktemp("quick") / "warehouse"
    server = InProcessServer(warehouse, env={"ISBRE_MAINTENANCE_INTERVAL_SECONDS": "0.2"}).start()
    yield server
    server.stop()


def test_a_quiet_table_reaches_its_policy_without_another_commit(quick: IsbreServer) -> None:
    catalog = RestCatalog("isbre", uri=quick.url)
    catalog.create_namespace_if_not_exists("q")
    policy = {
        "isbre.maintenance.enabled": "true",
        "history.expire.max-snapshot-age-ms": "5000",
        "history.expire.min-snapshots-to-keep": "2",
    }
    table = catalog.create_table("q.quiet", schema=batch(0).schema, properties=policy)
    for i in range(6):
        table.append(batch(2 * i))
    high = quick.high_water()
    eventually(lambda: len(table.refresh().metadata.snapshots) == 2, "expired while quiet", timeout=60)
    commits = list(http.get(f"{quick.url}/v1/isbre/namespaces/q/tables/quiet/maintenance").json()["due"])
    assert commits == [] and numbers(table) == list(range(12))
    assert quick.high_water() == high + 1  # the expiry's own commit, and no other


def test_metadata_files_past_previous_versions_max_go_on_every_table(quick: IsbreServer) -> None:
    """Iceberg's own `write.metadata.delete-after-commit.enabled` is honoured on a table that does
    not ask for the catalog's maintenance, as Iceberg's own catalogs honour it after a commit."""
    catalog = RestCatalog("isbre", uri=quick.url)
    catalog.create_namespace_if_not_exists("q")
    properties = {
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "3",
    }
    table = catalog.create_table("q.cleaned", schema=batch(0).schema, properties=properties)
    url = f"{quick.url}/v1/isbre/namespaces/q/tables/cleaned"
    for i in range(20):
        body = {"updates": [{"action": "set-properties", "updates": {"i": str(i)}}]}
        assert http.post(url, json=body).status_code == 200
    directory = local_path(f"{table.location()}/metadata")
    assert directory is not None
    eventually(
        lambda: len(list(directory.glob("*.metadata.json"))) == 4, "3 previous versions and the current"
    )
    assert catalog.load_table("q.cleaned").properties["i"] == "19"


def test_a_job_that_finds_nothing_to_do_says_why(maintained: IsbreServer, rest: Catalog) -> None:
    table = rest.create_table(
        "m.idle", schema=batch(0).schema, properties={"isbre.maintenance.compact.min-input-files": "50"}
    )
    for i in range(5):
        table.append(batch(i))
    answer = http.post(
        f"{table_url(maintained, 'idle')}/maintenance",
        json={"jobs": ["expire-snapshots", "compact-data-files", "remove-metadata-files"]},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    expire, compact, metadata = answer.json()["jobs"]
    assert "retention" in expire["nothing-to-do"]
    assert compact["nothing-to-do"] == (
        "no partition holds isbre.maintenance.compact.min-input-files = 50 small data files (the most: 5)"
    )
    assert "write.metadata.delete-after-commit.enabled" in metadata["nothing-to-do"]
