"""Where clients match on the Java reference server's words and types (Iceberg's REST Compatibility Kit,
the Java client's exception mapping), isbre answers with them."""

from __future__ import annotations

import httpx
import pyarrow as pa
from pyiceberg.catalog.rest import RestCatalog

from tests.http_client import http
from tests.server import ID_SCHEMA, IsbreServer

P = "/v1/isbre"
ID_SCHEMA_ARROW = pa.schema([pa.field("id", pa.int64())])


def view_body(name: str, namespace: str, *representations: tuple[str, str]) -> dict:
    return {
        "name": name,
        "schema": ID_SCHEMA,
        "view-version": {
            "version-id": 1,
            "schema-id": 0,
            "timestamp-ms": 1_700_000_000_000,
            "summary": {"engine-name": "test"},
            "representations": [
                {"type": "sql", "sql": sql, "dialect": dialect} for sql, dialect in representations
            ],
            "default-namespace": [namespace],
        },
    }


def error_of(answer: httpx.Response, code: int) -> dict:
    assert answer.status_code == code, answer.text
    return answer.json()["error"]


def test_tables_and_views_in_each_others_way(server: IsbreServer, namespace: str) -> None:
    base = f"{server.url}{P}/namespaces/{namespace}"
    http.post(f"{base}/tables", json={"name": "t", "schema": ID_SCHEMA}).raise_for_status()
    http.post(f"{base}/views", json=view_body("v", namespace, ("select 1", "spark"))).raise_for_status()
    error = error_of(http.post(f"{base}/tables", json={"name": "v", "schema": ID_SCHEMA}), 409)
    assert error["type"] == "AlreadyExistsException"
    assert error["message"] == f"View with same name already exists: {namespace}.v"
    error = error_of(http.post(f"{base}/views", json=view_body("t", namespace, ("select 1", "spark"))), 409)
    assert error["message"] == f"Table with same name already exists: {namespace}.t"
    error = error_of(http.post(f"{base}/tables", json={"name": "t", "schema": ID_SCHEMA}), 409)
    assert error["message"] == f"Table already exists: {namespace}.t"
    error = error_of(http.post(f"{base}/views", json=view_body("v", namespace, ("select 1", "spark"))), 409)
    assert error["message"] == f"View already exists: {namespace}.v"


def test_refused_renames(server: IsbreServer, namespace: str) -> None:
    base = f"{server.url}{P}/namespaces/{namespace}"
    for name in ("t", "t2"):
        http.post(f"{base}/tables", json={"name": name, "schema": ID_SCHEMA}).raise_for_status()
    for name in ("v", "v2"):
        http.post(f"{base}/views", json=view_body(name, namespace, ("select 1", "spark"))).raise_for_status()

    def rename(kind: str, source: str, target: str) -> dict:
        body = {
            "source": {"namespace": [namespace], "name": source},
            "destination": {"namespace": [namespace], "name": target},
        }
        return error_of(http.post(f"{server.url}{P}/{kind}/rename", json=body), 409)

    ns = namespace
    assert rename("tables", "t", "t2")["message"] == f"Cannot rename {ns}.t to {ns}.t2. Table already exists"
    assert rename("tables", "t", "v")["message"] == f"Cannot rename {ns}.t to {ns}.v. View already exists"
    assert rename("views", "v", "v2")["message"] == f"Cannot rename {ns}.v to {ns}.v2. View already exists"
    assert rename("views", "v", "t")["message"] == f"Cannot rename {ns}.v to {ns}.t. Table already exists"


def test_two_representations_of_one_dialect(server: IsbreServer, namespace: str) -> None:
    body = view_body("v", namespace, ("select 1", "trino"), ("select 2", "trino"))
    error = error_of(http.post(f"{server.url}{P}/namespaces/{namespace}/views", json=body), 400)
    assert error["type"] == "IllegalArgumentException"
    assert error["message"] == "Invalid view version: Cannot add multiple queries for dialect trino"


def test_a_warehouse_named_with_a_trailing_slash(server: IsbreServer) -> None:
    for warehouse in (str(server.warehouse) + "/", server.warehouse.resolve().as_uri() + "/"):
        answer = http.get(f"{server.url}/v1/config", params={"warehouse": warehouse})
        assert answer.status_code == 200, answer.text
        assert answer.json()["overrides"]["prefix"] == "isbre"


def test_new_tables_get_the_properties_the_reference_persists(
    rest_catalog: RestCatalog, namespace: str
) -> None:
    table = rest_catalog.create_table(f"{namespace}.t", schema=ID_SCHEMA_ARROW)
    assert table.properties["write.parquet.compression-codec"] == "zstd"
    chosen = rest_catalog.create_table(
        f"{namespace}.u", schema=ID_SCHEMA_ARROW, properties={"write.parquet.compression-codec": "snappy"}
    )
    assert chosen.properties["write.parquet.compression-codec"] == "snappy"


def test_loads_through_views_take_referenced_by(server: IsbreServer, namespace: str) -> None:
    base = f"{server.url}{P}/namespaces/{namespace}"
    http.post(f"{base}/tables", json={"name": "t", "schema": ID_SCHEMA}).raise_for_status()
    http.post(f"{base}/views", json=view_body("v", namespace, ("select 1", "spark"))).raise_for_status()
    chain = f"{namespace}\x1fouter,{namespace}\x1finner%2Cwith%2Ccommas"
    for url in (f"{base}/tables/t", f"{base}/views/v", f"{base}/tables/t/credentials"):
        assert http.get(url, params={"referenced-by": chain}).status_code == 200
        refused = http.get(url, params={"referenced-by": "no-separator"})
        assert refused.status_code == 400 and "referenced-by" in refused.text
