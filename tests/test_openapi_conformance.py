"""Responses of the main operations validate against the Iceberg REST OpenAPI file."""

from __future__ import annotations

import httpx
import pyarrow as pa
from pyiceberg.catalog.rest import RestCatalog

from tests.openapi import check
from tests.server import IsbreServer

SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [
        {"id": 1, "name": "id", "type": "long", "required": True},
        {
            "id": 2,
            "name": "tags",
            "type": {"type": "list", "element-id": 3, "element": "string", "element-required": False},
            "required": False,
        },
    ],
}
VIEW_VERSION = {
    "version-id": 1,
    "schema-id": 0,
    "timestamp-ms": 1_700_000_000_000,
    "summary": {"engine-name": "spark"},
    "representations": [{"type": "sql", "sql": "SELECT 1 AS id", "dialect": "spark"}],
    "default-namespace": ["x"],
}


def test_namespace_operations_match_the_spec(server: IsbreServer, namespace: str) -> None:
    base = f"{server.url}/v1/isbre"
    with httpx.Client() as http:
        check(http.get(f"{server.url}/v1/config"))
        check(
            http.post(
                f"{base}/namespaces", json={"namespace": [namespace, "child"], "properties": {"a": "b"}}
            )
        )
        check(http.get(f"{base}/namespaces", params={"parent": namespace, "pageSize": 1}))
        check(http.get(f"{base}/namespaces/{namespace}%1Fchild"))
        check(http.head(f"{base}/namespaces/{namespace}%1Fchild"))
        check(
            http.post(
                f"{base}/namespaces/{namespace}%1Fchild/properties",
                json={"removals": ["zz"], "updates": {"c": "d"}},
            )
        )
        check(http.delete(f"{base}/namespaces/{namespace}%1Fchild"))
        assert check(http.get(f"{base}/namespaces/{namespace}%1Fchild")).status_code == 404
        assert check(http.post(f"{base}/namespaces", json={"namespace": [namespace]})).status_code == 409


def test_table_operations_match_the_spec(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    base = f"{server.url}/v1/isbre/namespaces/{namespace}"
    with httpx.Client() as http:
        check(http.post(f"{base}/tables", json={"name": "t", "schema": SCHEMA, "properties": {"p": "1"}}))
        check(http.post(f"{base}/tables", json={"name": "staged", "schema": SCHEMA, "stage-create": True}))
        rest_catalog.load_table(f"{namespace}.t").append(
            pa.table(
                {"id": pa.array([1], pa.int64()), "tags": pa.array([["a"]], pa.list_(pa.string()))},
                schema=pa.schema(
                    [pa.field("id", pa.int64(), nullable=False), pa.field("tags", pa.list_(pa.string()))]
                ),
            )
        )
        loaded = check(http.get(f"{base}/tables/t"))
        check(http.get(f"{base}/tables/t", params={"snapshots": "refs"}))
        check(http.head(f"{base}/tables/t"))
        check(http.get(f"{base}/tables", params={"pageSize": 10}))
        table_uuid = loaded.json()["metadata"]["table-uuid"]
        commit = {
            "identifier": {"namespace": [namespace], "name": "t"},
            "requirements": [{"type": "assert-table-uuid", "uuid": table_uuid}],
            "updates": [{"action": "set-properties", "updates": {"q": "2"}}],
        }
        check(http.post(f"{base}/tables/t", json=commit))
        conflict = dict(commit, requirements=[{"type": "assert-current-schema-id", "current-schema-id": 9}])
        assert check(http.post(f"{base}/tables/t", json=conflict)).status_code == 409
        check(
            http.post(
                f"{server.url}/v1/isbre/transactions/commit",
                json={
                    "table-changes": [
                        commit | {"updates": [{"action": "remove-properties", "removals": ["q"]}]}
                    ]
                },
            )
        )
        rename = {
            "source": {"namespace": [namespace], "name": "t"},
            "destination": {"namespace": [namespace], "name": "t2"},
        }
        check(http.post(f"{server.url}/v1/isbre/tables/rename", json=rename))
        location = check(http.get(f"{base}/tables/t2")).json()["metadata-location"]
        check(http.delete(f"{base}/tables/t2"))
        check(http.post(f"{base}/register", json={"name": "back", "metadata-location": location}))
        assert check(http.get(f"{base}/tables/missing")).status_code == 404
        assert check(http.post(f"{base}/tables", json={"name": "bad"})).status_code == 400
        check(http.delete(f"{base}/tables/back", params={"purgeRequested": "true"}))


def test_view_operations_match_the_spec(server: IsbreServer, namespace: str) -> None:
    base = f"{server.url}/v1/isbre/namespaces/{namespace}"
    with httpx.Client() as http:
        created = check(
            http.post(f"{base}/views", json={"name": "v", "schema": SCHEMA, "view-version": VIEW_VERSION})
        )
        check(http.get(f"{base}/views"))
        check(http.get(f"{base}/views/v"))
        check(http.head(f"{base}/views/v"))
        replace = {
            "requirements": [{"type": "assert-view-uuid", "uuid": created.json()["metadata"]["view-uuid"]}],
            "updates": [{"action": "set-properties", "updates": {"k": "v"}}],
        }
        check(http.post(f"{base}/views/v", json=replace))
        rename = {
            "source": {"namespace": [namespace], "name": "v"},
            "destination": {"namespace": [namespace], "name": "w"},
        }
        check(http.post(f"{server.url}/v1/isbre/views/rename", json=rename))
        check(http.delete(f"{base}/views/w"))
        # The spec's view operations declare a bare ErrorModel for errors, but its own examples, PyIceberg
        # and the Java client all use the {"error": ErrorModel} envelope that every other operation
        # declares; isbre answers with the envelope, so this one is checked by hand.
        missing = http.get(f"{base}/views/w")
        assert missing.status_code == 404
        assert missing.json() == {
            "error": {
                "message": f"View does not exist: {namespace}.w",
                "type": "NoSuchViewException",
                "code": 404,
            }
        }
