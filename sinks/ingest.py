"""`isbre ingest`: load files into a table through the Iceberg sink, exactly once per row."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyiceberg.catalog import Catalog, load_catalog
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sinks.contract import SinkError
from sinks.files import expand, file_format, read_file, row_count
from sinks.iceberg import TableWriter


def open_catalog(uri: str | None, warehouse: Path | None, credential: str | None) -> Catalog:
    if warehouse is not None:
        return load_catalog(
            "isbre", **{"py-catalog-impl": "catalog.embedded.LmdbCatalog", "warehouse": str(warehouse)}
        )
    properties = {"type": "rest", "uri": uri or "http://127.0.0.1:8181"}
    if credential:
        properties["credential"] = credential
    return load_catalog("isbre", **properties)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", help="files or globs (Parquet, CSV, JSON lines)")
    parser.add_argument("--table", required=True, help="target table, as ns.table (created if absent)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--uri", help="isbre (or any Iceberg REST catalog) URL (default http://127.0.0.1:8181)"
    )
    where.add_argument("--warehouse", type=Path, help="an isbre warehouse directory, opened in-process")
    parser.add_argument("--credential", help="client_id:client_secret for the catalog's token endpoint")
    parser.add_argument("--source-id", default="files", help="source id recorded with the offsets")
    parser.add_argument("--format", choices=("parquet", "csv", "json"), help="instead of the file suffix")
    parser.add_argument("--batch-size", type=int, default=65_536, help="rows per batch read")
    parser.add_argument("--prefix", default="_twg_", help="metadata column prefix (for a new table)")
    parser.add_argument("--widen", action="store_true", help="promote column types losslessly on drift")
    parser.add_argument("--to-json", action="store_true", help="nested values into string columns as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        files = expand(args.files)
        catalog = open_catalog(args.uri, args.warehouse, args.credential)
        namespace = tuple(args.table.split(".")[:-1])
        if not namespace:
            raise SinkError(f"--table needs a namespace: {args.table!r}")
        catalog.create_namespace_if_not_exists(namespace)
        writer = TableWriter(catalog, args.table, prefix=args.prefix, widen=args.widen, to_json=args.to_json)
    except (SinkError, ValueError) as e:
        print(f"isbre ingest: {e}", file=sys.stderr)
        return 2
    total_read = total_written = 0
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, transient=True) as progress:
            for path in files:
                fmt = file_format(path, args.format)
                task = progress.add_task(path.name, total=row_count(path, fmt))
                read = written = 0
                span = None
                for item in read_file(path, args.source_id, fmt, args.batch_size):
                    written += writer.add(item.batch, item.span)
                    read += item.batch.num_rows
                    span = item.span
                    progress.advance(task, item.batch.num_rows)
                info = writer.commit()
                progress.remove_task(task)
                where = "nothing new" if info.snapshot_id is None else f"snapshot {info.snapshot_id}"
                if info.commit_seq is not None:
                    where += f", commit_seq {info.commit_seq}"
                last = span.end if span else 0
                print(f"{path}: {read} rows read, {written} written, offsets [0, {last}): {where}")
                total_read += read
                total_written += written
    except SinkError as e:
        print(f"isbre ingest: {e}", file=sys.stderr)
        return 1
    finally:
        writer.close()
    print(f"{args.table}: {total_written} of {total_read} rows written from {len(files)} file(s)")
    return 0
