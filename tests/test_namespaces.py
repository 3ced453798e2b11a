"""Namespaces through the raw protocol: pagination, 422 and 400 answers. What PyIceberg's API
shows of them: tests/test_catalog_behaviours.py."""

from __future__ import annotations

import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from tests.http_client import http
from tests.server import IsbreServer

# The REST suite runs against one server process and against two workers on one store.
SERVER_WORKERS = (1, 2)
SERVER_STORES = ("lmdb", "postgresql")

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True))


def test_overlapping_update_is_422(server: IsbreServer, namespace: str) -> None:
    response = http.post(
        f"{server.url}/v1/isbre/namespaces/{namespace}/properties",
        json={"removals": ["x"], "updates": {"x": "1"}},
    )
    assert response.status_code == 422
    assert response.json()["error"]["type"] == "UnprocessableEntityException"


def test_pagination_walks_every_namespace_once(server: IsbreServer, namespace: str) -> None:
    for i in range(23):
        http.post(
            f"{server.url}/v1/isbre/namespaces", json={"namespace": [namespace, f"n{i:02d}"]}
        ).raise_for_status()
    seen: list[list[str]] = []
    token = ""
    pages = 0
    while token is not None:
        params = {"parent": namespace, "pageSize": 5}
        if token:
            params["pageToken"] = token
        body = http.get(f"{server.url}/v1/isbre/namespaces", params=params).json()
        seen += body["namespaces"]
        token = body.get("next-page-token")
        pages += 1
    assert seen == [[namespace, f"n{i:02d}"] for i in range(23)]
    assert pages == 5


def test_pagination_of_tables(rest_catalog: RestCatalog, server: IsbreServer, namespace: str) -> None:
    for i in range(7):
        rest_catalog.create_table(f"{namespace}.t{i}", schema=SCHEMA)
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables"
    first = http.get(url, params={"pageSize": 4}).json()
    assert [i["name"] for i in first["identifiers"]] == ["t0", "t1", "t2", "t3"]
    second = http.get(url, params={"pageSize": 4, "pageToken": first["next-page-token"]}).json()
    assert [i["name"] for i in second["identifiers"]] == ["t4", "t5", "t6"]
    assert "next-page-token" not in second
    assert len(rest_catalog.list_tables(namespace)) == 7


@pytest.mark.parametrize(
    "body",
    [
        {"namespace": []},
        {"namespace": [".."]},
        {"namespace": ["ok", ""]},
        {"namespace": ["bad\nname"]},
        {"namespace": "flat"},
        {"properties": {}},
    ],
)
def test_bad_namespace_is_400_and_leaves_nothing(server: IsbreServer, body: dict) -> None:
    before = http.get(f"{server.url}/v1/isbre/namespaces").json()["namespaces"]
    response = http.post(f"{server.url}/v1/isbre/namespaces", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "BadRequestException"
    assert http.get(f"{server.url}/v1/isbre/namespaces").json()["namespaces"] == before
