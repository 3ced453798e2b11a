"""Schema, partition spec and sort order ids as the Java reference builder assigns them: metadata that
every engine can load (no two entries with one id), whatever order concurrent writers commit in.

The first two tests replay what Iceberg's REST Compatibility Kit did: two replace transactions
adding the same sort order (and then different ones), committed one after the other on one base.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from isbre.catalog.file_uris import local_path
from pyiceberg.catalog.rest import RestCatalog

from tests.http_client import http
from tests.server import ID_SCHEMA, IsbreServer

P = "/v1/isbre"
ORDER = {
    "order-id": 1,
    "fields": [{"transform": "identity", "source-id": 1, "direction": "asc", "null-order": "nulls-first"}],
}
OTHER_ORDER = {
    "order-id": 1,
    "fields": [{"transform": "bucket[4]", "source-id": 1, "direction": "desc", "null-order": "nulls-last"}],
}


def create(server: IsbreServer, namespace: str, name: str) -> dict:
    answer = http.post(
        f"{server.url}{P}/namespaces/{namespace}/tables", json={"name": name, "schema": ID_SCHEMA}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["metadata"]


def commit(
    server: IsbreServer, namespace: str, name: str, updates: list, requirements: list | None = None
) -> httpx.Response:
    body = {"requirements": requirements or [], "updates": updates}
    return http.post(f"{server.url}{P}/namespaces/{namespace}/tables/{name}", json=body)


def loadable(server: IsbreServer, rest_catalog: RestCatalog, namespace: str, name: str) -> dict:
    """The table's metadata as served and as stored, with every id unique, as Java engines need."""
    served = http.get(f"{server.url}{P}/namespaces/{namespace}/tables/{name}").json()
    metadata = served["metadata"]
    stored = json.loads(Path(local_path(served["metadata-location"]) or "").read_text())
    for each in (metadata, stored):
        for key, id_key in (
            ("schemas", "schema-id"),
            ("partition-specs", "spec-id"),
            ("sort-orders", "order-id"),
        ):
            ids = [entry[id_key] for entry in each[key]]
            assert len(ids) == len(set(ids)), f"{key} ids {ids}"
        for spec in each["partition-specs"]:
            field_ids = [field["field-id"] for field in spec["fields"]]
            assert len(field_ids) == len(set(field_ids))
    rest_catalog.load_table(f"{namespace}.{name}")  # PyIceberg loads it too
    return metadata


def replace_with_order(uuid: str, order: dict) -> tuple[list, list]:
    """What the Java client's replace transaction sends for a new sort order (on one base)."""
    updates = [
        {"action": "add-sort-order", "sort-order": order},
        {"action": "set-default-sort-order", "sort-order-id": -1},
    ]
    return updates, [{"type": "assert-table-uuid", "uuid": uuid}]


def test_two_concurrent_replaces_adding_the_same_sort_order(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    uuid = create(server, namespace, "t")["table-uuid"]
    for _ in range(2):  # both built on the same base; the second commits after the first
        answer = commit(server, namespace, "t", *replace_with_order(uuid, ORDER))
        assert answer.status_code == 200, answer.text
    metadata = loadable(server, rest_catalog, namespace, "t")
    assert [o["order-id"] for o in metadata["sort-orders"]] == [0, 1]
    assert metadata["default-sort-order-id"] == 1


def test_two_concurrent_replaces_adding_different_sort_orders(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    uuid = create(server, namespace, "t")["table-uuid"]
    for order in (ORDER, OTHER_ORDER):
        answer = commit(server, namespace, "t", *replace_with_order(uuid, order))
        assert answer.status_code == 200, answer.text
    metadata = loadable(server, rest_catalog, namespace, "t")
    assert [o["order-id"] for o in metadata["sort-orders"]] == [0, 1, 2]
    assert metadata["default-sort-order-id"] == 2
    assert metadata["sort-orders"][2]["fields"][0]["transform"] == "bucket[4]"


def schema(schema_id: int, *names: str) -> dict:
    fields = [{"id": 1, "name": "id", "type": "long", "required": True}]
    fields += [
        {"id": 2 + i, "name": name, "type": "string", "required": False} for i, name in enumerate(names)
    ]
    return {"type": "struct", "schema-id": schema_id, "fields": fields}


def test_schema_ids_are_reused_or_the_next_free_one(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    create(server, namespace, "t")
    # A taken id with other fields gets the next free one; -1 is the schema just added.
    answer = commit(
        server,
        namespace,
        "t",
        [
            {"action": "add-schema", "schema": schema(0, "a")},
            {"action": "set-current-schema", "schema-id": -1},
        ],
    )
    assert answer.status_code == 200, answer.text
    metadata = loadable(server, rest_catalog, namespace, "t")
    assert [s["schema-id"] for s in metadata["schemas"]] == [0, 1] and metadata["current-schema-id"] == 1
    # A schema identical to one the table has reuses its id, and -1 names it.
    answer = commit(
        server,
        namespace,
        "t",
        [{"action": "add-schema", "schema": schema(7)}, {"action": "set-current-schema", "schema-id": -1}],
    )
    assert answer.status_code == 200, answer.text
    metadata = loadable(server, rest_catalog, namespace, "t")
    assert [s["schema-id"] for s in metadata["schemas"]] == [0, 1] and metadata["current-schema-id"] == 0
    # -1 with nothing added is refused.
    refused = commit(server, namespace, "t", [{"action": "set-current-schema", "schema-id": -1}])
    assert refused.status_code == 400, refused.text


def test_partition_spec_ids_and_field_ids(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    create(server, namespace, "t")
    bucket = {
        "spec-id": 0,
        "fields": [{"source-id": 1, "field-id": 1000, "transform": "bucket[8]", "name": "id_bucket"}],
    }
    for _ in range(2):  # the second add is the same spec: its id is reused
        answer = commit(
            server,
            namespace,
            "t",
            [{"action": "add-spec", "spec": bucket}, {"action": "set-default-spec", "spec-id": -1}],
        )
        assert answer.status_code == 200, answer.text
    metadata = loadable(server, rest_catalog, namespace, "t")
    assert [s["spec-id"] for s in metadata["partition-specs"]] == [0, 1] and metadata["default-spec-id"] == 1
    twice = {"spec-id": 5, "fields": [
        {"source-id": 1, "field-id": 1001, "transform": "bucket[2]", "name": "a"},
        {"source-id": 1, "field-id": 1001, "transform": "bucket[3]", "name": "b"},
    ]}  # fmt: skip
    refused = commit(server, namespace, "t", [{"action": "add-spec", "spec": twice}])
    assert refused.status_code == 400, refused.text
    assert "field id 1001 used twice" in refused.json()["error"]["message"]


def test_metadata_with_duplicate_ids_is_refused_on_register(server: IsbreServer, namespace: str) -> None:
    metadata_location = http.post(
        f"{server.url}{P}/namespaces/{namespace}/tables", json={"name": "source", "schema": ID_SCHEMA}
    ).json()["metadata-location"]
    path = Path(local_path(metadata_location) or "")
    crafted = json.loads(path.read_text())
    crafted["sort-orders"] = [crafted["sort-orders"][0], ORDER, ORDER | {"fields": OTHER_ORDER["fields"]}]
    crafted["table-uuid"] = "6c1ad3a8-2cf9-4a4e-9e0a-2d2f6a1b5c3d"
    copy = path.parent.parent.parent / "copy" / "metadata" / "00000-copy.metadata.json"
    copy.parent.mkdir(parents=True)
    crafted["location"] = copy.parent.parent.as_uri()
    copy.write_text(json.dumps(crafted))
    refused = http.post(
        f"{server.url}{P}/namespaces/{namespace}/register",
        json={"name": "copy", "metadata-location": copy.as_uri()},
    )
    assert refused.status_code == 400, refused.text
    assert "sort order id 1 used twice" in refused.json()["error"]["message"]


@pytest.mark.parametrize(
    ("requirement", "phrase"),
    [
        (
            {"type": "assert-current-schema-id", "current-schema-id": 5},
            "Requirement failed: current schema changed: expected id 5 != 0",
        ),
        (
            {"type": "assert-last-assigned-field-id", "last-assigned-field-id": 9},
            "Requirement failed: last assigned field id changed: expected id 9 != 1",
        ),
        (
            {"type": "assert-last-assigned-partition-id", "last-assigned-partition-id": 3},
            "Requirement failed: last assigned partition id changed: expected id 3 != 999",
        ),
        (
            {"type": "assert-default-spec-id", "default-spec-id": 4},
            "Requirement failed: default partition spec changed: expected id 4 != 0",
        ),
        (
            {"type": "assert-default-sort-order-id", "default-sort-order-id": 4},
            "Requirement failed: default sort order changed: expected id 4 != 0",
        ),
        (
            {"type": "assert-table-uuid", "uuid": "00000000-0000-0000-0000-000000000000"},
            "Requirement failed: UUID does not match: expected ",
        ),
        (
            {"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": 42},
            "Requirement failed: branch or tag main is missing, expected 42",
        ),
        ({"type": "assert-create"}, "Requirement failed: table already exists"),
    ],
)
def test_requirement_failures_in_the_reference_wording(
    server: IsbreServer, namespace: str, requirement: dict, phrase: str
) -> None:
    create(server, namespace, "t")
    refused = commit(
        server, namespace, "t", [{"action": "set-properties", "updates": {"a": "b"}}], [requirement]
    )
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["type"] == "CommitFailedException"
    assert refused.json()["error"]["message"].startswith(phrase), refused.json()["error"]["message"]
