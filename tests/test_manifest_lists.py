"""Manifest lists as the catalog writes them when it makes a snapshot again: v3 row ids assigned
as the spec says, sequence numbers assigned to the snapshot's own manifests, and remembered
encodings that never stand for an entry whose content differs; lists read with the reader of the
schema they declare, kept for the next list declaring it."""

from __future__ import annotations

from pathlib import Path

import pytest
from isbre.catalog import manifest_lists
from isbre.catalog.lru import Lru
from isbre.catalog.manifest_lists import first_row_id, read_manifests, without_first_row_id, write_manifests
from pyiceberg.avro.encoder import BinaryEncoder
from pyiceberg.avro.file import MAGIC, META_SCHEMA, AvroFileHeader
from pyiceberg.avro.resolver import construct_writer
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import UNASSIGNED_SEQ, ManifestContent, ManifestFile, read_manifest_list

IO = PyArrowFileIO()


def manifest(
    name: str,
    sequence_number: int,
    added_rows: int,
    existing_rows: int = 0,
    content: ManifestContent = ManifestContent.DATA,
    row_id: int | None = None,
) -> ManifestFile:
    found = ManifestFile.from_args(
        3,
        manifest_path=f"file:///lake/t/metadata/{name}.avro",
        manifest_length=4096,
        partition_spec_id=0,
        content=content,
        sequence_number=sequence_number,
        min_sequence_number=sequence_number,
        added_snapshot_id=7,
        added_files_count=1,
        existing_files_count=1 if existing_rows else 0,
        deleted_files_count=0,
        added_rows_count=added_rows,
        existing_rows_count=existing_rows,
        deleted_rows_count=0,
        partitions=[],
    )
    return found if row_id is None else _with_row_id(found, row_id)


def _with_row_id(found: ManifestFile, row_id: int) -> ManifestFile:
    moved = without_first_row_id(found)
    moved[len(moved) - 1] = row_id
    return moved


def test_a_v3_list_keeps_row_ids_and_gives_new_data_manifests_theirs(tmp_path: Path) -> None:
    kept = manifest("kept", 3, added_rows=5, existing_rows=5, row_id=100)
    new = manifest("new", UNASSIGNED_SEQ, added_rows=7, existing_rows=2)
    deletes = manifest("deletes", UNASSIGNED_SEQ, added_rows=3, content=ManifestContent.DELETES)
    older = manifest("older", UNASSIGNED_SEQ, added_rows=4)
    location = str(tmp_path / "list.avro")
    written = write_manifests(IO, location, 3, 7, 6, 9, 110, "deflate", [new, kept, deletes, older])
    read = {m.manifest_path.rsplit("/", 1)[1]: m for m in read_manifests(IO, location, 3)}
    # In list order from the table's next row id, each data manifest's added and existing rows.
    assert {name: first_row_id(m) for name, m in read.items()} == {
        "new.avro": 110,
        "kept.avro": 100,
        "deletes.avro": None,
        "older.avro": 119,
    }
    assert written.assigned_rows == 9 + 4
    assert [first_row_id(m) for m in written.manifests] == [110, 100, None, 119]
    assert {m.sequence_number for name, m in read.items() if name != "kept.avro"} == {9}
    assert read["kept.avro"].sequence_number == 3


def test_a_v2_list_has_no_row_ids(tmp_path: Path) -> None:
    location = str(tmp_path / "list.avro")
    two = ManifestFile(*(manifest("a", UNASSIGNED_SEQ, 4)[i] for i in range(15)))
    written = write_manifests(IO, location, 2, 7, None, 4, None, "deflate", [two])
    (read,) = read_manifests(IO, location, 2)
    assert written.assigned_rows == 0 and read.sequence_number == 4 and first_row_id(read) is None


def test_a_remembered_encoding_is_used_only_for_the_same_entry(tmp_path: Path) -> None:
    encodings: Lru = Lru(64)
    first, second = str(tmp_path / "first.avro"), str(tmp_path / "second.avro")
    same = manifest("same", 3, 10, row_id=0)
    write_manifests(IO, first, 3, 7, 6, 4, 10, "deflate", [same], encodings)
    # The same manifest with another sequence number (as a list made again gives it) and row id.
    again = manifest("same", 5, 10, row_id=20)
    write_manifests(IO, second, 3, 8, 7, 6, 30, "deflate", [same, again], encodings)
    read = read_manifests(IO, second, 3)
    assert [(m.sequence_number, first_row_id(m)) for m in read] == [(3, 0), (5, 20)]
    assert encodings.weight == 2


def test_a_manifest_made_ready_again_leaves_the_one_read_as_it_was() -> None:
    read = manifest("kept", 3, 10, row_id=40)
    again = without_first_row_id(read)
    again.sequence_number = UNASSIGNED_SEQ
    assert (read.sequence_number, first_row_id(read)) == (3, 40)
    assert (again.sequence_number, first_row_id(again)) == (UNASSIGNED_SEQ, None)


def test_lists_of_other_schemas_read_in_turn_are_each_read_by_their_own(tmp_path: Path) -> None:
    # The reader of a schema is kept: a v2 list and a v3 list, each read as v2 and as v3, in turn,
    # twice, read as PyIceberg's own reader reads them.
    v2, v3 = str(tmp_path / "v2.avro"), str(tmp_path / "v3.avro")
    two = ManifestFile(*(manifest("two", UNASSIGNED_SEQ, 4)[i] for i in range(15)))
    write_manifests(IO, v2, 2, 7, None, 4, None, "deflate", [two])
    write_manifests(IO, v3, 3, 7, None, 5, 50, "null", [manifest("three", UNASSIGNED_SEQ, 6)])
    for _ in range(2):
        for location, name, row_id in ((v2, "two", None), (v3, "three", 50)):
            for version in (2, 3):
                (read,) = read_manifests(IO, location, version)
                assert read.manifest_path.endswith(f"/{name}.avro")
                assert first_row_id(read) == (row_id if version == 3 else None)
                assert [read[i] for i in range(15)] == [pyiceberg_read(location)[i] for i in range(15)]


def pyiceberg_read(location: str) -> ManifestFile:
    (only,) = read_manifest_list(IO.new_input(location))
    return only


def test_a_list_whose_schema_is_too_long_to_keep_is_read_all_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = str(tmp_path / "list.avro")
    write_manifests(IO, location, 3, 7, None, 5, 0, "deflate", [manifest("long", UNASSIGNED_SEQ, 6)])
    monkeypatch.setattr(manifest_lists, "_KEPT_SCHEMA_CHARS", 10)
    kept = manifest_lists._resolved.cache_info().currsize
    (read,) = read_manifests(IO, location, 3)
    assert read.manifest_path.endswith("/long.avro") and first_row_id(read) == 0
    assert manifest_lists._resolved.cache_info().currsize == kept


def test_a_list_declaring_no_schema_is_refused(tmp_path: Path) -> None:
    location = tmp_path / "bare.avro"
    with location.open("wb") as stream:
        construct_writer(META_SCHEMA).write(BinaryEncoder(stream), AvroFileHeader(MAGIC, {}, b"s" * 16))
    with pytest.raises(ValueError, match="No schema found"):
        read_manifests(IO, str(location), 2)
