"""The catalog's own commits obey Iceberg's conflict rules: a position delete or deletion vector
committed while compaction rewrites the files it deletes from wins, and the compaction of those
files is abandoned; an equality delete committed meanwhile applies to the compacted files (they
keep the starting sequence number); a tag made while expiry plans keeps its snapshot.

Each race is made deterministic the way tests/test_maintenance.py makes it: the job is held after it
has read and rewritten its files, before it commits, while the test commits the other change. What
the table then reads (PyIceberg applies position and equality deletes) is compared with a model:
the rows appended, less the rows deleted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from isbre.catalog import Identifier, conflicts, own_commits
from isbre.catalog.conflicts import ConflictError, check_rewrite_files
from isbre.catalog.embedded import LmdbCatalog
from isbre.catalog.maintenance import JobReport
from isbre.catalog.plans import PlanRequest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from tests.duck import connect
from tests.row_deltas import commit_deletes, equality_deletes, position_deletes
from tests.test_maintenance import exists, service_of

COMPACTING = {"isbre.maintenance.compact.min-input-files": "5"}
SCHEMA = Schema(
    NestedField(1, "p", StringType(), required=False), NestedField(2, "n", LongType(), required=False)
)
BY_P = PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "p"))
T = Identifier.of(("db",), "t")
APPENDS = 6


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    embedded = LmdbCatalog("local", warehouse=str(tmp_path / "warehouse"))
    embedded.create_namespace("db")
    return embedded


def rows(table: Table, workdir: Path, pyiceberg_too: bool = True) -> list[tuple[str, int]]:
    """What the table reads, as DuckDB's iceberg extension reads its metadata file; PyIceberg reads
    the same unless told not to (it reads no equality deletes)."""
    table = table.refresh()
    duck = connect(workdir)
    found = sorted(duck.execute("SELECT p, n FROM iceberg_scan(?)", [table.metadata_location]).fetchall())
    if pyiceberg_too:
        arrow = table.scan().to_arrow()
        assert sorted(zip(arrow["p"].to_pylist(), arrow["n"].to_pylist(), strict=True)) == found
    return found


def appended(catalog: Catalog, partitions: tuple[str, ...], spec: PartitionSpec = BY_P) -> Table:
    """Six appends, each of two rows in each of `partitions`: one small file per partition each."""
    table = catalog.create_table("db.t", schema=SCHEMA, partition_spec=spec, properties=COMPACTING)
    arrow_schema = pa.schema([pa.field("p", pa.string()), pa.field("n", pa.int64())])
    for i in range(APPENDS):
        batch = [(p, 10 * i + k) for p in partitions for k in range(2)]
        table.append(pa.Table.from_pylist([{"p": p, "n": n} for p, n in batch], schema=arrow_schema))
    return table.refresh()


def file_holding(table: Table, p: str, n: int) -> DataFile:
    """The data file of the current snapshot that holds the row (p, n)."""
    for task in table.scan().plan_files():
        with table.io.new_input(task.file.file_path).open() as stream:
            if {"p": p, "n": n} in pq.read_table(stream).to_pylist():
                return task.file
    raise AssertionError(f"no file holds {(p, n)}")


def compact_while(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], object]
) -> tuple[JobReport, list[str]]:
    """Compact the table while `meanwhile` commits: after the job has read and rewritten its first
    group of files, before it commits. The report, and the files the job wrote."""
    service = service_of(catalog)
    rewrite = service.maintenance._rewritten
    written: list[str] = []

    def held_before_commit(metadata: Any, rows: pa.Table, io: Any) -> list[DataFile]:
        files = rewrite(metadata, rows, io)
        if not written:
            meanwhile()
        written.extend(f.file_path for f in files)
        return files

    monkeypatch.setattr(service.maintenance, "_rewritten", held_before_commit)
    (report,) = service.maintenance.run(T, ["compact-data-files"])
    return report, written


def model(partitions: tuple[str, ...], deleted: set[tuple[str, int]]) -> list[tuple[str, int]]:
    return sorted({(p, 10 * i + k) for i in range(APPENDS) for p in partitions for k in range(2)} - deleted)


def test_a_position_delete_committed_while_compaction_runs_keeps_its_rows_deleted(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    table = appended(catalog, ("a",))
    target = file_holding(table, "a", 20)
    deleted = position_deletes(table, target, [0])
    report, written = compact_while(catalog, monkeypatch, lambda: commit_deletes(table.refresh(), [deleted]))
    assert not report.committed and not report.problems
    (abandoned,) = report.abandoned
    assert abandoned.startswith(f"{APPENDS} file(s) left as they were")
    # The delete's file_path bounds name one file: that one conflicts, and with it its group.
    said = "1 data file(s) the rewrite replaces have deletes committed since it started, first"
    assert f"{said} {target.file_path}" in abandoned
    assert rows(table, tmp_path) == model(("a",), {("a", 20)})
    assert written and not any(map(exists, written))
    current = table.refresh().current_snapshot()
    assert current is not None and current.summary is not None and current.summary.operation.value == "delete"


def data_sequence_numbers(table: Table) -> dict[str, int | None]:
    """Each live data file's data sequence number, as its manifest entry says it."""
    current = table.refresh().current_snapshot()
    assert current is not None
    return {
        entry.data_file.file_path: entry.sequence_number
        for manifest in current.manifests(table.io)
        if manifest.content == ManifestContent.DATA
        for entry in manifest.fetch_manifest_entry(table.io)
    }


def test_an_equality_delete_committed_while_compaction_runs_applies_to_the_compacted_files(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As Java's rewrite with the starting sequence number: the compacted files take the data
    sequence number of the snapshot compaction read them at, so that an equality delete committed
    meanwhile (a newer one) applies to them too, and compaction commits."""
    unpartitioned = PartitionSpec()
    table = appended(catalog, ("a",), unpartitioned)
    started = table.current_snapshot()
    assert started is not None and started.sequence_number is not None
    deleted = equality_deletes(table, "n", [1, 31])
    report, written = compact_while(catalog, monkeypatch, lambda: commit_deletes(table.refresh(), [deleted]))
    assert report.committed and not report.abandoned and not report.problems
    assert rows(table, tmp_path, pyiceberg_too=False) == model(("a",), {("a", 1), ("a", 31)})
    assert written and all(map(exists, written))
    assert {path: data_sequence_numbers(table)[path] for path in written} == dict.fromkeys(
        written, started.sequence_number
    )


def test_compaction_applies_the_deletes_committed_before_it(catalog: Catalog, tmp_path: Path) -> None:
    """The rows compaction writes are those a reader reads: position and equality deletes applied.
    Its new file takes a sequence number above every delete's, so none applies to it any more."""
    table = appended(catalog, ("a",), PartitionSpec())
    commit_deletes(table, [position_deletes(table, file_holding(table, "a", 20), [0])])
    commit_deletes(table.refresh(), [equality_deletes(table, "n", [1, 31])])
    left = model(("a",), {("a", 20), ("a", 1), ("a", 31)})
    assert rows(table, tmp_path, pyiceberg_too=False) == left
    (report,) = service_of(catalog).maintenance.run(T, ["compact-data-files"])
    assert report.committed and (report.rewritten_files, report.added_files) == (APPENDS, 1)
    resolved = service_of(catalog).plans.resolve(T, PlanRequest())
    (task,) = resolved.planner.tasks(resolved.planner.data_manifests())
    assert task.deletes == () and task.data_file.record_count == len(left)
    # The two delete files applied to nothing left: dropped in the same snapshot, so PyIceberg,
    # which refuses any equality delete, reads the table again, and reads what DuckDB reads.
    current = table.refresh().current_snapshot()
    assert current is not None and current.summary is not None
    assert current.summary["removed-delete-files"] == "2"
    live = [e for m in current.manifests(table.io) for e in m.fetch_manifest_entry(table.io)]
    assert [e.data_file.content for e in live] == [DataFileContent.DATA]
    assert rows(table, tmp_path) == left


def test_compaction_that_applied_deletes_moves_onto_an_append_committed_meanwhile(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The replace that applied the deletes (and dropped them) is moved onto the append: both
    stay, the append's rows and the deleted rows' absence."""
    table = appended(catalog, ("a",), PartitionSpec())
    commit_deletes(table, [equality_deletes(table, "n", [1, 31])])
    arrow_schema = pa.schema([pa.field("p", pa.string()), pa.field("n", pa.int64())])
    late = pa.Table.from_pylist([{"p": "a", "n": 1}, {"p": "a", "n": 99}], schema=arrow_schema)
    report, _ = compact_while(catalog, monkeypatch, lambda: table.refresh().append(late))
    assert report.committed and not report.abandoned
    # n = 1 again: appended after the delete, which does not apply to it.
    assert rows(table, tmp_path) == sorted([*model(("a",), {("a", 1), ("a", 31)}), ("a", 1), ("a", 99)])
    live = [
        e
        for m in table.refresh().current_snapshot().manifests(table.io)
        for e in m.fetch_manifest_entry(table.io)
    ]  # type: ignore[union-attr]
    assert {e.data_file.content for e in live} == {DataFileContent.DATA}


def test_compaction_is_moved_onto_an_equality_delete_committed_meanwhile_not_made_again(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A commit that only added manifests (an upsert sink's: rows and an equality delete file)
    changes nothing the replace wrote or read from: the replace is moved onto it, its manifests
    kept, as onto an append (catalog/rebase.py), instead of being made again from the manifests,
    which on a table an upsert sink writes all the time lost every race to the next commit."""
    table = appended(catalog, ("a",), PartitionSpec())
    made: list[object] = []
    make = own_commits.replace_files
    monkeypatch.setattr(own_commits, "replace_files", lambda *a: made.append(a) or make(*a))
    deleted = equality_deletes(table, "n", [1, 31])
    report, written = compact_while(catalog, monkeypatch, lambda: commit_deletes(table.refresh(), [deleted]))
    assert report.committed and not report.abandoned
    assert len(made) == 1
    assert rows(table, tmp_path, pyiceberg_too=False) == model(("a",), {("a", 1), ("a", 31)})
    replace = table.refresh().current_snapshot()
    assert replace is not None and replace.summary is not None
    assert replace.summary.operation.value == "replace"
    assert written and all(map(exists, written))


def test_an_equality_delete_committed_while_compaction_applies_older_ones_keeps_its_rows_deleted(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    table = appended(catalog, ("a",), PartitionSpec())
    commit_deletes(table, [equality_deletes(table, "n", [10])])
    later = equality_deletes(table, "n", [1, 31])
    report, written = compact_while(catalog, monkeypatch, lambda: commit_deletes(table.refresh(), [later]))
    assert report.committed and not report.abandoned
    assert rows(table, tmp_path, pyiceberg_too=False) == model(("a",), {("a", 10), ("a", 1), ("a", 31)})
    assert written and all(map(exists, written))


def test_a_delete_in_one_partition_abandons_that_partition_s_compaction_only(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    table = appended(catalog, ("a", "b"))
    target = file_holding(table, "a", 41)
    a_files = {t.file.file_path for t in table.scan().plan_files() if t.file.partition[0] == "a"}
    deleted = position_deletes(table, target, [1])
    report, written = compact_while(catalog, monkeypatch, lambda: commit_deletes(table.refresh(), [deleted]))
    assert report.committed and report.rewritten_files == APPENDS and report.added_files == 1
    (abandoned,) = report.abandoned
    assert abandoned.startswith(f"{APPENDS} file(s) left as they were")
    assert rows(table, tmp_path) == model(("a", "b"), {("a", 41)})
    files = {t.file.file_path: t.file.partition[0] for t in table.refresh().scan().plan_files()}
    assert {path for path, p in files.items() if p == "a"} == a_files  # a's small files, as they were
    assert sum(p == "b" for p in files.values()) == 1  # b's, compacted
    # a's group's new file is gone; b's is the table's.
    assert [path for path in written if exists(path)] == [path for path, p in files.items() if p == "b"]


def test_a_tag_made_while_expiry_plans_keeps_its_snapshot(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    table = catalog.create_table(
        "db.t",
        schema=SCHEMA,
        properties={"history.expire.max-snapshot-age-ms": "1", "history.expire.min-snapshots-to-keep": "1"},
    )
    arrow_schema = pa.schema([pa.field("p", pa.string()), pa.field("n", pa.int64())])
    for n in range(3):
        table.append(pa.Table.from_pylist([{"p": "a", "n": n}], schema=arrow_schema))
    oldest = table.refresh().metadata.snapshots[0].snapshot_id
    service = service_of(catalog)
    held = service.maintenance.consumers.held
    tagged: list[bool] = []

    def tag_first(ident: Identifier, now_ms: int) -> frozenset[int]:
        if not tagged:  # after the job loaded the table, before it plans and commits
            table.refresh().manage_snapshots().create_tag(oldest, "keep").commit()
            tagged.append(True)
        return held(ident, now_ms)

    monkeypatch.setattr(service.maintenance.consumers, "held", tag_first)
    (report,) = service.maintenance.run(T, ["expire-snapshots"], 10**13)
    table = table.refresh()
    assert report.committed and table.metadata.refs["keep"].snapshot_id == oldest
    assert table.snapshot_by_id(oldest) is not None and len(table.metadata.snapshots) == 2


def deletion_vector(table: Table, referenced: str) -> DataFile:
    """A deletion vector's manifest entry as a v3 manifest holds it: a Puffin blob that names the one
    data file it deletes from (only the entry is read here)."""
    found = DataFile.from_args(
        3,
        content=DataFileContent.POSITION_DELETES,
        file_path=f"{table.metadata.location}/data/dv.puffin",
        file_format=FileFormat.PUFFIN,
        partition=next(iter(table.scan().plan_files())).file.partition,
        record_count=1,
        file_size_in_bytes=64,
        referenced_data_file=referenced,
        content_offset=4,
        content_size_in_bytes=40,
    )
    found.spec_id = table.spec().spec_id
    return found


def test_a_deletion_vector_conflicts_with_the_rewrite_of_its_own_data_file_only(catalog: Catalog) -> None:
    """The rule Java's DeleteFileIndex applies: a deletion vector deletes from the one file it names."""
    table = appended(catalog, ("a",))
    start = table.metadata.current_snapshot_id
    files = [t.file for t in table.scan().plan_files()]
    named, other = files[0], files[1:]
    dv = conflicts._Delete(deletion_vector(table, named.file_path), spec_unpartitioned=False)
    assert conflicts._applies(dv, named) and not any(conflicts._applies(dv, f) for f in other)
    # On the table as it is, nothing was committed since the start: every file may be rewritten.
    check_rewrite_files(table.metadata, PyArrowFileIO(), start, files)
    commit_deletes(table, [position_deletes(table, named, [0])])
    with pytest.raises(ConflictError) as refused:
        check_rewrite_files(table.refresh().metadata, PyArrowFileIO(), start, files)
    assert refused.value.files == {named.file_path}  # the bounds of the delete's file_path name it


def test_a_deletion_vector_committed_while_compaction_runs_abandons_the_compaction(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compaction starts on a v2 table; meanwhile the table is upgraded to v3 and a deletion
    vector is committed for one of the files being rewritten: the compaction is abandoned, and
    the table's head is the vector's snapshot (its rows still deleted, by the vector)."""
    from isbre.catalog import TableChange
    from isbre.catalog.manifest_lists import read_manifests, write_manifests
    from isbre.catalog.pyiceberg_internals import ManifestWriterV3
    from isbre.rest.models import CommitTableRequest
    from pyiceberg.manifest import ManifestEntry, ManifestEntryStatus

    from tests.row_deltas import DeletesContent

    class DeletesV3(DeletesContent, ManifestWriterV3):
        pass

    table = appended(catalog, ("a",))
    target = file_holding(table, "a", 20)
    service = service_of(catalog)

    def commit(updates: list[dict[str, Any]]) -> None:
        request = CommitTableRequest.model_validate({"updates": updates})
        service.tables.commit(TableChange(T, tuple(request.requirements), tuple(request.updates)))

    def upgrade_and_delete() -> None:
        commit([{"action": "upgrade-format-version", "format-version": 3}])
        metadata = catalog.load_table("db.t").metadata
        parent = metadata.current_snapshot()
        assert parent is not None
        snapshot_id, io = 7_000_000_001, PyArrowFileIO()
        vector = deletion_vector(catalog.load_table("db.t"), target.file_path)
        manifest_path = f"{metadata.location}/metadata/dv-m0.avro"
        writer = DeletesV3(
            metadata.spec(), metadata.schema(), io.new_output(manifest_path), snapshot_id, "null"
        )
        with writer:
            writer.add_entry(
                ManifestEntry.from_args(
                    3, status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, data_file=vector
                )
            )
        listed = f"{metadata.location}/metadata/snap-dv.avro"
        kept = read_manifests(io, parent.manifest_list, 3)
        next_row_id = metadata.next_row_id  # type: ignore[attr-defined]
        sequence = metadata.next_sequence_number()
        written = write_manifests(
            io,
            listed,
            3,
            snapshot_id,
            parent.snapshot_id,
            sequence,
            next_row_id,
            "null",
            [writer.to_manifest_file(), *kept],
        )
        snapshot = {
            "snapshot-id": snapshot_id,
            "parent-snapshot-id": parent.snapshot_id,
            "sequence-number": sequence,
            "timestamp-ms": parent.timestamp_ms + 1,
            "manifest-list": listed,
            "summary": {"operation": "delete"},
            "schema-id": metadata.current_schema_id,
            "first-row-id": next_row_id,
            "added-rows": written.assigned_rows,
        }
        ref = {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": snapshot_id}
        commit([{"action": "add-snapshot", "snapshot": snapshot}, ref])

    report, written = compact_while(catalog, monkeypatch, upgrade_and_delete)
    assert not report.committed and not report.problems
    (abandoned,) = report.abandoned
    assert f"have deletes committed since it started, first {target.file_path}" in abandoned
    assert catalog.load_table("db.t").metadata.current_snapshot_id == 7_000_000_001
    assert written and not any(map(exists, written))
