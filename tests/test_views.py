"""Views over the raw protocol: replace, rename, register. Their lifecycle through PyIceberg:
tests/test_catalog_behaviours.py."""

from __future__ import annotations

from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from pyiceberg.view.metadata import SQLViewRepresentation, ViewRepresentation, ViewVersion

from tests.http_client import http
from tests.server import IsbreServer

# The REST suite runs against one server process and against two workers on one store.
SERVER_WORKERS = (1, 2)
SERVER_STORES = ("lmdb", "postgresql")

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()))


def version(sql: str, namespace: str) -> ViewVersion:
    return ViewVersion(
        version_id=1,
        schema_id=0,
        timestamp_ms=1_700_000_000_000,
        summary={"engine-name": "test"},
        representations=[ViewRepresentation(SQLViewRepresentation(type="sql", sql=sql, dialect="spark"))],
        default_namespace=[namespace],
    )


def test_replace_and_rename_view(rest_catalog: RestCatalog, server: IsbreServer, namespace: str) -> None:
    created = rest_catalog.create_view(f"{namespace}.v", SCHEMA, version("SELECT 1", namespace))
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/views/v"
    new_version = version("SELECT 2", namespace).model_dump(mode="json", by_alias=True)
    new_version["schema-id"] = -1
    replace = {
        "requirements": [{"type": "assert-view-uuid", "uuid": created.metadata.view_uuid}],
        "updates": [
            {
                "action": "add-schema",
                "schema": SCHEMA.model_dump(mode="json", by_alias=True) | {"schema-id": 5},
            },
            {"action": "add-view-version", "view-version": new_version},
            {"action": "set-current-view-version", "view-version-id": -1},
            {"action": "set-properties", "updates": {"owner": "bi"}},
        ],
    }
    response = http.post(url, json=replace)
    assert response.status_code == 200, response.text
    metadata = response.json()["metadata"]
    assert metadata["current-version-id"] == 2
    assert [v["version-id"] for v in metadata["versions"]] == [1, 2]
    assert [e["version-id"] for e in metadata["version-log"]] == [1, 2]
    assert metadata["properties"]["owner"] == "bi"

    stale = dict(
        replace, requirements=[{"type": "assert-view-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}]
    )
    assert http.post(url, json=stale).status_code == 409

    rest_catalog.create_namespace(f"{namespace}_bi")
    rename = {
        "source": {"namespace": [namespace], "name": "v"},
        "destination": {"namespace": [f"{namespace}_bi"], "name": "v2"},
    }
    assert http.post(f"{server.url}/v1/isbre/views/rename", json=rename).status_code == 204
    assert rest_catalog.load_view(f"{namespace}_bi.v2").metadata.current_version_id == 2
    assert not rest_catalog.view_exists(f"{namespace}.v")


def test_register_view(rest_catalog: RestCatalog, namespace: str) -> None:
    view = rest_catalog.create_view(f"{namespace}.orig", SCHEMA, version("SELECT 3", namespace))
    loaded = http.get(f"{rest_catalog.uri}/v1/isbre/namespaces/{namespace}/views/orig").json()
    rest_catalog.drop_view(f"{namespace}.orig")
    registered = rest_catalog.register_view(f"{namespace}.copy", loaded["metadata-location"])
    assert registered.metadata.view_uuid == view.metadata.view_uuid
