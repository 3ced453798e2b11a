"""What a change feed keeps between plans: a data file's rows are read once while kept (a file
never changes), again when its deletes or the table's schema differ."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from isbre.catalog.file_uris import local_path
from isbre.events.change_reads import FileRows
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.table import Table
from pyiceberg.types import StringType


@pytest.fixture
def table(tmp_path: Path) -> Table:
    catalog = SqlCatalog("rows", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=tmp_path.as_uri())
    catalog.create_namespace("n")
    created = catalog.create_table("n.t", pa.schema([pa.field("id", pa.int64())]))
    created.append(pa.table({"id": pa.array(range(10), pa.int64())}))
    return created


def read(table: Table, kept: FileRows) -> list[pa.Table]:
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    return kept.read(table, scan, list(table.scan().plan_files()))


def test_a_kept_file_is_not_read_again(table: Table) -> None:
    kept = FileRows()
    first = read(table, kept)
    assert first[0]["id"].to_pylist() == list(range(10))
    data_file = next(iter(table.scan().plan_files())).file.file_path
    gone = local_path(data_file)
    assert gone is not None
    gone.unlink()
    assert read(table, kept)[0].equals(first[0])
    with pytest.raises(FileNotFoundError):
        read(table, FileRows())  # nothing kept: the file is read, and it is gone


def test_a_file_is_read_again_in_a_new_schema(table: Table) -> None:
    kept = FileRows()
    read(table, kept)
    with table.update_schema() as update:
        update.add_column("note", StringType())
    again = read(table, kept)
    assert again[0].column_names == ["id", "note"]
    assert again[0]["note"].null_count == 10


def test_a_file_too_large_to_keep_is_read_each_time(table: Table) -> None:
    kept = FileRows(capacity=1)
    read(table, kept)
    data_file = local_path(next(iter(table.scan().plan_files())).file.file_path)
    assert data_file is not None
    data_file.unlink()
    with pytest.raises(FileNotFoundError):
        read(table, kept)
