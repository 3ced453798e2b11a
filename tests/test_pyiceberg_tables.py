"""A data engineer's session with PyIceberg's RestCatalog against a real isbre server."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from isbre.catalog.file_uris import local_path
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.expressions import EqualTo, GreaterThanOrEqual
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, StringType

# The REST suite runs against one server process and against two workers on one store.
SERVER_WORKERS = (1, 2)
SERVER_STORES = ("lmdb", "postgresql")

ORDERS = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),
        pa.field("region", pa.string()),
        pa.field("amount", pa.float32()),
    ]
)


def orders(ids: range, region: str = "eu") -> pa.Table:
    return pa.table(
        {
            "id": pa.array(list(ids), pa.int32()),
            "region": [region] * len(ids),
            "amount": pa.array([float(i) * 1.5 for i in ids], pa.float32()),
        },
        schema=ORDERS,
    )


def files_under(location: str) -> list[Path]:
    root = local_path(location)
    assert root is not None
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_create_append_and_scan_back(rest_catalog: RestCatalog, namespace: str) -> None:
    table = rest_catalog.create_table(f"{namespace}.orders", schema=ORDERS)
    table.append(orders(range(0, 100)))
    table.append(orders(range(100, 150), region="us"))

    loaded = rest_catalog.load_table(f"{namespace}.orders")
    assert loaded.scan().to_arrow().num_rows == 150
    us = loaded.scan(row_filter=EqualTo("region", "us")).to_arrow()
    assert sorted(us["id"].to_pylist()) == list(range(100, 150))
    assert len(loaded.history()) == 2
    assert rest_catalog.table_exists(f"{namespace}.orders")
    assert (namespace, "orders") in rest_catalog.list_tables(namespace)


def test_create_twice_is_already_exists(rest_catalog: RestCatalog, namespace: str) -> None:
    rest_catalog.create_table(f"{namespace}.t", schema=ORDERS)
    with pytest.raises(TableAlreadyExistsError):
        rest_catalog.create_table(f"{namespace}.t", schema=ORDERS)


def test_schema_evolution_add_rename_drop_promote(rest_catalog: RestCatalog, namespace: str) -> None:
    table = rest_catalog.create_table(f"{namespace}.evolving", schema=ORDERS)
    table.append(orders(range(10)))

    with table.update_schema() as update:
        update.add_column("note", StringType(), doc="free text")
    with table.update_schema() as update:
        update.rename_column("region", "area")
    with table.update_schema() as update:
        update.update_column("id", field_type=LongType())
        update.update_column("amount", field_type=DoubleType())
    with table.update_schema() as update:
        update.delete_column("note")

    loaded = rest_catalog.load_table(f"{namespace}.evolving")
    schema = loaded.schema()
    assert [f.name for f in schema.fields] == ["id", "area", "amount"]
    assert isinstance(schema.find_field("id").field_type, LongType)
    assert isinstance(schema.find_field("amount").field_type, DoubleType)
    assert len(loaded.metadata.schemas) == 5
    rows = loaded.scan().to_arrow()
    # The old files still read, under the new names and the promoted types.
    assert rows.schema.names == ["id", "area", "amount"]
    assert rows.schema.field("id").type == pa.int64()
    assert sorted(rows["id"].to_pylist()) == list(range(10))
    assert set(rows["area"].to_pylist()) == {"eu"}


def test_partition_spec_evolution(rest_catalog: RestCatalog, namespace: str) -> None:
    table = rest_catalog.create_table(f"{namespace}.parts", schema=ORDERS)
    table.append(orders(range(5)))
    with table.update_spec() as update:
        update.add_field("region", IdentityTransform(), "region")
    table = rest_catalog.load_table(f"{namespace}.parts")
    table.append(orders(range(5, 10), region="us"))

    loaded = rest_catalog.load_table(f"{namespace}.parts")
    assert loaded.spec().spec_id == 1
    assert [f.name for f in loaded.spec().fields] == ["region"]
    assert loaded.scan().to_arrow().num_rows == 10
    assert len(loaded.metadata.partition_specs) == 2


def test_overwrite_delete_and_time_travel(rest_catalog: RestCatalog, namespace: str) -> None:
    table = rest_catalog.create_table(f"{namespace}.travel", schema=ORDERS)
    table.append(orders(range(20)))
    first = table.current_snapshot()
    assert first is not None

    table.delete(GreaterThanOrEqual("id", 15))
    assert table.scan().to_arrow().num_rows == 15
    table.overwrite(orders(range(100, 103), region="apac"))

    loaded = rest_catalog.load_table(f"{namespace}.travel")
    assert sorted(loaded.scan().to_arrow()["id"].to_pylist()) == [100, 101, 102]
    assert loaded.scan(snapshot_id=first.snapshot_id).to_arrow().num_rows == 20
    operations = [loaded.snapshot_by_id(e.snapshot_id).summary.operation.value for e in loaded.history()]
    assert operations[0] == "append"
    assert "delete" in operations[1:] or "overwrite" in operations[1:]
    assert len(operations) >= 3


def test_table_properties(rest_catalog: RestCatalog, namespace: str) -> None:
    table = rest_catalog.create_table(f"{namespace}.props", schema=ORDERS, properties={"owner": "ops"})
    with table.transaction() as tx:
        tx.set_properties(tier="gold", retention="30d")
    with table.transaction() as tx:
        tx.remove_properties("retention")
    loaded = rest_catalog.load_table(f"{namespace}.props")
    assert loaded.properties["owner"] == "ops"
    assert loaded.properties["tier"] == "gold"
    assert "retention" not in loaded.properties


def test_rename_across_namespaces(rest_catalog: RestCatalog, namespace: str) -> None:
    target = f"{namespace}_archive"
    rest_catalog.create_namespace(target)
    table = rest_catalog.create_table(f"{namespace}.moving", schema=ORDERS)
    table.append(orders(range(7)))

    renamed = rest_catalog.rename_table(f"{namespace}.moving", f"{target}.moved")
    assert renamed.scan().to_arrow().num_rows == 7
    assert not rest_catalog.table_exists(f"{namespace}.moving")
    assert rest_catalog.load_table(f"{target}.moved").scan().to_arrow().num_rows == 7
    with pytest.raises(NoSuchTableError):
        rest_catalog.load_table(f"{namespace}.moving")


def test_drop_with_purge_removes_files(rest_catalog: RestCatalog, namespace: str) -> None:
    table = rest_catalog.create_table(f"{namespace}.doomed", schema=ORDERS)
    table.append(orders(range(30)))
    table.append(orders(range(30, 40)))
    location = table.location()
    assert any(p.suffix == ".parquet" for p in files_under(location))

    rest_catalog.purge_table(f"{namespace}.doomed")
    assert not rest_catalog.table_exists(f"{namespace}.doomed")
    assert files_under(location) == []


def test_drop_without_purge_keeps_files(rest_catalog: RestCatalog, namespace: str) -> None:
    table = rest_catalog.create_table(f"{namespace}.kept", schema=ORDERS)
    table.append(orders(range(3)))
    rest_catalog.drop_table(f"{namespace}.kept")
    assert not rest_catalog.table_exists(f"{namespace}.kept")
    assert any(p.suffix == ".parquet" for p in files_under(table.location()))


def test_register_existing_metadata_file(rest_catalog: RestCatalog, namespace: str) -> None:
    table = rest_catalog.create_table(f"{namespace}.original", schema=ORDERS)
    table.append(orders(range(12)))
    table = rest_catalog.load_table(f"{namespace}.original")
    rest_catalog.drop_table(f"{namespace}.original")

    registered = rest_catalog.register_table(f"{namespace}.restored", table.metadata_location)
    assert registered.scan().to_arrow().num_rows == 12
    assert registered.metadata.table_uuid == table.metadata.table_uuid
    with pytest.raises(TableAlreadyExistsError):
        rest_catalog.register_table(f"{namespace}.restored", table.metadata_location)


def test_stage_create_then_commit(rest_catalog: RestCatalog, namespace: str) -> None:
    with rest_catalog.create_table_transaction(f"{namespace}.staged", schema=ORDERS) as tx:
        tx.set_properties(origin="ctas")
        tx.append(orders(range(4)))
    loaded = rest_catalog.load_table(f"{namespace}.staged")
    assert loaded.properties["origin"] == "ctas"
    assert loaded.scan().to_arrow().num_rows == 4
