"""Nothing a client sends becomes a filesystem path outside the warehouse (unless configured)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.http_client import http
from tests.server import InProcessServer, IsbreServer

SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}


@pytest.fixture
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("outside")


def assert_refused(response: httpx.Response, outside: Path) -> None:
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "BadRequestException"
    assert list(outside.rglob("*")) == [], "something was written outside the warehouse"


def test_a_table_location_outside_the_warehouse_is_refused(
    server: IsbreServer, namespace: str, outside: Path
) -> None:
    base = f"{server.url}/v1/isbre/namespaces/{namespace}"
    for location in (outside.as_uri(), str(outside), f"{server.warehouse.as_uri()}/../escape"):
        assert_refused(
            http.post(f"{base}/tables", json={"name": "t", "schema": SCHEMA, "location": location}), outside
        )
    assert http.get(f"{base}/tables").json()["identifiers"] == []
    inside = f"{server.warehouse.resolve().as_uri()}/custom/place"
    assert (
        http.post(f"{base}/tables", json={"name": "t", "schema": SCHEMA, "location": inside}).status_code
        == 200
    )


def test_moving_a_table_outside_is_refused(server: IsbreServer, namespace: str, outside: Path) -> None:
    base = f"{server.url}/v1/isbre/namespaces/{namespace}"
    http.post(f"{base}/tables", json={"name": "m", "schema": SCHEMA}).raise_for_status()
    before = http.get(f"{base}/tables/m").json()
    commit = {"updates": [{"action": "set-location", "location": outside.as_uri()}]}
    assert_refused(http.post(f"{base}/tables/m", json=commit), outside)
    assert http.get(f"{base}/tables/m").json() == before


def test_a_namespace_location_outside_is_refused(server: IsbreServer, namespace: str, outside: Path) -> None:
    create = {"namespace": [namespace, "elsewhere"], "properties": {"location": outside.as_uri()}}
    assert_refused(http.post(f"{server.url}/v1/isbre/namespaces", json=create), outside)
    update = {"updates": {"location": outside.as_uri()}}
    assert_refused(
        http.post(f"{server.url}/v1/isbre/namespaces/{namespace}/properties", json=update), outside
    )


def test_views_and_registration_stay_inside(server: IsbreServer, namespace: str, outside: Path) -> None:
    base = f"{server.url}/v1/isbre/namespaces/{namespace}"
    version = {
        "version-id": 1,
        "schema-id": 0,
        "timestamp-ms": 1,
        "summary": {},
        "representations": [{"type": "sql", "sql": "SELECT 1", "dialect": "spark"}],
        "default-namespace": [namespace],
    }
    view = {"name": "v", "schema": SCHEMA, "view-version": version, "location": outside.as_uri()}
    assert_refused(http.post(f"{base}/views", json=view), outside)
    (outside / "00000-x.metadata.json").write_text("{}")
    response = http.post(
        f"{base}/register",
        json={"name": "r", "metadata-location": (outside / "00000-x.metadata.json").as_uri()},
    )
    assert response.status_code == 400 and "outside" in response.json()["error"]["message"]


def test_allowed_locations_opens_more_places(tmp_path: Path, outside: Path) -> None:
    server = InProcessServer(
        tmp_path / "warehouse", env={"ISBRE_ALLOWED_LOCATIONS": f'["{outside.as_uri()}"]'}
    ).start()
    try:
        base = f"{server.url}/v1/isbre"
        http.post(f"{base}/namespaces", json={"namespace": ["db"]}).raise_for_status()
        table = {"name": "t", "schema": SCHEMA, "location": f"{outside.as_uri()}/t"}
        assert http.post(f"{base}/namespaces/db/tables", json=table).status_code == 200
        assert any(outside.rglob("*.metadata.json"))
    finally:
        server.stop()
