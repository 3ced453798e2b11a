"""`isbre ingest` against a real server: files become rows once, however often it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.rest import RestCatalog

from tests.server import IsbreServer


def _ingest(server: IsbreServer, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rest.cli", "ingest", *args, "--uri", server.url, "--batch-size", "7"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_ingesting_the_same_files_twice_adds_rows_once(
    server: IsbreServer, rest_catalog: RestCatalog, tmp_path: Path
) -> None:
    (tmp_path / "in").mkdir()
    csv = tmp_path / "in" / "a.csv"
    csv.write_text("id,city\n" + "".join(f"{i},city {i}\n" for i in range(20)))
    jsonl = tmp_path / "in" / "b.jsonl"
    jsonl.write_text("".join(json.dumps({"id": 100 + i, "city": f"j{i}"}) + "\n" for i in range(5)))
    parquet = tmp_path / "in" / "c.parquet"
    pq.write_table(pa.table({"id": pa.array(range(200, 230), pa.int64()), "city": ["p"] * 30}), parquet)

    csv_glob = str(tmp_path / "in" / "*.csv")
    first = _ingest(server, csv_glob, str(jsonl), str(parquet), "--table", "files.cities")
    assert first.returncode == 0, first.stderr
    assert "files.cities: 55 of 55 rows written from 3 file(s)" in first.stdout
    second = _ingest(server, str(tmp_path / "in" / "*"), "--table", "files.cities")
    assert second.returncode == 0, second.stderr
    assert "0 of 55 rows written" in second.stdout and second.stdout.count("nothing new") == 3

    data = rest_catalog.load_table("files.cities").scan().to_arrow()
    assert data.num_rows == 55
    by_file = {}
    for row in data.to_pylist():
        by_file.setdefault(row["_twg_source_topic"], []).append((row["_twg_source_offset"], row["id"]))
    # A row's offset is its ordinal in its file.
    assert sorted(by_file[str(csv)]) == [(i, i) for i in range(20)]
    assert sorted(by_file[str(jsonl)]) == [(i, 100 + i) for i in range(5)]
    assert sorted(by_file[str(parquet)]) == [(i, 200 + i) for i in range(30)]

    # A file that grew adds only its new rows.
    with csv.open("a") as grown:
        grown.write("20,city 20\n21,city 21\n")
    third = _ingest(server, str(csv), "--table", "files.cities")
    assert "2 of 22 rows written" in third.stdout, third.stdout
    assert rest_catalog.load_table("files.cities").scan().to_arrow().num_rows == 57


def test_ingest_errors_are_clear(server: IsbreServer, tmp_path: Path) -> None:
    missing = _ingest(server, str(tmp_path / "nothing-*.csv"), "--table", "files.x")
    assert missing.returncode == 2 and "No file matches" in missing.stderr
    (tmp_path / "a.txt").write_text("x")
    unknown = _ingest(server, str(tmp_path / "a.txt"), "--table", "files.x")
    assert unknown.returncode == 1 and "unknown format" in unknown.stderr
    no_namespace = _ingest(server, str(tmp_path / "a.txt"), "--table", "x")
    assert no_namespace.returncode == 2 and "needs a namespace" in no_namespace.stderr
