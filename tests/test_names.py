"""Any name the Iceberg spec allows: `/` and `\\` in namespaces and tables, kept as the user wrote them in
the catalog and never reaching a path unencoded."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pytest
from isbre.catalog.file_uris import local_path
from isbre.catalog.identifiers import path_segment
from pyiceberg.catalog.rest import RestCatalog

from tests.duck import connect
from tests.http_client import http
from tests.server import ID_SCHEMA, IsbreServer

NAMES = ["tab/le", "back\\slash", "..up", "with space", "a%2Fb", "表/x", "x" * 200]


def files_in(root: Path) -> list[Path]:
    return [Path(directory) / name for directory, _, names in os.walk(root) for name in names]


def test_a_table_named_with_a_slash_in_a_namespace_named_with_one(
    server: IsbreServer, rest_catalog: RestCatalog, tmp_path: Path
) -> None:
    rest_catalog.create_namespace("new/db")
    table = rest_catalog.create_table("new/db.tab/le", schema=pa.schema([pa.field("id", pa.int64())]))
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    assert rest_catalog.list_tables("new/db") == [("new/db", "tab/le")]
    assert ("new/db",) in rest_catalog.list_namespaces()
    loaded = rest_catalog.load_table("new/db.tab/le")
    assert sorted(loaded.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]

    root = local_path(loaded.metadata.location)
    assert root is not None and root.parent.parent == server.warehouse.resolve()
    assert root.parent.name == path_segment("new/db") and root.name.startswith(path_segment("tab/le"))
    written = files_in(root)
    assert any(p.suffix == ".parquet" for p in written)
    for path in files_in(server.warehouse):
        assert server.warehouse.resolve() in path.resolve().parents

    con = connect(tmp_path)
    con.execute(f"ATTACH 'isbre' AS lake (TYPE iceberg, ENDPOINT '{server.url}', AUTHORIZATION_TYPE 'none')")
    assert con.execute('SELECT sum(id) FROM lake."new/db"."tab/le"').fetchone() == (6,)
    con.close()

    rest_catalog.rename_table("new/db.tab/le", "new/db.tab/le2")
    rest_catalog.purge_table("new/db.tab/le2")
    assert not any(p.exists() for p in written)


@pytest.mark.parametrize("name", NAMES)
def test_names_the_spec_allows_are_kept_and_encoded_on_disk(
    server: IsbreServer, namespace: str, name: str
) -> None:
    base = f"{server.url}/v1/isbre/namespaces/{namespace}/tables"
    created = http.post(base, json={"name": name, "schema": ID_SCHEMA})
    assert created.status_code == 200, created.text
    location = created.json()["metadata"]["location"]
    directory = location.rsplit("/", 1)[1]
    assert "\\" not in directory and not directory.startswith(".") and "%" not in directory
    assert directory.startswith(path_segment(name)) and len(directory.encode()) < 255
    listed = http.get(base).json()["identifiers"]
    assert {"namespace": [namespace], "name": name} in listed
    one = http.get(f"{base}/{quote(name, safe='')}")
    assert one.status_code == 200, one.text


def test_path_segments_are_distinct_and_safe() -> None:
    names = ["a/b", "a_b", "a\\b", "a b", "a%2Fb", "a~b", ".hidden", "..", "A/B"]
    segments = [path_segment(n) for n in names]
    assert len(set(segments)) == len(segments)
    for segment in segments:
        assert all(c.isascii() and (c.isalnum() or c in "_.-~") for c in segment), segment
        assert not segment.startswith(".")
    assert path_segment("plain_name-1.0") == "plain_name-1.0"


def test_a_control_character_in_the_path_is_refused(server: IsbreServer, namespace: str) -> None:
    answer = http.get(f"{server.url}/v1/isbre/namespaces/{namespace}/tables/a%1Eb")
    assert answer.status_code == 400, answer.text
