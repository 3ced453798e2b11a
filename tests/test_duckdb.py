"""DuckDB's iceberg extension (installed offline from its PyPI wheels) against isbre."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from isbre.sinks.iceberg import IcebergSink
from pyiceberg.catalog.rest import RestCatalog

from tests.duck import connect
from tests.server import IsbreServer
from tests.sink_helpers import rows, span


@pytest.fixture
def duck(server: IsbreServer, tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    con = connect(tmp_path)
    con.execute(f"ATTACH 'isbre' AS lake (TYPE iceberg, ENDPOINT '{server.url}', AUTHORIZATION_TYPE 'none')")
    yield con
    con.close()


def test_duckdb_reads_what_pyiceberg_wrote(
    rest_catalog: RestCatalog, duck: duckdb.DuckDBPyConnection, namespace: str
) -> None:
    table = rest_catalog.create_table(
        f"{namespace}.trips", schema=pa.schema([pa.field("id", pa.int64()), pa.field("city", pa.string())])
    )
    table.append(pa.table({"id": pa.array(range(50), pa.int64()), "city": ["oslo", "bergen"] * 25}))
    table.append(pa.table({"id": pa.array(range(50, 60), pa.int64()), "city": ["tromso"] * 10}))

    assert duck.execute(f"SELECT count(*) FROM lake.{namespace}.trips").fetchone() == (60,)
    by_city = duck.execute(
        f"SELECT city, count(*) FROM lake.{namespace}.trips GROUP BY city ORDER BY city"
    ).fetchall()
    assert by_city == [("bergen", 25), ("oslo", 25), ("tromso", 10)]
    tables = duck.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = 'lake'"
    ).fetchall()
    assert (namespace, "trips") in tables


def test_duckdb_writes_and_pyiceberg_reads(
    rest_catalog: RestCatalog, duck: duckdb.DuckDBPyConnection, namespace: str
) -> None:
    duck.execute(f"CREATE TABLE lake.{namespace}.ducks (x INTEGER, y VARCHAR)")
    duck.execute(f"INSERT INTO lake.{namespace}.ducks VALUES (1, 'one'), (2, 'two'), (3, 'three')")
    duck.execute(f"UPDATE lake.{namespace}.ducks SET y = 'uno' WHERE x = 1")
    duck.execute(f"DELETE FROM lake.{namespace}.ducks WHERE x = 2")
    assert duck.execute(f"SELECT * FROM lake.{namespace}.ducks ORDER BY x").fetchall() == [
        (1, "uno"),
        (3, "three"),
    ]

    table = rest_catalog.load_table(f"{namespace}.ducks")
    rows = sorted(zip(*table.scan().to_arrow().to_pydict().values(), strict=True))
    assert rows == [(1, "uno"), (3, "three")]
    assert len(table.snapshots()) >= 3


def test_duckdb_appends_to_a_pyiceberg_table(
    rest_catalog: RestCatalog, duck: duckdb.DuckDBPyConnection, namespace: str
) -> None:
    table = rest_catalog.create_table(f"{namespace}.mixed", schema=pa.schema([pa.field("n", pa.int64())]))
    table.append(pa.table({"n": pa.array([1, 2], pa.int64())}))
    duck.execute(f"INSERT INTO lake.{namespace}.mixed VALUES (3), (4)")
    assert sorted(rest_catalog.load_table(f"{namespace}.mixed").scan().to_arrow()["n"].to_pylist()) == [
        1,
        2,
        3,
        4,
    ]


def test_duckdb_creates_a_schema(
    rest_catalog: RestCatalog, duck: duckdb.DuckDBPyConnection, namespace: str
) -> None:
    duck.execute(f"CREATE SCHEMA lake.{namespace}_duck")
    assert rest_catalog.namespace_exists(f"{namespace}_duck")


def test_duckdb_reads_what_the_sink_wrote(
    rest_catalog: RestCatalog, duck: duckdb.DuckDBPyConnection, namespace: str
) -> None:
    # The sink writes its metadata columns with their own Parquet encodings; engines must read them.
    with IcebergSink(rest_catalog, f"{namespace}.ingested", metadata_policy="all") as sink:
        sink.push(rows(0, 300), span(0, 300))
        sink.finish()
    found = duck.execute(
        "SELECT count(*), min(_twg_source_offset), max(_twg_source_offset), count(DISTINCT _twg_record_id),"
        " bool_and(_twg_emit_ts >= _twg_ingest_ts), any_value(_twg_source_topic)"
        f" FROM lake.{namespace}.ingested"
    ).fetchone()
    assert found == (300, 0, 299, 300, True, "orders")
    assert duck.execute(f"SELECT sum(n) FROM lake.{namespace}.ingested").fetchone() == (sum(range(300)),)


def test_duckdb_create_table_as_select(
    rest_catalog: RestCatalog, duck: duckdb.DuckDBPyConnection, namespace: str
) -> None:
    duck.execute(f"CREATE TABLE lake.{namespace}.ctas AS SELECT range AS x FROM range(5)")
    assert duck.execute(f"SELECT sum(x) FROM lake.{namespace}.ctas").fetchone() == (10,)
    assert rest_catalog.load_table(f"{namespace}.ctas").scan().to_arrow().num_rows == 5


def test_duckdb_creates_and_inserts_in_one_transaction(
    rest_catalog: RestCatalog, duck: duckdb.DuckDBPyConnection, namespace: str
) -> None:
    duck.execute("BEGIN")
    duck.execute(f"CREATE TABLE lake.{namespace}.together (x INTEGER)")
    duck.execute(f"INSERT INTO lake.{namespace}.together VALUES (1), (2), (3)")
    duck.execute("COMMIT")
    assert duck.execute(f"SELECT count(*) FROM lake.{namespace}.together").fetchone() == (3,)
    assert rest_catalog.load_table(f"{namespace}.together").scan().to_arrow().num_rows == 3


def test_a_stale_duckdb_insert_is_rebased(
    server: IsbreServer,
    rest_catalog: RestCatalog,
    duck: duckdb.DuckDBPyConnection,
    namespace: str,
    tmp_path: Path,
) -> None:
    """DuckDB commits one table's insert as a transaction of one change: a second connection whose
    transaction read the table before the first inserted still commits, made again on the head."""
    rest_catalog.create_table(f"{namespace}.hot", pa.schema([pa.field("a", pa.int64())]))
    other = connect(tmp_path / "other")
    other.execute(
        f"ATTACH 'isbre' AS lake (TYPE iceberg, ENDPOINT '{server.url}', AUTHORIZATION_TYPE 'none')"
    )
    try:
        duck.execute(f"INSERT INTO lake.{namespace}.hot VALUES (0)")
        other.execute("BEGIN")
        assert other.execute(f"SELECT count(*) FROM lake.{namespace}.hot").fetchall() == [(1,)]
        duck.execute(f"INSERT INTO lake.{namespace}.hot VALUES (1)")
        other.execute(f"INSERT INTO lake.{namespace}.hot VALUES (2)")
        other.execute("COMMIT")
    finally:
        other.close()
    table = rest_catalog.load_table(f"{namespace}.hot")
    assert sorted(table.scan().to_arrow()["a"].to_pylist()) == [0, 1, 2]
    current = table.current_snapshot()
    assert current is not None and current.summary is not None
    assert "isbre.rebased-from-parent" in current.summary.additional_properties
