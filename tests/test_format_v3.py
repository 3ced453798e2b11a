"""Format version 3: created, staged, registered, loaded, committed to and upgraded to, with the
reference's row-lineage rules, column defaults, nanosecond timestamps and encryption keys; what isbre
cannot honour is a 400 that names it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from isbre.catalog.file_uris import local_path
from pyiceberg.catalog.rest import RestCatalog

from tests.http_client import http
from tests.server import ID_SCHEMA, IsbreServer

P = "/v1/isbre"
V3_SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [
        {"id": 1, "name": "id", "type": "long", "required": False, "initial-default": 5, "write-default": 7},
        {"id": 2, "name": "at", "type": "timestamptz_ns", "required": False},
        {"id": 3, "name": "nothing", "type": "unknown", "required": False},
        {
            "id": 4,
            "name": "nested",
            "type": {
                "type": "struct",
                "fields": [{"id": 5, "name": "x", "type": "int", "required": False, "initial-default": 1}],
            },
            "required": False,
        },
    ],
}


def tables(server: IsbreServer, namespace: str) -> str:
    return f"{server.url}{P}/namespaces/{namespace}/tables"


def create_v3(server: IsbreServer, namespace: str, name: str, **extra: object) -> httpx.Response:
    body = {"name": name, "schema": V3_SCHEMA, "properties": {"format-version": "3"}, **extra}
    return http.post(tables(server, namespace), json=body)


def snapshot(
    snapshot_id: int,
    sequence: int,
    first_row_id: int | None,
    added_rows: int | None,
    parent: int | None = None,
) -> dict:
    found: dict = {
        "snapshot-id": snapshot_id,
        "sequence-number": sequence,
        "timestamp-ms": 1_700_000_000_000 + sequence,
        "manifest-list": f"file:///nowhere/snap-{snapshot_id}.avro",
        "summary": {"operation": "append", "added-records": str(added_rows or 0)},
        "schema-id": 0,
    }
    if parent is not None:
        found["parent-snapshot-id"] = parent
    if first_row_id is not None:
        found["first-row-id"] = first_row_id
    if added_rows is not None:
        found["added-rows"] = added_rows
    return found


def add(server: IsbreServer, namespace: str, name: str, location: str, *snapshots: dict) -> httpx.Response:
    updates = []
    for each in snapshots:
        each["manifest-list"] = f"{location}/metadata/snap-{each['snapshot-id']}.avro"
        updates += [
            {"action": "add-snapshot", "snapshot": each},
            {
                "action": "set-snapshot-ref",
                "ref-name": "main",
                "type": "branch",
                "snapshot-id": each["snapshot-id"],
            },
        ]
    return http.post(f"{tables(server, namespace)}/{name}", json={"updates": updates})


def test_a_v3_table_is_created_committed_to_and_read_back(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    created = create_v3(server, namespace, "t")
    assert created.status_code == 200, created.text
    metadata = created.json()["metadata"]
    assert metadata["format-version"] == 3 and metadata["next-row-id"] == 0
    fields = {field["name"]: field for field in metadata["schemas"][0]["fields"]}
    assert fields["id"]["initial-default"] == 5 and fields["id"]["write-default"] == 7
    assert fields["nested"]["type"]["fields"][0]["initial-default"] == 1
    assert fields["at"]["type"] == "timestamptz_ns" and fields["nothing"]["type"] == "unknown"
    assert metadata["properties"]["write.parquet.compression-codec"] == "zstd"
    location = metadata["location"]

    first = add(server, namespace, "t", location, snapshot(1, 1, 0, 10))
    assert first.status_code == 200, first.text
    assert first.json()["metadata"]["next-row-id"] == 10
    second = add(server, namespace, "t", location, snapshot(2, 2, 10, 5, parent=1))
    assert second.json()["metadata"]["next-row-id"] == 15
    for refused in (
        snapshot(3, 3, 12, 1, parent=2),
        snapshot(4, 3, None, 1, parent=2),
        snapshot(5, 3, 15, None, parent=2),
    ):
        answer = add(server, namespace, "t", location, refused)
        assert answer.status_code == 400, answer.text
        assert "row" in answer.json()["error"]["message"]

    table = rest_catalog.load_table(f"{namespace}.t")  # PyIceberg reads what isbre wrote
    assert table.metadata.format_version == 3 and table.metadata.next_row_id == 15
    assert [s.first_row_id for s in table.metadata.snapshots] == [0, 10]
    stored = json.loads(Path(local_path(table.metadata_location) or "").read_text())
    assert stored["next-row-id"] == 15 and stored["snapshots"][1]["added-rows"] == 5


def test_a_v2_table_is_upgraded_to_v3_and_keeps_its_data(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    table = rest_catalog.create_table(f"{namespace}.t", schema=pa.schema([pa.field("id", pa.int64())]))
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    # As Spark sends it (PyIceberg 0.12's client will not upgrade past 2 itself).
    upgrade = {"updates": [{"action": "upgrade-format-version", "format-version": 3}]}
    answer = http.post(f"{tables(server, namespace)}/t", json=upgrade)
    assert answer.status_code == 200, answer.text
    table = rest_catalog.load_table(f"{namespace}.t")
    assert table.metadata.format_version == 3 and table.metadata.next_row_id == 0
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]


def test_a_staged_v3_create_then_its_commit(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    staged = create_v3(server, namespace, "staged", **{"stage-create": True})
    assert staged.status_code == 200, staged.text
    assert staged.json()["metadata"]["format-version"] == 3
    with rest_catalog.create_table_transaction(
        f"{namespace}.ctas",
        schema=pa.schema([pa.field("id", pa.int64())]),
        properties={"format-version": "3"},
    ) as transaction:
        transaction.set_properties(origin="ctas")
    loaded = rest_catalog.load_table(f"{namespace}.ctas")
    assert loaded.metadata.format_version == 3 and loaded.properties["origin"] == "ctas"


def test_a_v3_table_is_registered(server: IsbreServer, rest_catalog: RestCatalog, namespace: str) -> None:
    metadata_location = create_v3(server, namespace, "original").json()["metadata-location"]
    rest_catalog.drop_table(f"{namespace}.original")
    registered = http.post(
        f"{server.url}{P}/namespaces/{namespace}/register",
        json={"name": "again", "metadata-location": metadata_location},
    )
    assert registered.status_code == 200, registered.text
    assert rest_catalog.load_table(f"{namespace}.again").metadata.format_version == 3


def test_encryption_keys_are_kept(server: IsbreServer, namespace: str) -> None:
    create_v3(server, namespace, "t").raise_for_status()
    key = {"key-id": "k1", "encrypted-key-metadata": "c2VjcmV0", "properties": {"kms": "local"}}
    url = f"{tables(server, namespace)}/t"
    added = http.post(url, json={"updates": [{"action": "add-encryption-key", "encryption-key": key}]})
    assert added.status_code == 200, added.text
    assert http.get(url).json()["metadata"]["encryption-keys"] == [key]
    changed = http.post(url, json={"updates": [{"action": "set-properties", "updates": {"a": "b"}}]})
    assert changed.json()["metadata"]["encryption-keys"] == [key]  # a later commit keeps them
    removed = http.post(url, json={"updates": [{"action": "remove-encryption-key", "key-id": "k1"}]})
    assert "encryption-keys" not in removed.json()["metadata"]
    http.post(tables(server, namespace), json={"name": "v2", "schema": ID_SCHEMA}).raise_for_status()
    refused = http.post(
        f"{tables(server, namespace)}/v2",
        json={"updates": [{"action": "add-encryption-key", "encryption-key": key}]},
    )
    assert refused.status_code == 400 and "format version 3" in refused.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"name": "x", "schema": V3_SCHEMA, "properties": {"format-version": "2"}}, "timestamptz_ns"),
        ({"name": "x", "schema": ID_SCHEMA, "properties": {"format-version": "4"}}, "4"),
        (
            {
                "name": "x",
                "schema": {
                    "type": "struct",
                    "schema-id": 0,
                    "fields": [{"id": 1, "name": "v", "type": "variant", "required": False}],
                },
                "properties": {"format-version": "3"},
            },
            "variant",
        ),
    ],
    ids=["v3-type-on-v2", "format-4", "variant"],
)
def test_what_isbre_cannot_honour_is_a_400_that_names_it(
    server: IsbreServer, namespace: str, body: dict, named: str
) -> None:
    answer = http.post(tables(server, namespace), json=body)
    assert answer.status_code == 400, answer.text
    assert named in answer.json()["error"]["message"]


def test_an_upgrade_beyond_v3_is_a_400(server: IsbreServer, namespace: str) -> None:
    http.post(tables(server, namespace), json={"name": "t", "schema": ID_SCHEMA}).raise_for_status()
    answer = http.post(
        f"{tables(server, namespace)}/t",
        json={"updates": [{"action": "upgrade-format-version", "format-version": 4}]},
    )
    assert answer.status_code == 400 and "4" in answer.json()["error"]["message"]
