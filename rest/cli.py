"""The `isbre` command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import uvicorn

from events.client import EventStreamError, subscribe
from rest.app import create_app
from rest.settings import load_settings


def _serve(args: argparse.Namespace) -> int:
    settings = load_settings(args.config, host=args.host, port=args.port, warehouse=args.warehouse)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
    )
    return 0


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
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
