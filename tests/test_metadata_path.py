"""`write.metadata.path`: a table's or view's metadata files go there, from its create or from the commit
that sets it; the path is confined like any location, and a purge removes what was written there."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from isbre.catalog.file_uris import local_path
from pyiceberg.catalog.rest import RestCatalog

from tests.http_client import http
from tests.server import ID_SCHEMA, IsbreServer
from tests.test_views import SCHEMA, version

P = "/v1/isbre"


def in_directory(location: str, directory: Path) -> bool:
    path = local_path(location)
    return path is not None and path.parent == directory and path.exists()


def test_a_tables_metadata_goes_to_its_metadata_path(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    elsewhere = server.warehouse / namespace / "kept-metadata"
    table = rest_catalog.create_table(
        f"{namespace}.t",
        schema=pa.schema([pa.field("id", pa.int64())]),
        properties={"write.metadata.path": elsewhere.as_uri()},
    )
    assert in_directory(table.metadata_location, elsewhere)
    table.append(pa.table({"id": pa.array([1, 2], pa.int64())}))
    table = rest_catalog.load_table(f"{namespace}.t")
    assert in_directory(table.metadata_location, elsewhere)
    assert table.scan().to_arrow().num_rows == 2
    written = sorted(elsewhere.glob("*.metadata.json"))
    assert len(written) == 2 and not list((local_path(table.metadata.location) / "metadata").glob("*.json"))  # type: ignore[operator]

    rest_catalog.purge_table(f"{namespace}.t")
    assert not any(path.exists() for path in written)


def test_setting_the_metadata_path_moves_the_next_metadata_file(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    table = rest_catalog.create_table(f"{namespace}.t", schema=pa.schema([pa.field("id", pa.int64())]))
    elsewhere = server.warehouse / namespace / "later"
    with table.transaction() as transaction:
        transaction.set_properties({"write.metadata.path": str(elsewhere)})
    assert in_directory(rest_catalog.load_table(f"{namespace}.t").metadata_location, elsewhere)


def test_the_metadata_path_is_confined(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str, tmp_path: Path
) -> None:
    other = rest_catalog.create_table(f"{namespace}.other", schema=pa.schema([pa.field("id", pa.int64())]))
    base = f"{server.url}{P}/namespaces/{namespace}/tables"
    http.post(base, json={"name": "u", "schema": ID_SCHEMA}).raise_for_status()
    for path in (
        (tmp_path / "outside").as_uri(),  # outside the warehouse
        f"{other.metadata.location}/metadata",  # inside another table
        (server.warehouse / "isbre.lmdb").as_uri(),  # the store
        f"{server.warehouse.as_uri()}/{namespace}/a/../b",
    ):
        created = http.post(
            base, json={"name": "t", "schema": ID_SCHEMA, "properties": {"write.metadata.path": path}}
        )
        assert created.status_code == 400, (path, created.text)
        moved = http.post(
            f"{base}/u",
            json={"updates": [{"action": "set-properties", "updates": {"write.metadata.path": path}}]},
        )
        assert moved.status_code == 400, (path, moved.text)
    # A table may not be created inside another's metadata path either.
    kept = server.warehouse / namespace / "shared-metadata"
    http.post(
        base, json={"name": "v", "schema": ID_SCHEMA, "properties": {"write.metadata.path": kept.as_uri()}}
    ).raise_for_status()
    inside = http.post(base, json={"name": "w", "schema": ID_SCHEMA, "location": (kept / "w").as_uri()})
    assert inside.status_code == 400, inside.text
    assert not (tmp_path / "outside").exists()


def test_a_views_metadata_goes_to_its_metadata_path(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    elsewhere = server.warehouse / namespace / "view-metadata"
    rest_catalog.create_view(
        f"{namespace}.v",
        SCHEMA,
        version("SELECT 1", namespace),
        properties={"write.metadata.path": elsewhere.as_uri()},
    )
    loaded = http.get(f"{server.url}{P}/namespaces/{namespace}/views/v").json()
    assert in_directory(loaded["metadata-location"], elsewhere)
