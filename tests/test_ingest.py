"""`isbre ingest` against a real server: files become rows once, however often it runs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from isbre.rest.auth import sha256_hex
from pyiceberg.catalog.rest import RestCatalog

from tests import zygote
from tests.http_client import http
from tests.server import IsbreServer, secured_server
from tests.sink_helpers import ingest

# Run against a server on each store.
SERVER_STORES = ("lmdb", "postgresql")


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
    first = ingest(server, csv_glob, str(jsonl), str(parquet), "--table", "files.cities")
    assert first.returncode == 0, first.stderr
    assert "files.cities: 55 of 55 rows written from 3 file(s)" in first.stdout
    second = ingest(server, str(tmp_path / "in" / "*"), "--table", "files.cities")
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
    third = ingest(server, str(csv), "--table", "files.cities")
    assert "2 of 22 rows written" in third.stdout, third.stdout
    assert rest_catalog.load_table("files.cities").scan().to_arrow().num_rows == 57


def test_ingest_errors_are_clear(server: IsbreServer, tmp_path: Path) -> None:
    missing = ingest(server, str(tmp_path / "nothing-*.csv"), "--table", "files.x")
    assert missing.returncode == 2 and "No file matches" in missing.stderr
    (tmp_path / "a.txt").write_text("x")
    unknown = ingest(server, str(tmp_path / "a.txt"), "--table", "files.x")
    assert unknown.returncode == 1 and "unknown format" in unknown.stderr
    no_namespace = ingest(server, str(tmp_path / "a.txt"), "--table", "x")
    assert no_namespace.returncode == 2 and "needs a namespace" in no_namespace.stderr


def test_untyped_files_take_the_table_s_types(
    server: IsbreServer, rest_catalog: RestCatalog, tmp_path: Path
) -> None:
    rest_catalog.create_namespace_if_not_exists("typed")
    rest_catalog.create_table(
        "typed.payments", schema=pa.schema([pa.field("id", pa.int64()), pa.field("amount", pa.float64())])
    )
    whole = tmp_path / "whole.csv"
    whole.write_text("id,amount\n1,5\n2,7\n")
    lines = tmp_path / "lines.jsonl"
    lines.write_text('{"id": 3, "amount": 4}\n')
    done = ingest(server, str(whole), str(lines), "--table", "typed.payments")
    assert done.returncode == 0, done.stderr
    data = rest_catalog.load_table("typed.payments").scan().to_arrow()
    assert data.schema.field("amount").type == pa.float64()
    assert sorted(data.column("amount").to_pylist()) == [4.0, 5.0, 7.0]


def test_a_refused_file_names_its_line_and_column_and_the_others_still_land(
    server: IsbreServer, rest_catalog: RestCatalog, tmp_path: Path
) -> None:
    rest_catalog.create_namespace_if_not_exists("typed")
    bad = tmp_path / "a-bad.csv"
    bad.write_text("id,amount\n1,5\n2,oops\n")
    good = tmp_path / "b-good.csv"
    good.write_text("id,amount\n3,2.5\n")
    typed = tmp_path / "c-typed.parquet"  # a type of its own, which no parsing changes
    pq.write_table(pa.table({"id": pa.array([4], pa.int64()), "amount": pa.array(["six"])}), typed)
    for run in range(2):  # the second run refuses the same way, naming the same files
        done = ingest(
            server,
            str(bad),
            str(good),
            str(typed),
            "--table",
            "typed.mixed",
            "--types",
            "amount=double,id=long",
        )
        assert done.returncode == 1
        assert f"{bad}: line 3, column 'amount'" in done.stderr, done.stderr
        assert f"{typed}: Column 'amount': the batch's string cannot be written" in done.stderr, done.stderr
        assert "2 file(s) refused" in done.stderr
        assert f"{good}: 1 rows read, {1 - run} written" in done.stdout
    data = rest_catalog.load_table("typed.mixed").scan().to_arrow()
    assert data.column("amount").to_pylist() == [2.5]
    assert data.schema.field("id").type == pa.int64()


def test_ingest_authenticates_from_the_environment(tmp_path: Path) -> None:
    principals = [
        {"name": "etl", "roles": ["admin"], "client_id": "etl", "secret_sha256": sha256_hex("s3")},
        {"name": "loader", "roles": ["writer"], "client_id": "loader", "secret_sha256": sha256_hex("w")},
    ]
    server = secured_server(tmp_path / "warehouse", principals)
    try:
        data = tmp_path / "d.csv"
        data.write_text("id\n1\n")
        command = [
            sys.executable,
            "-m",
            "isbre.rest.cli",
            "ingest",
            str(data),
            "--table",
            "sec.t",
            "--uri",
            server.url,
        ]
        refused = zygote.run(command, capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        env = {**os.environ, "ISBRE_CREDENTIAL": "etl:s3"}
        done = zygote.run(command, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        assert "sec.t: 1 of 1 rows written" in done.stdout
        # A writer: into a namespace that exists, yes; a new one, refused, saying what was tried.
        writer = {**os.environ, "ISBRE_CREDENTIAL": "loader:w"}
        into_existing = [*command[:6], "sec.by_writer", *command[7:]]
        done = zygote.run(into_existing, capture_output=True, text=True, timeout=120, env=writer)
        assert done.returncode == 0, done.stderr
        into_new = [*command[:6], "fresh.t", *command[7:]]
        refused = zygote.run(into_new, capture_output=True, text=True, timeout=120, env=writer)
        assert refused.returncode != 0 and "namespace 'fresh' does not exist" in refused.stderr
        assert "creating a namespace needs the admin role" in refused.stderr, refused.stderr
    finally:
        server.stop()


def test_one_run_types_its_new_columns_from_every_file(
    server: IsbreServer, rest_catalog: RestCatalog, tmp_path: Path
) -> None:
    """A whole number in one file and a fraction in another: one run gives the table what two runs
    give it (a double column), and every row lands."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "a.csv").write_text("id,amount\n1,1.5\n")
    (tmp_path / "run" / "b.csv").write_text("id,amount\n2,1\n3,2\n")
    done = ingest(server, str(tmp_path / "run" / "*.csv"), "--table", "files.amounts")
    assert done.returncode == 0, done.stderr
    table = rest_catalog.load_table("files.amounts")
    assert str(table.schema().find_field("amount").field_type) == "double"
    assert sorted(table.scan().to_arrow()["amount"].to_pylist()) == [1.0, 1.5, 2.0]


@pytest.mark.parametrize("first", ["a.csv", "b.csv"])
def test_which_file_comes_first_does_not_decide_a_new_columns_type(
    server: IsbreServer, rest_catalog: RestCatalog, tmp_path: Path, first: str
) -> None:
    """Numbers in one CSV file and text in another: the column is text, in either order, and a
    second run, reading the files as the table's types, writes the same rows and refuses nothing."""
    files = {"a.csv": "id,code\n1,7\n", "b.csv": "id,code\n2,x7\n"}
    paths = []
    for name in (first, *(n for n in files if n != first)):
        (tmp_path / name).write_text(files[name])
        paths.append(str(tmp_path / name))
    ident = f"files.codes_{first[0]}"
    for _ in range(2):
        done = ingest(server, *paths, "--table", ident)
        assert done.returncode == 0, done.stderr
    table = rest_catalog.load_table(ident)
    assert str(table.schema().find_field("code").field_type) == "string"
    assert sorted(table.scan().to_arrow()["code"].to_pylist()) == ["7", "x7"]


def test_ingest_quarantines_the_lines_that_do_not_parse(
    server: IsbreServer, rest_catalog: RestCatalog, tmp_path: Path
) -> None:
    """With --quarantine, a value that cannot take its column's type sends its line to the
    quarantine table (reason `contract`, the error naming line and column), a line that is no
    record at all goes there with reason `decode`, and the file's other lines land; a second run
    writes nothing new to either."""
    rest_catalog.create_namespace_if_not_exists("lenient")
    mixed = tmp_path / "mixed.csv"
    mixed.write_text('id,amount,note\n1,5,"a, quoted"\n2,oops,b\n3,2.5,\n4,,"multi\nline"\n')
    lines = tmp_path / "mixed.jsonl"
    lines.write_text(
        '{"id": 10, "amount": 1.5}\n{"id": "eleven", "amount": 2}\n{"id": 12, "amount": 3}\n{"id": 13, "am\n'
    )
    args = ("--table", "lenient.orders", "--types", "amount=double,id=long", "--quarantine", "lenient.bad")
    done = ingest(server, str(mixed), str(lines), *args)
    assert done.returncode == 0, done.stderr
    assert f"{mixed}: 4 rows read, 3 written, 1 quarantined" in done.stdout, done.stdout
    again = ingest(server, str(mixed), str(lines), *args)
    assert again.returncode == 0 and again.stdout.count("nothing new") == 2, again.stdout + again.stderr
    clean = rest_catalog.load_table("lenient.orders").scan().to_arrow().sort_by("id")
    assert clean["id"].to_pylist() == [1, 3, 4, 10, 12]
    assert clean["amount"].to_pylist() == [5.0, 2.5, None, 1.5, 3.0]
    diverted = sorted(
        rest_catalog.load_table("lenient.bad").scan().to_arrow().to_pylist(),
        key=lambda row: (row["_twg_source_topic"], row["_twg_source_offset"]),
    )
    assert [(r["_twg_source_topic"], r["_twg_source_offset"], r["_twg_reason"]) for r in diverted] == [
        (str(mixed), 1, "contract"),
        (str(lines), 1, "contract"),
        (str(lines), 3, "decode"),  # not JSON at all
    ]
    assert "line 3, column 'amount'" in diverted[0]["_twg_error"]
    # The file's line, and only it: not the row number of the one-line parse that found it.
    assert f"{lines}: line 2: " in diverted[1]["_twg_error"] and " in row " not in diverted[1]["_twg_error"]
    assert diverted[0]["record"] == "2,oops,b" and '"eleven"' in diverted[1]["record"]
    coverage = http.get(f"{server.url}/v1/isbre/namespaces/lenient/tables/orders/coverage").json()
    assert coverage["rows"] == {"accepted": 5, "quarantined.contract": 2, "quarantined.decode": 1}  # once


def test_an_empty_file_is_no_rows_in_every_run(
    server: IsbreServer, rest_catalog: RestCatalog, tmp_path: Path
) -> None:
    rows = tmp_path / "rows.csv"
    rows.write_text("id\n1\n2\n")
    empties = [tmp_path / name for name in ("empty.csv", "empty.jsonl", "empty.parquet")]
    for empty in empties:
        empty.write_bytes(b"")
    for quarantine in ([], ["--quarantine", "files.empty_refused"]):
        for run in range(2):
            done = ingest(server, str(rows), *map(str, empties), "--table", "files.empty", *quarantine)
            assert done.returncode == 0, (run, done.stderr)
    assert rest_catalog.load_table("files.empty").scan().to_arrow().num_rows == 2


def test_files_without_rows_say_that_they_created_no_table(
    server: IsbreServer, rest_catalog: RestCatalog, tmp_path: Path
) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    done = ingest(server, str(empty), "--table", "files.never")
    assert done.returncode == 0, done.stderr
    assert "files.never: no rows in 1 file(s): the table was not created" in done.stdout, done.stdout
    assert not rest_catalog.table_exists("files.never")


def test_a_row_that_is_no_record_goes_to_the_quarantine_or_names_its_line(
    server: IsbreServer, rest_catalog: RestCatalog, tmp_path: Path
) -> None:
    """A CSV row of more fields than the header: with --quarantine it goes there (reason
    `decode`, its line) and the run goes on; without, the file is refused naming the line."""
    rows = tmp_path / "five.csv"
    rows.write_text("id,amount,note,x\n1,2,a,b\n2,3,b,c,EXTRA\n3,4,c,d\n")
    done = ingest(server, str(rows), "--table", "files.five", "--quarantine", "files.five_bad")
    assert done.returncode == 0, done.stderr
    assert f"{rows}: 3 rows read, 2 written, 1 quarantined" in done.stdout, done.stdout
    (diverted,) = rest_catalog.load_table("files.five_bad").scan().to_arrow().to_pylist()
    assert (diverted["_twg_reason"], diverted["_twg_source_offset"], diverted["record"]) == (
        "decode",
        1,
        "2,3,b,c,EXTRA",
    )
    assert "line 3" in diverted["_twg_error"]
    refused = ingest(server, str(rows), "--table", "files.five_strict")
    assert refused.returncode == 1
    assert f"isbre ingest: {rows}: line 3: Expected 4 columns, got 5" in refused.stderr, refused.stderr
