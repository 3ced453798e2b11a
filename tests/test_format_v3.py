"""Format version 3: created, staged, registered, loaded, committed to and upgraded to, with the
reference's row-lineage rules, column defaults, nanosecond timestamps and encryption keys; what isbre
cannot honour is a 400 that names it."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
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
        "timestamp-ms": int(time.time() * 1000) + sequence,
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


KEY = {"key-id": "k", "encrypted-key-metadata": "c2VjcmV0"}


def long_field(field_id: int, **extra: object) -> dict[str, object]:
    return {"id": field_id, "name": f"f{field_id}", "type": "long", "required": False, **extra}


def add_schema(*fields: dict[str, object]) -> dict[str, object]:
    schema = {"type": "struct", "schema-id": 1, "fields": [*V3_SCHEMA["fields"], *fields]}
    return {"action": "add-schema", "schema": schema}


def test_v3_updates_the_java_reference_refuses_are_a_400_that_changes_nothing(
    server: IsbreServer, namespace: str
) -> None:
    created = create_v3(server, namespace, "strict").json()
    url, location = f"{tables(server, namespace)}/strict", created["metadata"]["location"]
    stale = snapshot(1, 1, 0, 1)
    stale["timestamp-ms"] = created["metadata"]["last-updated-ms"] - 10 * 60_000
    for update, said in (
        ([snapshot(1, 1, 0, -10)], "added-rows -10"),
        ([stale], "before the latest metadata log entry"),
    ):
        answer = add(server, namespace, "strict", location, *update)
        assert answer.status_code == 400 and said in answer.json()["error"]["message"], answer.text
    for update, said in (
        (add_schema(long_field(2_147_483_648)), "2147483648"),
        (add_schema(long_field(6, **{"initial-default": "notalong"})), "notalong"),
        (add_schema(long_field(6, **{"write-default": True})), "write-default"),
        ({"action": "set-properties", "updates": {"format-version": "2"}}, "format-version"),
        ({"action": "set-properties", "updates": {"current-snapshot-id": "1"}}, "current-snapshot-id"),
        (
            {
                "action": "add-encryption-key",
                "encryption-key": {"key-id": "k", "encrypted-key-metadata": "n0t!"},
            },
            "base64",
        ),
    ):
        answer = http.post(url, json={"updates": [update]})
        assert answer.status_code == 400 and said in answer.json()["error"]["message"], (update, answer.text)
    assert http.get(url).json()["metadata-location"] == created["metadata-location"]


def v3_with_a_snapshot(server: IsbreServer, namespace: str) -> dict[str, Any]:
    """The metadata file of a new v3 table with one snapshot, as JSON."""
    name = f"source_{uuid.uuid4().hex[:6]}"
    location = create_v3(server, namespace, name).json()["metadata"]["location"]
    added = add(server, namespace, name, location, snapshot(1, 1, 0, 10))
    found: dict[str, Any] = json.loads(Path(local_path(added.json()["metadata-location"]) or "").read_text())
    return found


def register_as(
    server: IsbreServer, namespace: str, metadata: dict[str, Any], root: Path, **changes: Any
) -> httpx.Response:
    """Register `metadata` with `changes` as a new table at a place of its own under `root`."""
    name = f"r_{uuid.uuid4().hex[:8]}"
    place = root / name
    (place / "metadata").mkdir(parents=True)
    found = {**metadata, "location": place.as_uri(), "table-uuid": str(uuid.uuid4()), "metadata-log": []}
    found["snapshots"] = [
        {**each, "manifest-list": f"{place.as_uri()}/metadata/snap-{each['snapshot-id']}.avro"}
        for each in metadata["snapshots"]
    ]
    for key, value in changes.items():
        if value is None:
            found.pop(key, None)
        elif key == "manifest-list":
            found["snapshots"][0]["manifest-list"] = value
        else:
            found[key] = value
    path = place / "metadata" / "00000-registered.metadata.json"
    path.write_text(json.dumps(found))
    body = {"name": name, "metadata-location": path.as_uri()}
    return http.post(f"{server.url}{P}/namespaces/{namespace}/register", json=body)


def test_registered_metadata_the_java_reference_refuses_is_a_400(server: IsbreServer, namespace: str) -> None:
    metadata = v3_with_a_snapshot(server, namespace)
    tmp_path = server.warehouse / namespace / "registered"
    registered = register_as(server, namespace, metadata, tmp_path)
    assert registered.status_code == 200, registered.text
    for changes, said in (
        ({"next-row-id": None}, "next-row-id"),
        ({"next-row-id": -1}, "next-row-id"),
        ({"current-snapshot-id": 42}, "current-snapshot-id 42"),
        ({"last-column-id": 2_147_483_648}, "last-column-id"),
        ({"manifest-list": "file:///etc/passwd"}, "outside the table"),
        ({"properties": {"py-io-impl": "x.Y"}}, "py-io-impl"),
    ):
        answer = register_as(server, namespace, metadata, tmp_path, **changes)
        assert answer.status_code == 400 and said in answer.json()["error"]["message"], (changes, answer.text)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first_row_id=st.sampled_from(["next", "behind", None]),
    added_rows=st.one_of(st.none(), st.integers(-5, 5)),
    age_ms=st.sampled_from([0, 30_000, 10 * 60_000]),
    next_row_id=st.one_of(st.none(), st.integers(-3, 3)),
    current=st.sampled_from([1, 2, -1, None]),
)
def test_v3_commits_and_registers_are_refused_exactly_when_java_refuses(
    server: IsbreServer,
    namespace: str,
    first_row_id: str | None,
    added_rows: int | None,
    age_ms: int,
    next_row_id: int | None,
    current: int | None,
) -> None:
    """A snapshot added to a v3 table is accepted exactly when it has a first-row-id at the table's
    next-row-id, added-rows of at least 0 and a timestamp no more than a minute before the table's
    last update; registered v3 metadata exactly when its next-row-id is there and at least 0 and its
    current snapshot is one it has. A refusal is a 400 and changes nothing."""
    name = f"h_{uuid.uuid4().hex[:8]}"
    created = create_v3(server, namespace, name).json()
    url, location = f"{tables(server, namespace)}/{name}", created["metadata"]["location"]
    add(server, namespace, name, location, snapshot(1, 1, 0, 4)).raise_for_status()
    before = http.get(url).json()
    proposed = snapshot(2, 2, {"next": 4, "behind": 3, None: None}[first_row_id], added_rows, parent=1)
    proposed["timestamp-ms"] = before["metadata"]["last-updated-ms"] - age_ms
    answer = add(server, namespace, name, location, proposed)
    valid = first_row_id == "next" and added_rows is not None and added_rows >= 0 and age_ms <= 60_000
    assert answer.status_code == (200 if valid else 400), answer.text
    after = http.get(url).json()
    if valid:
        assert after["metadata"]["next-row-id"] == 4 + (added_rows or 0)
    else:
        assert after["metadata-location"] == before["metadata-location"]

    metadata = json.loads(Path(local_path(after["metadata-location"]) or "").read_text())
    registered = register_as(
        server,
        namespace,
        metadata,
        server.warehouse / namespace / "registered",
        **{"next-row-id": next_row_id, "current-snapshot-id": current},
    )
    known = current in (None, -1) or any(s["snapshot-id"] == current for s in metadata["snapshots"])
    valid = next_row_id is not None and next_row_id >= 0 and known
    assert registered.status_code == (200 if valid else 400), registered.text
