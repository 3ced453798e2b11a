"""Multi-table transactions: all tables or none, one commit_seq each, one shared txn id."""

from __future__ import annotations

from isbre.catalog import Identifier, TableChange
from isbre.catalog.warehouses import open_catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import SetPropertiesUpdate
from pyiceberg.types import LongType, NestedField

from tests.http_client import http
from tests.server import IsbreServer

# The REST suite runs against one server process and against two workers on one store.
SERVER_WORKERS = (1, 2)
SERVER_STORES = ("lmdb", "postgresql")

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True))


def change(namespace: str, name: str, table_uuid: str, props: dict[str, str]) -> dict:
    return {
        "identifier": {"namespace": [namespace], "name": name},
        "requirements": [{"type": "assert-table-uuid", "uuid": table_uuid}],
        "updates": [{"action": "set-properties", "updates": props}],
    }


def test_transaction_commits_all_tables_together(
    rest_catalog: RestCatalog, server: IsbreServer, namespace: str
) -> None:
    a = rest_catalog.create_table(f"{namespace}.a", schema=SCHEMA)
    b = rest_catalog.create_table(f"{namespace}.b", schema=SCHEMA)
    body = {
        "table-changes": [
            change(namespace, "a", str(a.metadata.table_uuid), {"batch": "1"}),
            change(namespace, "b", str(b.metadata.table_uuid), {"batch": "1"}),
        ]
    }
    response = http.post(f"{server.url}/v1/isbre/transactions/commit", json=body)
    assert response.status_code == 204, response.text
    assert rest_catalog.load_table(f"{namespace}.a").properties["batch"] == "1"
    assert rest_catalog.load_table(f"{namespace}.b").properties["batch"] == "1"


def test_transaction_with_one_bad_table_changes_none(
    rest_catalog: RestCatalog, server: IsbreServer, namespace: str
) -> None:
    a = rest_catalog.create_table(f"{namespace}.a", schema=SCHEMA)
    rest_catalog.create_table(f"{namespace}.b", schema=SCHEMA)
    body = {
        "table-changes": [
            change(namespace, "a", str(a.metadata.table_uuid), {"batch": "2"}),
            change(namespace, "b", "00000000-0000-0000-0000-000000000000", {"batch": "2"}),
        ]
    }
    response = http.post(f"{server.url}/v1/isbre/transactions/commit", json=body)
    assert response.status_code == 409
    assert response.json()["error"]["type"] == "CommitFailedException"
    assert "batch" not in rest_catalog.load_table(f"{namespace}.a").properties
    assert "batch" not in rest_catalog.load_table(f"{namespace}.b").properties

    missing = {"table-changes": [change(namespace, "a", str(a.metadata.table_uuid), {"x": "1"})]}
    missing["table-changes"].append(change(namespace, "ghost", str(a.metadata.table_uuid), {"x": "1"}))
    response = http.post(f"{server.url}/v1/isbre/transactions/commit", json=missing)
    assert response.status_code == 404
    assert "x" not in rest_catalog.load_table(f"{namespace}.a").properties


def test_transaction_records_share_a_txn_id(tmp_path) -> None:
    service = open_catalog(tmp_path / "warehouse")
    try:
        service.namespaces.create(("ns",), {})
        idents = [Identifier.of(["ns"], n) for n in ("x", "y", "z")]
        for ident in idents:
            service.tables.create(ident, SCHEMA, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER)
        before = service.core.commit_log.commit_seq()
        update = (SetPropertiesUpdate(updates={"t": "1"}),)
        service.tables.commit_all([TableChange(i, (), update) for i in idents], txn="txn-1")
        records = list(service.core.commit_log.records(after=before))
        assert [r.commit_seq for r in records] == [before + 1, before + 2, before + 3]
        assert {r.txn for r in records} == {"txn-1"}
        assert [r.name for r in records] == ["x", "y", "z"]
    finally:
        service.close()
