"""A table's uuid is its own: the catalog keeps its consumers, sink coverage and location claims
under it, so no request may give another table the same uuid (`assign-uuid`, a register, a create
by updates), and nothing one table's writer does reaches another table's state."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from isbre.catalog.file_uris import local_path
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.table import Table

from tests.http_client import http
from tests.server import IsbreServer

P = "/v1/isbre"
SPANS = "isbre.sink.spans"


def commit(server: IsbreServer, namespace: str, name: str, body: dict[str, Any]) -> Any:
    return http.post(f"{server.url}{P}/namespaces/{namespace}/tables/{name}", json=body)


def victim(rest_catalog: RestCatalog, namespace: str) -> Table:
    """A table with a consumer and sink coverage of its own."""
    table = rest_catalog.create_table(f"{namespace}.victim", schema=pa.schema([pa.field("n", pa.int64())]))
    span = [{"source-id": "orders", "topic": "t", "partition": 0, "start": 0, "end": 10}]
    table.append(pa.table({"n": pa.array(range(10), pa.int64())}), {SPANS: json.dumps(span)})
    return table.refresh()


def state_of(server: IsbreServer, namespace: str, name: str) -> tuple[Any, Any]:
    base = f"{server.url}{P}/namespaces/{namespace}/tables/{name}"
    return http.get(f"{base}/consumers").json(), http.get(f"{base}/coverage").json()


def test_assign_uuid_to_another_value_is_refused(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    target = victim(rest_catalog, namespace)
    rest_catalog.create_table(f"{namespace}.imposter", schema=pa.schema([pa.field("n", pa.int64())]))
    borrowed = {"updates": [{"action": "assign-uuid", "uuid": str(target.metadata.table_uuid)}]}
    refused = commit(server, namespace, "imposter", borrowed)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["message"].startswith("Cannot reassign uuid")
    fresh = {"updates": [{"action": "assign-uuid", "uuid": str(uuid.uuid4())}]}
    assert commit(server, namespace, "imposter", fresh).status_code == 400
    own = rest_catalog.load_table(f"{namespace}.imposter").metadata.table_uuid
    same = commit(server, namespace, "imposter", {"updates": [{"action": "assign-uuid", "uuid": str(own)}]})
    assert same.status_code == 200, same.text  # its own uuid again: nothing changes


def test_registering_metadata_that_carries_another_table_s_uuid_is_refused(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    target = victim(rest_catalog, namespace)
    rest_catalog.create_namespace(f"{namespace}_b")
    http.put(
        f"{server.url}{P}/namespaces/{namespace}/tables/victim/consumers/mirror",
        json={"commit-seq": 1},
    ).raise_for_status()
    before = state_of(server, namespace, "victim")
    assert before[0]["consumers"] and before[1]
    assert target.metadata_location is not None
    crafted = json.loads(Path(str(local_path(target.metadata_location))).read_text())
    own = server.warehouse / f"{namespace}_b" / "imposter"
    crafted |= {"location": own.as_uri(), "snapshots": [], "snapshot-log": [], "refs": {}}
    crafted |= {"current-snapshot-id": -1, "metadata-log": []}
    (own / "metadata").mkdir(parents=True)
    crafted_file = own / "metadata" / "00000-imposter.metadata.json"
    crafted_file.write_text(json.dumps(crafted))
    register = {"name": "imposter", "metadata-location": crafted_file.as_uri()}
    refused = http.post(f"{server.url}{P}/namespaces/{namespace}_b/register", json=register)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["type"] == "AlreadyExistsException"
    assert "already another table's" in refused.json()["error"]["message"]
    assert not rest_catalog.table_exists(f"{namespace}_b.imposter")
    # With a uuid of its own the same file registers: what was refused was the borrowed identity.
    crafted["table-uuid"] = str(uuid.uuid4())
    crafted_file = own / "metadata" / "00001-imposter.metadata.json"
    crafted_file.write_text(json.dumps(crafted))
    register["metadata-location"] = crafted_file.as_uri()
    assert http.post(f"{server.url}{P}/namespaces/{namespace}_b/register", json=register).status_code == 200
    # Nothing the imposter's writer does reaches the victim's consumers or coverage.
    imposter = f"{server.url}{P}/namespaces/{namespace}_b/tables/imposter"
    assert http.get(f"{imposter}/consumers/mirror").status_code == 404
    assert http.delete(f"{imposter}/consumers/mirror").status_code in (204, 404)
    assert http.delete(f"{imposter}?purgeRequested=false").status_code == 204
    assert state_of(server, namespace, "victim") == before


def test_a_create_by_updates_with_another_table_s_uuid_is_refused(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    """A staged create committed as updates (PyIceberg's create transaction) names its uuid."""
    target = victim(rest_catalog, namespace)
    schema = {
        "type": "struct",
        "schema-id": 0,
        "fields": [{"id": 1, "name": "n", "type": "long", "required": False}],
    }
    body = {
        "requirements": [{"type": "assert-create"}],
        "updates": [
            {"action": "assign-uuid", "uuid": str(target.metadata.table_uuid)},
            {"action": "upgrade-format-version", "format-version": 2},
            {"action": "add-schema", "schema": schema, "last-column-id": 1},
            {"action": "set-current-schema", "schema-id": -1},
            {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
            {"action": "set-default-spec", "spec-id": -1},
            {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
            {"action": "set-default-sort-order", "sort-order-id": -1},
            {"action": "set-location", "location": (server.warehouse / namespace / "borrowed").as_uri()},
        ],
    }
    refused = commit(server, namespace, "borrowed", body)
    assert refused.status_code == 409 and "already another table's" in refused.text, refused.text
    assert not rest_catalog.table_exists(f"{namespace}.borrowed")
    body["updates"][0]["uuid"] = str(uuid.uuid4())
    assert commit(server, namespace, "borrowed", body).status_code == 200
