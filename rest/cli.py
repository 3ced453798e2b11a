"""The `isbre` command."""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import resource
import sys
from pathlib import Path

import httpx
import uvicorn

from catalog import CatalogService
from events.client import EventStreamError, subscribe
from lineage.config import build_client
from lineage.mapping import LineageMapper, group_runs
from rest.app import create_app, lineage_names
from rest.connections import guarded_protocol
from rest.settings import load_settings
from sinks.ingest import add_arguments as add_ingest_arguments
from sinks.ingest import run as run_ingest


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _serve(args: argparse.Namespace) -> int:
    settings = load_settings(args.config, host=args.host, port=args.port, warehouse=args.warehouse)
    if not settings.auth.enabled and not settings.allow_insecure_bind and not _is_loopback(settings.host):
        print(
            f"isbre serve: refusing to serve {settings.host} with authentication off; enable [auth] "
            "or set allow_insecure_bind = true (for example behind an authenticating proxy)",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    _raise_open_files_limit()
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
        http=guarded_protocol(settings.max_header_kb << 10, settings.header_timeout_seconds),
        timeout_keep_alive=settings.keepalive_timeout_seconds,
    )
    return 0


def _raise_open_files_limit() -> None:
    """One descriptor per connection: take all the system allows, not the usual soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logging.getLogger("isbre").info("open files limit: %s (was %s)", hard, soft)


def _tail(args: argparse.Namespace) -> int:
    events = subscribe(
        args.url, after=args.after, tables=args.table, namespace=args.namespace, kinds=args.kind
    )
    try:
        for event in events:
            print(json.dumps(event.record, separators=(",", ":")), flush=True)
    except KeyboardInterrupt:
        return 0
    except EventStreamError as exc:
        print(f"isbre events tail: {exc}", file=sys.stderr)
        return 1
    return 0


def _lineage_status(args: argparse.Namespace) -> int:
    response = httpx.get(f"{args.url.rstrip('/')}/v1/lineage/status", timeout=10)
    response.raise_for_status()
    print(json.dumps(response.json(), indent=2))
    return 0


def _lineage_replay(args: argparse.Namespace) -> int:
    """Send the lineage of commits --from..--to again, e.g. to backfill a new receiver."""
    settings = load_settings(args.config, warehouse=args.warehouse)
    client = build_client(settings.lineage_url, settings.lineage_api_key, settings.lineage_transport)
    if client is None:
        print("isbre lineage replay: no OpenLineage transport is configured", file=sys.stderr)
        return 1
    service = CatalogService.open(settings.warehouse)
    try:
        mapper = LineageMapper(lineage_names(settings), service.table_metadata_or_none)
        sent = 0
        records = [
            r for r in service.records(after=args.from_seq - 1) if args.to is None or r.commit_seq <= args.to
        ]
        for run in group_runs(records):
            for event in mapper.run_events(run):
                client.emit(event)
                sent += 1
    finally:
        service.close()
    last = records[-1].commit_seq if records else args.from_seq
    print(f"sent {sent} events for commits {args.from_seq}..{last}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="isbre", description="An embedded Apache Iceberg REST catalog.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the Iceberg REST API over an embedded LMDB warehouse")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8181)")
    serve.add_argument("--warehouse", type=Path, help="warehouse directory (default ./warehouse)")
    serve.add_argument("--config", type=Path, help="TOML settings file")
    serve.set_defaults(handler=_serve)

    events = commands.add_parser("events", help="commit events").add_subparsers(dest="events", required=True)
    tail = events.add_parser("tail", help="print commit events as JSON lines until interrupted")
    tail.add_argument("--url", default="http://127.0.0.1:8181", help="isbre server (default %(default)s)")
    tail.add_argument("--after", type=int, help="start after this commit_seq (default: from now)")
    tail.add_argument(
        "--table", action="append", default=[], help="only this table, as ns.table (repeatable)"
    )
    tail.add_argument("--namespace", help="only this namespace and those under it")
    tail.add_argument(
        "--kind", action="append", default=[], help="only this kind, e.g. table.commit (repeatable)"
    )
    tail.set_defaults(handler=_tail)

    lineage = commands.add_parser("lineage", help="OpenLineage delivery").add_subparsers(
        dest="lineage", required=True
    )
    status = lineage.add_parser("status", help="print the lineage outbox's state")
    status.add_argument("--url", default="http://127.0.0.1:8181", help="isbre server (default %(default)s)")
    status.set_defaults(handler=_lineage_status)
    replay = lineage.add_parser("replay", help="send the lineage of past commits again")
    replay.add_argument("--from", dest="from_seq", type=int, required=True, help="first commit_seq to send")
    replay.add_argument("--to", type=int, help="last commit_seq to send (default: the newest)")
    replay.add_argument("--warehouse", type=Path, help="warehouse directory (default ./warehouse)")
    replay.add_argument("--config", type=Path, help="TOML settings file (for the lineage transport)")
    replay.set_defaults(handler=_lineage_replay)

    ingest = commands.add_parser("ingest", help="load Parquet, CSV or JSON-lines files into a table, once")
    add_ingest_arguments(ingest)
    ingest.set_defaults(handler=run_ingest)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
