"""Deleting files stays inside the table being purged; no table may sit in or around another's files
or the store; statistics name the table's own snapshots and files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from isbre.catalog import Identifier
from isbre.catalog.file_uris import local_path
from isbre.catalog.locations import LocationNotAllowedError
from isbre.catalog.warehouses import open_catalog
from isbre.rest.auth import sha256_hex
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.types import LongType, NestedField

from tests.crafted import crafted_snapshot
from tests.http_client import http
from tests.server import ID_SCHEMA, IsbreServer, secured_server

P = "/v1/isbre"


def files_under(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in root.rglob("*") if p.is_file()}


def table_with_data(catalog: RestCatalog, namespace: str, name: str) -> tuple[str, Path]:
    table = catalog.create_table(f"{namespace}.{name}", schema=pa.schema([pa.field("id", pa.int64())]))
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    table = catalog.load_table(f"{namespace}.{name}")
    location = local_path(table.metadata.location)
    assert location is not None
    return table.metadata_location, location


def set_statistics(snapshot_id: int, path: str) -> dict[str, object]:
    return {
        "action": "set-statistics",
        "snapshot-id": snapshot_id,
        "statistics": {
            "snapshot-id": snapshot_id,
            "statistics-path": path,
            "file-size-in-bytes": 1,
            "file-footer-size-in-bytes": 1,
            "blob-metadata": [],
        },
    }


def test_statistics_must_name_an_existing_snapshot_and_a_file_of_the_table(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    _, location = table_with_data(rest_catalog, namespace, "t")
    snapshot = rest_catalog.load_table(f"{namespace}.t").metadata.current_snapshot_id
    store_file = server.warehouse / "isbre.lmdb" / "data.mdb"
    url = f"{server.url}{P}/namespaces/{namespace}/tables/t"
    for update in (
        set_statistics(123456789, str(location / "metadata" / "stats.puffin")),  # no such snapshot
        set_statistics(snapshot, str(store_file)),  # the store
        set_statistics(snapshot, f"{location}/../elsewhere.puffin"),
        set_statistics(snapshot, "file:///etc/passwd"),
    ):
        refused = http.post(url, json={"updates": [update]})
        assert refused.status_code == 400, refused.text
    allowed = http.post(
        url, json={"updates": [set_statistics(snapshot, str(location / "metadata" / "s.puffin"))]}
    )
    assert allowed.status_code == 200, allowed.text


def test_a_purge_deletes_nothing_outside_the_table(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    """A crafted table whose metadata names the store and another table's files is refused at
    register, naming the first such file; one whose metadata log names another table's metadata
    is registered, and its purge deletes only what lies under its own location."""
    victim_metadata, victim = table_with_data(rest_catalog, namespace, "victim")
    before = files_under(server.warehouse)
    crafted = json.loads(Path(local_path(victim_metadata)).read_text())  # type: ignore[arg-type]
    own = server.warehouse / namespace / "crafted"
    crafted["location"] = own.as_uri()
    crafted["table-uuid"] = "9d4b1e6c-8c7f-4bb6-9a59-3c1a3b1e7a01"
    snapshot = crafted["current-snapshot-id"]
    crafted["statistics"] = [
        set_statistics(snapshot, str(server.warehouse / "isbre.lmdb" / "data.mdb"))["statistics"],
        set_statistics(snapshot, str(victim / "metadata" / Path(victim_metadata).name))["statistics"],
    ]
    crafted["metadata-log"] = [{"metadata-file": victim_metadata, "timestamp-ms": 1}]
    (own / "metadata").mkdir(parents=True)
    crafted_file = own / "metadata" / "00000-crafted.metadata.json"
    crafted_file.write_text(json.dumps(crafted))
    register = {"name": "crafted", "metadata-location": crafted_file.as_uri()}
    refused = http.post(f"{server.url}{P}/namespaces/{namespace}/register", json=register)
    assert refused.status_code == 400 and "outside the table's places" in refused.text, refused.text
    crafted |= {"snapshots": [], "snapshot-log": [], "refs": {}, "statistics": [], "current-snapshot-id": -1}
    crafted_file.unlink()
    crafted_file = own / "metadata" / "00001-crafted.metadata.json"
    crafted_file.write_text(json.dumps(crafted))
    register["metadata-location"] = crafted_file.as_uri()
    assert http.post(f"{server.url}{P}/namespaces/{namespace}/register", json=register).status_code == 200

    dropped = http.delete(f"{server.url}{P}/namespaces/{namespace}/tables/crafted?purgeRequested=true")
    assert dropped.status_code in (204, 500), dropped.text
    assert files_under(server.warehouse).keys() >= before.keys(), "a file outside the crafted table went"
    assert not crafted_file.exists()
    assert rest_catalog.load_table(f"{namespace}.victim").scan().to_arrow().num_rows == 3


def test_a_failed_purge_says_so_and_leaves_a_record(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    table_with_data(rest_catalog, namespace, "broken")
    manifest_list = rest_catalog.load_table(f"{namespace}.broken").current_snapshot().manifest_list
    os.remove(local_path(manifest_list))  # type: ignore[arg-type]
    before = server.high_water()
    answer = http.delete(f"{server.url}{P}/namespaces/{namespace}/tables/broken?purgeRequested=true")
    assert answer.status_code == 500, answer.text
    error = answer.json()["error"]
    assert error["type"] == "PurgeIncompleteException"
    assert "dropped" in error["message"] and "commit_seq" in error["message"]
    assert not rest_catalog.table_exists(f"{namespace}.broken")
    records = http.post(
        f"{server.url}{P}/events", json={"continuation-token": None, "page-size": 10}
    )  # the pull endpoint shows only spec kinds; the SSE log has the purge record
    assert records.status_code == 200
    with http.stream("GET", f"{server.url}{P}/events", params={"after": before}, timeout=10) as stream:
        kinds = []
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kinds.append(line[7:])
            if len(kinds) == 2:
                break
    assert kinds == ["table.drop", "table.purge-incomplete"]


def test_a_table_may_not_sit_in_or_around_another_or_the_store(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    metadata_location, location = table_with_data(rest_catalog, namespace, "first")
    tables = f"{server.url}{P}/namespaces/{namespace}/tables"
    for place in (
        location,
        location / "inner",
        location.parent,  # around it
        server.warehouse,
        server.warehouse / "isbre.lmdb",
        server.warehouse / "isbre.lmdb" / "sub",
    ):
        refused = http.post(tables, json={"name": "second", "schema": ID_SCHEMA, "location": place.as_uri()})
        assert refused.status_code == 400, (place, refused.text)
    ok = http.post(tables, json={"name": "second", "schema": ID_SCHEMA})
    assert ok.status_code == 200
    moved = http.post(
        f"{tables}/second", json={"updates": [{"action": "set-location", "location": str(location)}]}
    )
    assert moved.status_code == 400, moved.text
    twin = http.post(
        f"{server.url}{P}/namespaces/{namespace}/register",
        json={"name": "twin", "metadata-location": metadata_location},
    )
    # The same metadata twice: its uuid, as well as its place, is the first table's.
    assert twin.status_code == 409 and "already another table's" in twin.text, twin.text
    # Once the first table is gone, its place (and its uuid) is free again.
    assert http.delete(f"{tables}/first").status_code == 204
    again = http.post(
        f"{server.url}{P}/namespaces/{namespace}/register",
        json={"name": "twin", "metadata-location": metadata_location},
    )
    assert again.status_code == 200, again.text


def test_file_uris_with_a_host_are_refused(server: IsbreServer, namespace: str) -> None:
    place = f"file://evil.example{server.warehouse}/{namespace}/h"
    refused = http.post(
        f"{server.url}{P}/namespaces/{namespace}/tables",
        json={"name": "h", "schema": ID_SCHEMA, "location": place},
    )
    assert refused.status_code == 400, refused.text


@pytest.fixture(scope="module")
def scoped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    principals = [
        {"name": "root", "roles": ["admin"], "token_sha256": sha256_hex("root")},
        {
            "name": "sales-etl",
            "roles": ["writer"],
            "namespaces": ["sales"],
            "token_sha256": sha256_hex("etl"),
        },
        {
            "name": "sales-admin",
            "roles": ["admin"],
            "namespaces": ["sales"],
            "token_sha256": sha256_hex("sa"),
        },
    ]
    server = secured_server(tmp_path_factory.mktemp("scoped") / "warehouse", principals)
    yield server
    server.stop()


def test_a_scoped_principal_registers_and_places_only_inside_its_scope(scoped: IsbreServer) -> None:
    root = RestCatalog("r", uri=scoped.url, token="root")
    root.create_namespace("sales")
    root.create_namespace("other")
    other_metadata, _ = table_with_data(root, "other", "secret")
    headers = {"Authorization": "Bearer etl"}
    base = f"{scoped.url}{P}/namespaces/sales"
    stolen = http.post(
        f"{base}/register", json={"name": "stolen", "metadata-location": other_metadata}, headers=headers
    )
    assert stolen.status_code == 403, stolen.text
    placed = http.post(
        f"{base}/tables",
        json={"name": "p", "schema": ID_SCHEMA, "location": (scoped.warehouse / "other" / "p").as_uri()},
        headers=headers,
    )
    assert placed.status_code == 403, placed.text
    inside = http.post(
        f"{base}/tables",
        json={"name": "p", "schema": ID_SCHEMA, "location": (scoped.warehouse / "sales" / "p").as_uri()},
        headers=headers,
    )
    assert inside.status_code == 200, inside.text
    moved = http.post(
        f"{base}/tables/p",
        json={
            "updates": [{"action": "set-location", "location": (scoped.warehouse / "other" / "q").as_uri()}]
        },
        headers=headers,
    )
    assert moved.status_code == 403, moved.text
    relocated = http.post(
        f"{scoped.url}{P}/namespaces",
        json={
            "namespace": ["sales", "eu"],
            "properties": {"location": (scoped.warehouse / "other").as_uri()},
        },
        headers={"Authorization": "Bearer sa"},
    )
    assert relocated.status_code == 403, relocated.text


def test_a_purge_through_encoded_separators_dot_dot_and_links_deletes_nothing_outside(
    scoped: IsbreServer, tmp_path: Path
) -> None:
    """The attack that deleted a file outside the warehouse, another namespace's metadata and the
    store: locations read one way when decoded and another by the kernel, and data files reaching
    out through a literal `q%2F...` directory, `..` and a planted symbolic link."""
    root = RestCatalog("r", uri=scoped.url, token="root")
    for namespace in ("sales", "other"):
        root.create_namespace_if_not_exists(namespace)
    other_metadata, _ = table_with_data(root, "other", "kept")
    outside = tmp_path / "outside" / "secret.txt"
    outside.parent.mkdir()
    outside.write_text("not the table's")
    targets = [outside, Path(local_path(other_metadata) or ""), scoped.warehouse / "isbre.lmdb" / "data.mdb"]
    admin = {"Authorization": "Bearer sa"}
    base = f"{scoped.url}{P}/namespaces/sales"
    sales = (scoped.warehouse / "sales").as_uri()
    other_location = root.load_table("other.kept").metadata.location
    for location in (
        f"{sales}/q%2Fr%2F",
        f"{sales}/q%2fr",
        f"{sales}/a/../b",
        f"{sales}/%2E%2E/x",
        f"{sales}/x;y",
    ):
        refused = http.post(
            f"{base}/tables", json={"name": "bad", "schema": ID_SCHEMA, "location": location}, headers=admin
        )
        assert refused.status_code == 400, (location, refused.text)
    for location in (f"{other_location}?", f"{other_location}#x"):
        refused = http.post(
            f"{base}/tables", json={"name": "bad", "schema": ID_SCHEMA, "location": location}, headers=admin
        )
        assert refused.status_code in (400, 403), (location, refused.text)

    catalog = RestCatalog("sa", uri=scoped.url, token="sa")
    table = catalog.create_table("sales.crafted", schema=pa.schema([pa.field("id", pa.int64())]))
    own = local_path(table.metadata.location)
    assert own is not None
    # What an engine with access to its table's directory can plant there.
    decoy = own / "data" / "q%2Fr%2Fs%2Ft%2F"
    decoy.mkdir(parents=True)
    (own / "link").symlink_to(outside.parent)
    (own / "data" / "real.parquet").write_bytes(b"PAR1")
    up = "/".join([".."] * 4)  # from the decoy: data, the table, sales, the warehouse
    victim = Path(local_path(other_metadata) or "").relative_to(scoped.warehouse)
    reaching = [
        f"{decoy}/{up}/isbre.lmdb/data.mdb",
        f"{decoy.as_posix()}/{up}/{victim}",
        f"{own}/link/secret.txt",
        str(outside),
        f"{own.as_uri()}/data/q%2Fr%2Fs%2Ft%2F/{up}/isbre.lmdb/data.mdb",
    ]
    url = f"{base}/tables/crafted"
    for manifest_list in (f"{decoy}/{up}/sales/x.avro", f"{own}/metadata/q%2F..%2F..%2Fx.avro"):
        updates = crafted_snapshot(
            table.metadata, manifest_list, [], write_list_at=str(own / "metadata" / "l.avro")
        )
        refused = http.post(url, json={"updates": updates}, headers=admin)
        assert refused.status_code == 400, refused.text
    updates = crafted_snapshot(
        table.metadata,
        f"{own}/metadata/snap-crafted.avro",
        [(f"{own}/metadata/crafted-m0.avro", [*reaching, str(own / "data" / "real.parquet")])],
    )
    assert http.post(url, json={"updates": updates}, headers=admin).status_code == 200
    dropped = http.delete(f"{url}?purgeRequested=true", headers=admin)
    assert dropped.status_code == 204, dropped.text
    for target in targets:
        assert target.exists(), f"{target} was deleted"
    assert not (own / "data" / "real.parquet").exists()
    assert root.load_table("other.kept").scan().to_arrow().num_rows == 3


def test_a_store_made_before_the_location_index_gets_one(tmp_path: Path) -> None:

    schema = Schema(NestedField(1, "id", LongType(), required=False))
    service = open_catalog(tmp_path / "wh")
    service.namespaces.create(("db",), {})
    first = service.tables.create(
        Identifier.of(("db",), "a"), schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER
    )
    store = service.core.store
    # As an older isbre left it: no index of locations, and no mark that one was made.
    with store.env.begin(write=True) as txn:  # type: ignore[attr-defined]
        txn.drop(store.dbs["locations"], delete=False)  # type: ignore[attr-defined]
        txn.delete(b"marker:locations", db=store.dbs["meta"])  # type: ignore[attr-defined]
    service.close()

    reopened = open_catalog(tmp_path / "wh")
    try:
        with pytest.raises(LocationNotAllowedError, match="overlaps"):
            reopened.tables.create(
                Identifier.of(("db",), "b"),
                schema,
                UNPARTITIONED_PARTITION_SPEC,
                UNSORTED_SORT_ORDER,
                location=first.metadata.location + "/inner",
            )
    finally:
        reopened.close()
