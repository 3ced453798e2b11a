"""One set of catalog behaviours, run over every way a data engineer reaches an isbre catalog with
PyIceberg: the embedded catalog (no server), REST on LMDB (one process and two workers) and REST on
PostgreSQL. Each test speaks PyIceberg's `Catalog` API only, so what it asserts holds for all of
them; what only one entry point has (the REST protocol's raw answers, Idempotency-Key, multi-table
transactions over HTTP) is tested beside that entry point.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from isbre.catalog.embedded import LmdbCatalog
from isbre.catalog.file_uris import local_path
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    NoSuchViewError,
    TableAlreadyExistsError,
)
from pyiceberg.expressions import EqualTo, GreaterThanOrEqual
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from tests.postgres import new_database
from tests.server import InProcessServer, IsbreServer
from tests.test_views import SCHEMA as PEOPLE
from tests.test_views import version


@dataclass
class Reached:
    """A catalog as its users reach it: `connect(name)` is a new client (a new embedded catalog
    object on the same warehouse, or a new RestCatalog)."""

    connect: Callable[[str], Catalog]
    opened: list[Catalog] = field(default_factory=list)

    def client(self, name: str) -> Catalog:
        catalog = self.connect(name)
        self.opened.append(catalog)
        return catalog

    def close(self) -> None:
        for catalog in self.opened:
            if isinstance(catalog, LmdbCatalog):
                catalog.close()


def _embedded(warehouse: Path) -> Callable[[str], Catalog]:
    properties = {"py-catalog-impl": "isbre.catalog.embedded.LmdbCatalog", "warehouse": str(warehouse)}
    return lambda name: load_catalog(name, **properties)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("embedded"),
        pytest.param("rest-lmdb-1-worker"),
        pytest.param("rest-lmdb-2-worker", marks=pytest.mark.multi_process),
        pytest.param("rest-postgresql-2-worker", marks=[pytest.mark.postgres, pytest.mark.multi_process]),
    ],
)
def reached(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Reached]:
    warehouse = tmp_path_factory.mktemp("behaviours") / "warehouse"
    kind: str = request.param
    server: IsbreServer | None = None
    if kind == "embedded":
        catalogs = Reached(_embedded(warehouse))
    else:
        if kind == "rest-lmdb-1-worker":
            server = InProcessServer(warehouse).start()
        else:
            store = new_database(request) if "postgresql" in kind else None
            server = IsbreServer(warehouse, workers=2, store=store).start()
        url = server.url
        catalogs = Reached(lambda name: RestCatalog(name, uri=url))
    yield catalogs
    catalogs.close()
    if server is not None:
        server.stop()


@pytest.fixture
def catalog(reached: Reached) -> Catalog:
    return reached.client("behaviours")


_names = itertools.count()


@pytest.fixture
def namespace(catalog: Catalog, request: pytest.FixtureRequest) -> str:
    """A fresh namespace for one test."""
    name = f"{request.node.name.split('[')[0]}_{next(_names)}"
    catalog.create_namespace(name)
    return name


# -- namespaces

ID_ONLY = Schema(NestedField(1, "id", LongType(), required=True))


def test_nested_namespaces(catalog: Catalog, namespace: str) -> None:
    catalog.create_namespace((namespace, "sales"), {"owner": "ana"})
    catalog.create_namespace((namespace, "sales", "eu"))
    catalog.create_namespace((namespace, "ops"))

    assert catalog.list_namespaces(namespace) == [(namespace, "ops"), (namespace, "sales")]
    assert catalog.list_namespaces((namespace, "sales")) == [(namespace, "sales", "eu")]
    assert catalog.load_namespace_properties((namespace, "sales")) == {"owner": "ana"}
    assert catalog.namespace_exists((namespace, "sales", "eu"))
    assert not catalog.namespace_exists((namespace, "nope"))
    with pytest.raises(NamespaceAlreadyExistsError):
        catalog.create_namespace((namespace, "ops"))
    # The spec lists no 404 for createNamespace, so PyIceberg's RestCatalog shows a generic error;
    # its type says why, as the embedded catalog's exception does.
    with pytest.raises(Exception) as refused:
        catalog.create_namespace((namespace, "missing", "child"))
    assert "NoSuchNamespace" in f"{type(refused.value).__name__} {refused.value}"
    assert not catalog.namespace_exists((namespace, "missing"))


def test_drop_namespace_refuses_a_non_empty_one(catalog: Catalog, namespace: str) -> None:
    catalog.create_namespace((namespace, "child"))
    with pytest.raises(NamespaceNotEmptyError):
        catalog.drop_namespace(namespace)
    catalog.drop_namespace((namespace, "child"))

    catalog.create_table(f"{namespace}.t", schema=ID_ONLY)
    with pytest.raises(NamespaceNotEmptyError):
        catalog.drop_namespace(namespace)
    catalog.drop_table(f"{namespace}.t")
    catalog.drop_namespace(namespace)
    assert not catalog.namespace_exists(namespace)
    with pytest.raises(NoSuchNamespaceError):
        catalog.drop_namespace(namespace)


def test_namespace_properties_update_reports_what_was_missing(catalog: Catalog, namespace: str) -> None:
    catalog.update_namespace_properties(namespace, updates={"a": "1", "b": "2"})
    summary = catalog.update_namespace_properties(namespace, removals={"a", "zz"}, updates={"c": "3"})
    assert summary.removed == ["a"]
    assert summary.missing == ["zz"]
    assert summary.updated == ["c"]
    assert catalog.load_namespace_properties(namespace) == {"b": "2", "c": "3"}


# -- tables

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


def test_create_append_and_scan_back(catalog: Catalog, namespace: str) -> None:
    table = catalog.create_table(f"{namespace}.orders", schema=ORDERS)
    table.append(orders(range(0, 100)))
    table.append(orders(range(100, 150), region="us"))

    loaded = catalog.load_table(f"{namespace}.orders")
    assert loaded.scan().to_arrow().num_rows == 150
    us = loaded.scan(row_filter=EqualTo("region", "us")).to_arrow()
    assert sorted(us["id"].to_pylist()) == list(range(100, 150))
    assert len(loaded.history()) == 2
    assert catalog.table_exists(f"{namespace}.orders")
    assert (namespace, "orders") in catalog.list_tables(namespace)


def test_create_twice_is_already_exists(catalog: Catalog, namespace: str) -> None:
    catalog.create_table(f"{namespace}.t", schema=ORDERS)
    with pytest.raises(TableAlreadyExistsError):
        catalog.create_table(f"{namespace}.t", schema=ORDERS)


def test_schema_evolution_add_rename_drop_promote(catalog: Catalog, namespace: str) -> None:
    table = catalog.create_table(f"{namespace}.evolving", schema=ORDERS)
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

    loaded = catalog.load_table(f"{namespace}.evolving")
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


def test_partition_spec_evolution(catalog: Catalog, namespace: str) -> None:
    table = catalog.create_table(f"{namespace}.parts", schema=ORDERS)
    table.append(orders(range(5)))
    with table.update_spec() as update:
        update.add_field("region", IdentityTransform(), "region")
    table = catalog.load_table(f"{namespace}.parts")
    table.append(orders(range(5, 10), region="us"))

    loaded = catalog.load_table(f"{namespace}.parts")
    assert loaded.spec().spec_id == 1
    assert [f.name for f in loaded.spec().fields] == ["region"]
    assert loaded.scan().to_arrow().num_rows == 10
    assert len(loaded.metadata.partition_specs) == 2


def test_overwrite_delete_and_time_travel(catalog: Catalog, namespace: str) -> None:
    table = catalog.create_table(f"{namespace}.travel", schema=ORDERS)
    table.append(orders(range(20)))
    first = table.current_snapshot()
    assert first is not None

    table.delete(GreaterThanOrEqual("id", 15))
    assert table.scan().to_arrow().num_rows == 15
    table.overwrite(orders(range(100, 103), region="apac"))

    loaded = catalog.load_table(f"{namespace}.travel")
    assert sorted(loaded.scan().to_arrow()["id"].to_pylist()) == [100, 101, 102]
    assert loaded.scan(snapshot_id=first.snapshot_id).to_arrow().num_rows == 20
    operations = [loaded.snapshot_by_id(e.snapshot_id).summary.operation.value for e in loaded.history()]
    assert operations[0] == "append"
    assert "delete" in operations[1:] or "overwrite" in operations[1:]
    assert len(operations) >= 3


def test_table_properties(catalog: Catalog, namespace: str) -> None:
    table = catalog.create_table(f"{namespace}.props", schema=ORDERS, properties={"owner": "ops"})
    with table.transaction() as tx:
        tx.set_properties(tier="gold", retention="30d")
    with table.transaction() as tx:
        tx.remove_properties("retention")
    loaded = catalog.load_table(f"{namespace}.props")
    assert loaded.properties["owner"] == "ops"
    assert loaded.properties["tier"] == "gold"
    assert "retention" not in loaded.properties


def test_stage_create_then_commit(catalog: Catalog, namespace: str) -> None:
    with catalog.create_table_transaction(f"{namespace}.staged", schema=ORDERS) as tx:
        tx.set_properties(origin="ctas")
        tx.append(orders(range(4)))
    loaded = catalog.load_table(f"{namespace}.staged")
    assert loaded.properties["origin"] == "ctas"
    assert loaded.scan().to_arrow().num_rows == 4


def test_register_existing_metadata_file(catalog: Catalog, namespace: str) -> None:
    table = catalog.create_table(f"{namespace}.original", schema=ORDERS)
    table.append(orders(range(12)))
    table = catalog.load_table(f"{namespace}.original")
    catalog.drop_table(f"{namespace}.original")

    registered = catalog.register_table(f"{namespace}.restored", table.metadata_location)
    assert registered.scan().to_arrow().num_rows == 12
    assert registered.metadata.table_uuid == table.metadata.table_uuid
    with pytest.raises(TableAlreadyExistsError):
        catalog.register_table(f"{namespace}.restored", table.metadata_location)


# -- drops and renames


def test_rename_across_namespaces(catalog: Catalog, namespace: str) -> None:
    target = f"{namespace}_archive"
    catalog.create_namespace(target)
    table = catalog.create_table(f"{namespace}.moving", schema=ORDERS)
    table.append(orders(range(7)))

    renamed = catalog.rename_table(f"{namespace}.moving", f"{target}.moved")
    assert renamed.scan().to_arrow().num_rows == 7
    assert not catalog.table_exists(f"{namespace}.moving")
    assert catalog.load_table(f"{target}.moved").scan().to_arrow().num_rows == 7
    with pytest.raises(NoSuchTableError):
        catalog.load_table(f"{namespace}.moving")


def test_drop_with_purge_removes_files(catalog: Catalog, namespace: str) -> None:
    table = catalog.create_table(f"{namespace}.doomed", schema=ORDERS)
    table.append(orders(range(30)))
    table.append(orders(range(30, 40)))
    location = table.location()
    assert any(p.suffix == ".parquet" for p in files_under(location))

    catalog.purge_table(f"{namespace}.doomed")
    assert not catalog.table_exists(f"{namespace}.doomed")
    assert files_under(location) == []


def test_drop_without_purge_keeps_files(catalog: Catalog, namespace: str) -> None:
    table = catalog.create_table(f"{namespace}.kept", schema=ORDERS)
    table.append(orders(range(3)))
    catalog.drop_table(f"{namespace}.kept")
    assert not catalog.table_exists(f"{namespace}.kept")
    assert any(p.suffix == ".parquet" for p in files_under(table.location()))
    with pytest.raises(NoSuchTableError):
        catalog.drop_table(f"{namespace}.kept")


# -- views


def test_view_lifecycle(catalog: Catalog, namespace: str) -> None:
    first = version("SELECT * FROM users", namespace)
    view = catalog.create_view(f"{namespace}.active", PEOPLE, first, properties={"comment": "hi"})
    assert view.metadata.current_version_id == 1
    assert catalog.view_exists(f"{namespace}.active")
    assert catalog.list_views(namespace) == [(namespace, "active")]
    loaded = catalog.load_view(f"{namespace}.active")
    assert loaded.metadata.properties["comment"] == "hi"
    assert loaded.metadata.versions[0].representations[0].root.sql == "SELECT * FROM users"

    catalog.drop_view(f"{namespace}.active")
    assert not catalog.view_exists(f"{namespace}.active")
    with pytest.raises(NoSuchViewError):
        catalog.load_view(f"{namespace}.active")


def test_view_and_table_names_collide(catalog: Catalog, namespace: str) -> None:
    catalog.create_table(f"{namespace}.thing", schema=PEOPLE)
    with pytest.raises(Exception, match="already exists"):
        catalog.create_view(f"{namespace}.thing", PEOPLE, version("SELECT 1", namespace))
    assert catalog.list_views(namespace) == []
    assert catalog.list_tables(namespace) == [(namespace, "thing")]


# -- commits and concurrency

WRITES = pa.schema([pa.field("writer", pa.int64()), pa.field("seq", pa.int64())])


def writes(writer: int, seq: int) -> pa.Table:
    return pa.table({"writer": pa.array([writer] * 10, pa.int64()), "seq": pa.array([seq] * 10, pa.int64())})


def test_a_stale_appender_is_refused_when_neither_side_rebases(reached: Reached, namespace: str) -> None:
    alice, bob = reached.client("alice"), reached.client("bob")
    # No client-side retries and no rebase by the catalog, so the conflict reaches the caller.
    alice.create_table(
        f"{namespace}.shared",
        schema=WRITES,
        properties={"commit.retry.num-retries": "0", "isbre.commit.rebase-appends": "false"},
    )
    alice_view = alice.load_table(f"{namespace}.shared")
    bob_view = bob.load_table(f"{namespace}.shared")

    alice_view.append(writes(1, 0))
    with pytest.raises(CommitFailedException):
        bob_view.append(writes(2, 0))
    bob_view.refresh()
    bob_view.append(writes(2, 0))

    final = alice.load_table(f"{namespace}.shared")
    assert final.scan().to_arrow().num_rows == 20
    assert len(final.snapshots()) == 2


def test_a_stale_append_lands_without_the_writer_retrying(reached: Reached, namespace: str) -> None:
    alice, bob = reached.client("alice"), reached.client("bob")
    alice.create_table(f"{namespace}.auto", schema=WRITES, properties={"commit.retry.num-retries": "0"})
    alice_view = alice.load_table(f"{namespace}.auto")
    bob_view = bob.load_table(f"{namespace}.auto")
    alice_view.append(writes(1, 0))
    bob_view.append(writes(2, 0))  # stale: the catalog makes it again on alice's snapshot
    final = alice.load_table(f"{namespace}.auto")
    assert sorted(set(final.scan().to_arrow()["writer"].to_pylist())) == [1, 2]
    assert len(final.snapshots()) == 2


def test_concurrent_appenders_lose_nothing(reached: Reached, namespace: str) -> None:
    name = f"{namespace}.busy"
    reached.client("setup").create_table(name, schema=WRITES)
    writers, commits = 4, 5
    conflicts = [0] * writers

    def append_with_retries(catalog: Catalog, writer: int) -> None:
        table = catalog.load_table(name)
        for seq in range(commits):
            while True:
                try:
                    table.append(writes(writer, seq))
                    break
                except CommitFailedException:
                    conflicts[writer] += 1
                    table.refresh()

    clients = [reached.client(f"w{w}") for w in range(writers)]
    threads = [threading.Thread(target=append_with_retries, args=(clients[w], w)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    table = reached.client("check").load_table(name)
    data = table.scan().to_arrow()
    assert data.num_rows == writers * commits * 10
    landed = {(w, s) for w, s in zip(data["writer"].to_pylist(), data["seq"].to_pylist(), strict=True)}
    assert landed == {(w, s) for w in range(writers) for s in range(commits)}
    assert len(table.snapshots()) == writers * commits


def test_concurrent_property_commits_are_applied_again_by_the_catalog(
    reached: Reached, namespace: str
) -> None:
    """Commits without snapshot requirements never conflict: the catalog applies them to the new state."""
    name = f"{namespace}.props"
    reached.client("setup").create_table(name, schema=WRITES)

    def set_many(catalog: Catalog) -> None:
        table = catalog.load_table(name)
        for i in range(10):
            with table.transaction() as tx:
                tx.set_properties(**{f"{catalog.name}-{i}": "x"})

    clients = [reached.client(f"p{w}") for w in range(8)]
    threads = [threading.Thread(target=set_many, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    properties = reached.client("check").load_table(name).properties
    assert {f"p{w}-{i}" for w in range(8) for i in range(10)} <= set(properties)
