"""The options of `isbre ingest`, apart from the code that runs it: the command line reads them
without importing PyIceberg and PyArrow."""

from __future__ import annotations

import argparse
from pathlib import Path

from isbre.sinks.policies import DEFAULT_POLICY, POLICIES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", help="files or globs (Parquet, CSV, JSON lines)")
    parser.add_argument("--table", required=True, help="target table, as ns.table (created if absent)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--url",
        "--uri",
        dest="url",
        help="isbre (or any Iceberg REST catalog) URL (default: http://HOST:PORT from $ISBRE_HOST / "
        "$ISBRE_PORT, else --config's host and port, else http://127.0.0.1:8181)",
    )
    where.add_argument("--warehouse", type=Path, help="an isbre warehouse directory, opened in-process")
    parser.add_argument("--config", type=Path, help="the server's TOML settings file, for its host and port")
    parser.add_argument("--source-id", default="files", help="source id recorded with the offsets")
    parser.add_argument("--format", choices=("parquet", "csv", "json"), help="instead of the file suffix")
    parser.add_argument("--batch-size", type=int, default=65_536, help="rows per batch read")
    parser.add_argument("--prefix", default="_twg_", help="metadata column prefix (for a new table)")
    parser.add_argument(
        "--metadata-policy",
        choices=tuple(POLICIES),
        help=f"the metadata columns of a new table (default {DEFAULT_POLICY}; a table keeps its own)",
    )
    parser.add_argument(
        "--types",
        help="column types for CSV and JSON, e.g. 'amount=double,at=timestamptz' (Iceberg type names); "
        "an existing table's own types are used for the columns it has",
    )
    parser.add_argument(
        "--quarantine",
        metavar="TABLE",
        help="send each record that does not parse to TABLE instead of refusing its file (reason "
        "'contract': a value that does not take its column's type; 'decode': a line that is no record)",
    )
    parser.add_argument("--widen", action="store_true", help="promote column types losslessly on drift")
    parser.add_argument("--to-json", action="store_true", help="nested values into string columns as JSON")
