"""`isbre ingest`: load files into a table through the Iceberg sink, exactly once per row."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import pyarrow as pa
import requests
from isbre.sinks.contract import CommitInfo, OffsetSpan, SinkError
from isbre.sinks.files import (
    UnparsableError,
    expand,
    file_format,
    read_file,
    read_sorted,
    row_count,
    run_types,
)
from isbre.sinks.table_writer import TableWriter
from pydantic import TypeAdapter
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import ForbiddenError, NoSuchTableError
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, NestedField
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

DEFAULT_URI = "http://127.0.0.1:8181"


def open_catalog(
    uri: str | None, warehouse: Path | None, token: str | None = None, credential: str | None = None
) -> Catalog:
    if warehouse is not None:
        return load_catalog(
            "isbre", **{"py-catalog-impl": "isbre.catalog.embedded.LmdbCatalog", "warehouse": str(warehouse)}
        )
    uri = uri or DEFAULT_URI
    properties = {"type": "rest", "uri": uri}
    token = token or os.environ.get("ISBRE_TOKEN")
    credential = credential or os.environ.get("ISBRE_CREDENTIAL")
    if credential:
        properties["credential"] = credential
        properties["oauth2-server-uri"] = f"{uri.rstrip('/')}/v1/oauth/tokens"
    elif token:
        properties["token"] = token
    return load_catalog("isbre", **properties)


def column_types(catalog: Catalog, table: str, prefix: str, named: str | None) -> pa.Schema | None:
    """Types to parse untyped files with: the existing table's columns, then those `--types` names."""
    fields: dict[str, pa.Field] = {}
    try:
        schema = catalog.load_table(table).schema().as_arrow()
    except NoSuchTableError:
        schema = pa.schema([])
    for field in schema:
        if not field.name.startswith(prefix):
            fields[field.name] = pa.field(field.name, field.type)
    for name, kind in parse_types(named):
        fields[name] = pa.field(name, kind)
    return pa.schema(list(fields.values())) if fields else None


def parse_types(named: str | None) -> list[tuple[str, pa.DataType]]:
    """`--types "id=long,amount=decimal(10,2),at=timestamptz"`: Iceberg type names, as Arrow types."""
    found = []
    for item in re.split(r",(?![^(]*\))", named or ""):
        if not item.strip():
            continue
        name, equals, kind = item.partition("=")
        if not equals:
            raise SinkError(f"--types: {item!r} is not name=type")
        try:
            iceberg = TypeAdapter(IcebergType).validate_python(kind.strip())
        except ValueError:
            raise SinkError(f"--types: unknown type {kind.strip()!r} for {name.strip()!r}") from None
        field = NestedField(1, name.strip(), iceberg, required=False)
        found.append((field.name, Schema(field).as_arrow().field(0).type))
    return found


def run(args: argparse.Namespace) -> int:
    try:
        files = expand(args.files)
        namespace = tuple(args.table.split(".")[:-1])
        if not namespace:  # before anything is asked of the server
            raise SinkError(f"--table needs a namespace: {args.table!r}")
        catalog = open_catalog(args.url, args.warehouse, args.token, args.credential)
        _ensure_namespace(catalog, namespace)
        types = run_types(files, args.format, column_types(catalog, args.table, args.prefix, args.types))
        writer = TableWriter(
            catalog,
            args.table,
            prefix=args.prefix,
            metadata_policy=args.metadata_policy,
            widen=args.widen,
            to_json=args.to_json,
        )
        quarantine = _quarantine(catalog, args) if args.quarantine else None
    except (SinkError, ValueError) as e:
        print(f"isbre ingest: {e}", file=sys.stderr)
        return 2
    except requests.ConnectionError:  # PyIceberg's REST client speaks through requests
        print(f"isbre ingest: cannot reach {args.url or DEFAULT_URI}", file=sys.stderr)
        return 1
    total_read = total_written = 0
    refused: list[Path] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, transient=True) as progress:
            for path in files:
                task = progress.add_task(path.name, total=None)
                try:
                    read, written, report = _ingest_file(
                        writer, quarantine, path, args, types, progress, task
                    )
                except SinkError as e:
                    writer.abort()  # nothing of a refused file is committed; the next file starts clean
                    if quarantine is not None:
                        quarantine.abort()
                    # Every refusal names its file, as those found reading it do.
                    named = str(e) if str(e).startswith(f"{path}:") else f"{path}: {e}"
                    print(f"isbre ingest: {named}", file=sys.stderr)
                    refused.append(path)
                    continue
                finally:
                    progress.remove_task(task)
                print(report)
                total_read += read
                total_written += written
    finally:
        writer.close()
        if quarantine is not None:
            quarantine.close()
    done = len(files) - len(refused)
    if total_read == 0 and not refused and writer.existing() is None:
        # A new table takes its columns from the first rows written: with none, there is none.
        print(f"{args.table}: no rows in {done} file(s): the table was not created")
    else:
        print(f"{args.table}: {total_written} of {total_read} rows written from {done} file(s)")
    if refused:
        print(
            f"isbre ingest: {len(refused)} file(s) refused: {', '.join(map(str, refused))}", file=sys.stderr
        )
        return 1
    return 0


def _ensure_namespace(catalog: Catalog, namespace: tuple[str, ...]) -> None:
    """Create the namespace where it is missing, saying so when the caller may not."""
    if catalog.namespace_exists(namespace):  # a writer may ingest there; creating needs an admin
        return
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except ForbiddenError as exc:
        raise SinkError(
            f"namespace {'.'.join(namespace)!r} does not exist, and creating it was refused ({exc}): "
            "creating a namespace needs the admin role; ingesting into an existing one, the writer role"
        ) from exc


def _quarantine(catalog: Catalog, args: argparse.Namespace) -> TableWriter:
    """The writer of `--quarantine`: records as text, with `<prefix>reason` and `<prefix>error`."""
    namespace = tuple(args.quarantine.split(".")[:-1])
    if not namespace:
        raise SinkError(f"--quarantine needs a namespace: {args.quarantine!r}")
    _ensure_namespace(catalog, namespace)
    quarantine = TableWriter(
        catalog, args.quarantine, prefix=args.prefix, metadata_policy=args.metadata_policy
    )
    quarantine.quality_columns = (args.prefix + "reason", args.prefix + "error")
    return quarantine


def _ingest_file(
    writer: TableWriter,
    quarantine: TableWriter | None,
    path: Path,
    args: argparse.Namespace,
    types: pa.Schema | None,
    progress: Progress,
    task: TaskID,
) -> tuple[int, int, str]:
    fmt = file_format(path, args.format)
    if path.stat().st_size == 0:  # no header, no rows: nothing to read in any format
        return 0, 0, f"{path}: empty, 0 rows"
    progress.update(task, total=row_count(path, fmt))
    read = written = 0
    span = None
    try:
        for item in read_file(path, args.source_id, fmt, args.batch_size, types):
            written += writer.add(item.batch, item.span)
            read += item.batch.num_rows
            span = item.span
            progress.advance(task, item.batch.num_rows)
    except UnparsableError:
        if quarantine is None:
            raise
        writer.abort()  # read again, record by record, with the records that do not parse set apart
        return _ingest_sorted(writer, quarantine, path, fmt, args, types)
    info = writer.commit()
    last = span.end if span else 0
    return read, written, f"{path}: {read} rows read, {written} written, offsets [0, {last}): {_where(info)}"


def _where(info: CommitInfo) -> str:
    where = "nothing new" if info.snapshot_id is None else f"snapshot {info.snapshot_id}"
    if info.commit_seq is not None:
        where += f", commit_seq {info.commit_seq}"
    return where


def _ingest_sorted(
    writer: TableWriter,
    quarantine: TableWriter,
    path: Path,
    fmt: str,
    args: argparse.Namespace,
    types: pa.Schema | None,
) -> tuple[int, int, str]:
    """The file's records that parse into the table and the others into the quarantine, over one
    span: each table covers all of it, so a second run writes nothing to either."""
    found = read_sorted(path, fmt, types)
    span = OffsetSpan(args.source_id, str(path), 0, 0, found.records)
    refused = found.refused
    diverted = pa.RecordBatch.from_arrays(
        [refused["record"], refused["reason"], refused["error"]],
        names=["record", args.prefix + "reason", args.prefix + "error"],
    )
    quarantined = quarantine.add(diverted, span, None, found.refused_offsets)
    # Counted by the table, as a sink's diverted rows are, once (catalog/sink_rows.py).
    fresh = writer.fresh(span, found.refused_offsets)
    for reason, new in zip(refused["reason"].to_pylist(), fresh, strict=True):
        writer.rows[f"quarantined.{reason}"] += int(new)
    written = 0
    if found.parsed.num_rows:
        written = writer.add(found.parsed.combine_chunks().to_batches()[0], span, None, found.offsets)
    quarantine.commit()  # first: once the table covers the span, the quarantine does too
    info = writer.commit()
    return (
        found.records,
        written,
        f"{path}: {found.records} rows read, {written} written, {quarantined} quarantined, "
        f"offsets [0, {found.records}): {_where(info)}",
    )
