"""The `isbre` command."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import uvicorn

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="isbre", description="An embedded Apache Iceberg REST catalog.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the Iceberg REST API over an embedded LMDB warehouse")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8181)")
    serve.add_argument("--warehouse", type=Path, help="warehouse directory (default ./warehouse)")
    serve.add_argument("--config", type=Path, help="TOML settings file")
    serve.set_defaults(handler=_serve)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
