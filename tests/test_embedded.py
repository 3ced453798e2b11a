"""The embedded catalog: PyIceberg's load_catalog over an LMDB warehouse, no server."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from isbre.catalog.embedded import LmdbCatalog
from pyiceberg.catalog import load_catalog


def open_catalog(warehouse: Path) -> LmdbCatalog:
    catalog = load_catalog(
        "local", **{"py-catalog-impl": "isbre.catalog.embedded.LmdbCatalog", "warehouse": str(warehouse)}
    )
    assert isinstance(catalog, LmdbCatalog)
    return catalog


def test_embedded_round_trip_survives_reopen(tmp_path: Path) -> None:
    warehouse = tmp_path / "warehouse"
    catalog = open_catalog(warehouse)
    catalog.create_namespace("db")
    table = catalog.create_table("db.events", schema=pa.schema([pa.field("n", pa.int64())]))
    table.append(pa.table({"n": pa.array(range(100), pa.int64())}))
    with table.transaction() as tx:
        tx.set_properties(source="embedded")
    catalog.close()

    reopened = open_catalog(warehouse)
    loaded = reopened.load_table("db.events")
    assert loaded.scan().to_arrow().num_rows == 100
    assert loaded.properties["source"] == "embedded"
    assert reopened.list_tables("db") == [("db", "events")]
    kinds = [r.kind for r in reopened.service.core.commit_log.records()]
    assert kinds == ["namespace.create", "table.create", "table.commit", "table.commit"]
    reopened.close()


def test_two_catalogs_in_one_process_share_the_store(tmp_path: Path) -> None:
    first = open_catalog(tmp_path / "wh")
    second = open_catalog(tmp_path / "wh")
    first.create_namespace("shared")
    assert second.namespace_exists("shared")
    first.close()
    assert second.list_namespaces() == [("shared",)]
    second.close()


def test_an_overwrite_commit_is_recorded_as_one_overwrite(tmp_path: Path) -> None:
    catalog = open_catalog(tmp_path / "wh")
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=pa.schema([pa.field("n", pa.int64())]))
    table.append(pa.table({"n": pa.array([1, 2, 3], pa.int64())}))
    table.overwrite(pa.table({"n": pa.array([9], pa.int64())}))
    record = list(catalog.service.core.commit_log.records())[-1]
    assert record.operation == "overwrite"
    assert record.summary is not None
    assert record.summary["deleted_records"] == 3
    assert record.summary["added_records"] == 1
    assert record.summary["total_records"] == 1
    assert record.snapshot_id == catalog.load_table("db.t").current_snapshot().snapshot_id
    catalog.close()
