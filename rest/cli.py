"""The `isbre` command.

Each subcommand imports what it needs when it runs, so that `isbre --help`,
`--version` and `isbre events tail` start in a fraction of a second. Ordinary
mistakes (a bad setting, a server that is not there, refused credentials) are
one line on stderr and a non-zero exit; `--debug` shows the traceback too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from isbre.rest.refusals import RefusedError

# Where a server listens when nothing says otherwise (rest/settings.py's defaults, kept here so
# that the client commands start without loading the settings model).
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8181
URL_HELP = (
    "the isbre server (default: http://HOST:PORT from $ISBRE_HOST / $ISBRE_PORT, else --config's "
    "host and port, else http://127.0.0.1:8181); --uri is the same"
)
CREDENTIALS_HELP = (
    "(default: $ISBRE_TOKEN / $ISBRE_CREDENTIAL; prefer the environment: options are visible to "
    "other users in the process list)"
)

STORE_HELP = (
    "the store: an LMDB directory (default: isbre.lmdb in a local warehouse, else ./isbre.lmdb), or "
    "postgresql://… shared by several servers (prefer ISBRE_STORE: options are visible to other users)"
)


def server_url(config: Path | None = None) -> str:
    """The URL of the server these settings start: the environment's host and port first, then
    the TOML file's, as `isbre serve` reads them; a wildcard address is reached on loopback."""
    import tomllib

    found: dict[str, Any] = {}
    if config is not None:
        if not config.is_file():
            raise FileNotFoundError(f"config file not found: {config}")
        found = tomllib.loads(config.read_text())
    host = os.environ.get("ISBRE_HOST") or str(found.get("host") or DEFAULT_HOST)
    port = os.environ.get("ISBRE_PORT") or str(found.get("port") or DEFAULT_PORT)
    if host in ("0.0.0.0", "::", ""):
        host = DEFAULT_HOST
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def _with_url(args: argparse.Namespace) -> None:
    if args.url is None:
        args.url = server_url(args.config)


def _serve(args: argparse.Namespace) -> int:
    from isbre.rest.settings import load_settings

    flags = {"host": args.host, "port": args.port, "warehouse": args.warehouse, "store": args.store}
    settings = load_settings(args.config, workers=args.workers, **flags)
    # The server's whole stack loads only once its settings are known to be good: a mistake in
    # them is a one-line answer at once.
    from isbre.rest.serve import serve

    serve(settings)
    return 0


def _tail(args: argparse.Namespace) -> int:
    from isbre.events.client import subscribe

    _with_url(args)

    def retrying(error: Exception, delay: float) -> None:
        print(f"{args.prog}: {describe(error, args.url)}; retrying in {delay:g} s", file=sys.stderr)

    def connected(cursor: int) -> None:
        print(f"{args.prog}: connected to {args.url}, events after commit_seq {cursor}", file=sys.stderr)

    events = subscribe(
        args.url,
        after=args.after,
        tables=args.table,
        namespace=args.namespace,
        kinds=args.kind,
        token=args.token,
        credential=args.credential,
        on_retry=retrying,
        on_connect=connected,
    )
    for event in events:
        print(json.dumps(event.record, separators=(",", ":")), flush=True)
    return 0


def _table_tail(args: argparse.Namespace) -> int:
    from isbre.events.table_feed import BEFORE_ANY_COMMIT, TableFeed

    _with_url(args)
    credentials = {"token": args.token, "credential": args.credential}
    feed = TableFeed(
        args.url,
        args.table,
        args.consumer,
        from_start=args.from_start,
        on_expired=args.on_expired,
        changes=args.changes,
        row_filter=args.row_filter,
        **credentials,
    )
    where = (
        "as it is, then each new one"
        if feed.position == BEFORE_ANY_COMMIT
        else f"after commit_seq {feed.position}"
    )
    what = "changes" if args.changes else "rows"
    print(f"{args.prog}: connected to {args.url}, {what} of {args.table} {where}", file=sys.stderr)
    header = True
    with feed:
        for rows in feed:
            for row in rows.to_pylist():
                if args.format == "table":
                    if header:
                        print("\t".join(row), flush=True)
                        header = False
                    print("\t".join(str(value) for value in row.values()), flush=True)
                else:
                    print(json.dumps(row, default=str, separators=(",", ":")), flush=True)
            if args.consumer is not None:
                feed.commit()
    return 0


def _lineage_status(args: argparse.Namespace) -> int:
    import httpx
    from isbre.events.client import Credentials

    _with_url(args)
    credentials = Credentials(args.token, args.credential)
    url = args.url.rstrip("/")
    with httpx.Client(timeout=10) as client:
        if credentials.needs_token():
            credentials.accept(client.post(**credentials.token_request(url)))
        response = client.get(f"{url}/v1/lineage/status", headers=credentials.headers())
    if response.status_code >= 400:
        raise RefusedError(f"{response.status_code}: {_error_message(response)}")
    print(json.dumps(response.json(), indent=2))
    return 0


def _lineage_replay(args: argparse.Namespace) -> int:
    """Send the lineage of commits --from..--to again, e.g. to backfill a new receiver."""
    from functools import partial

    from isbre.catalog.warehouses import open_warehouses, read_metadata
    from isbre.lineage.config import build_client
    from isbre.lineage.mapping import LineageMapper, group_runs
    from isbre.rest.settings import load_settings, warehouses
    from isbre.rest.startup import lineage_names

    settings = load_settings(args.config, warehouse=args.warehouse, store=args.store)
    client = build_client(settings.lineage_url, settings.lineage_api_key, settings.lineage_transport)
    if client is None:
        raise RefusedError("no OpenLineage transport is configured")
    services = open_warehouses(settings.store_location(), warehouses(settings))
    service = services[0]
    try:
        mapper = LineageMapper(lineage_names(settings), partial(read_metadata, services))
        sent = 0
        records = [
            r
            for r in service.core.commit_log.records(after=args.from_seq - 1)
            if args.to is None or r.commit_seq <= args.to
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


def _store_migrate(args: argparse.Namespace) -> int:
    """Bring a PostgreSQL store's schema up to date (servers also do it when they start)."""
    from isbre.catalog.postgres.schema import SCHEMA_VERSION
    from isbre.catalog.postgres.store import PostgresStore
    from isbre.rest.settings import load_settings

    settings = load_settings(args.config, store=args.store)
    if not settings.shares_store():
        raise RefusedError("the store is LMDB, which has no schema to migrate: pass --store postgresql://…")
    store = PostgresStore(settings.store_location(), migrate=False)
    try:
        before = store.schema_version()
        store.migrate()
    finally:
        store.close()
    if before == SCHEMA_VERSION:
        print(f"{store.url}: schema {SCHEMA_VERSION}, up to date")
    else:
        print(f"{store.url}: schema {before or 'none'} -> {SCHEMA_VERSION}")
    return 0


def _store_copy(args: argparse.Namespace) -> int:
    """Copy an LMDB catalog (pointers, the log with its commit_seqs, coverage, cursors, keys) into an
    empty PostgreSQL store."""
    from isbre.catalog.lmdb_store import LmdbStore
    from isbre.catalog.postgres.store import PostgresStore
    from isbre.catalog.store_copy import load_store
    from isbre.catalog.stores import is_database_url
    from isbre.rest.serve import claim_state

    source = Path(args.source).resolve()
    target = args.to or os.environ.get("ISBRE_STORE")
    if not target or not is_database_url(target):
        raise RefusedError("--to (or ISBRE_STORE) must be a postgresql:// URL")
    if not (source / "data.mdb").is_file():
        raise RefusedError(f"{source} is not an LMDB store (no data.mdb)")
    holder = claim_state(source.parent)
    if holder is not None:
        raise RefusedError(f"{source} is served by process {holder}: stop that server first, then copy")
    lmdb = LmdbStore(source)
    database = PostgresStore(target, warehouses=tuple(scope for scope in lmdb.scopes() if scope))
    try:
        counts = load_store(database, lmdb.export())
        with database.read() as view:
            high = view.commit_seq()
    finally:
        lmdb.close()
        database.close()
    del counts["high_water"]
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    print(f"copied {source} into {database.url} up to commit_seq {high}: {summary or 'nothing else'}")
    return 0


def _ingest(args: argparse.Namespace) -> int:
    from isbre.sinks.ingest import run

    if args.warehouse is None:
        _with_url(args)
    return run(args)


def _error_message(response: Any) -> str:
    try:
        return response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


def describe(error: BaseException, url: str | None = None) -> str:
    """One line for an ordinary mistake."""
    import httpx
    import pydantic
    import requests

    if isinstance(error, pydantic.ValidationError):
        return "; ".join(_setting_problem(problem) for problem in error.errors())
    if isinstance(error, httpx.ConnectError):
        return f"cannot reach {url or 'the server'} ({error})"
    if isinstance(error, requests.ConnectionError):  # PyIceberg's REST client
        return f"cannot reach {url or 'the server'}"
    if isinstance(error, httpx.TransportError):
        return f"lost the connection to {url or 'the server'} ({type(error).__name__}: {error})"
    if isinstance(error, httpx.HTTPStatusError):
        return f"{error.response.status_code}: {_error_message(error.response)}"
    return str(error) or type(error).__name__


def _setting_problem(problem: Any) -> str:
    where = ".".join(str(part) for part in problem.get("loc", ()))
    if problem.get("type") == "extra_forbidden":
        return f"unknown setting {where!r}"
    return f"setting {where!r}: {problem.get('msg')} (got {problem.get('input')!r})"


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0-65535")
    return port


def _add_server(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", "--uri", dest="url", help=URL_HELP)
    parser.add_argument("--config", type=Path, help="the server's TOML settings file, for its host and port")


def _add_credentials(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token", help=f"a bearer token for a server with authentication on {CREDENTIALS_HELP}"
    )
    parser.add_argument(
        "--credential", help=f"client_id:client_secret, exchanged for tokens {CREDENTIALS_HELP}"
    )


def _version() -> str:
    try:
        return version("isbre")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="isbre", description="An embedded Apache Iceberg REST catalog.")
    parser.add_argument("--version", action="version", version=f"isbre {_version()}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve the Iceberg REST API (an embedded LMDB store, or PostgreSQL; local or S3 warehouses)",
    )
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="port to listen on (default 8181)")
    serve.add_argument(
        "--warehouse", help="the default warehouse: a directory or s3://bucket/prefix (default ./warehouse)"
    )
    serve.add_argument("--store", help=STORE_HELP)
    serve.add_argument(
        "--workers", type=int, help="server processes on the port (default: the cores, at most max_workers)"
    )
    serve.add_argument("--config", type=Path, help="TOML settings file")
    serve.set_defaults(prog=serve.prog, command_parser=serve, handler=_serve)

    events = commands.add_parser("events", help="commit events").add_subparsers(dest="events", required=True)
    tail = events.add_parser("tail", help="print commit events as JSON lines until interrupted")
    _add_server(tail)
    tail.add_argument("--after", type=int, help="start after this commit_seq (default: from now)")
    tail.add_argument(
        "--table", action="append", default=[], help="only this table, as ns.table (repeatable)"
    )
    tail.add_argument("--namespace", help="only this namespace and those under it")
    tail.add_argument(
        "--kind", action="append", default=[], help="only this kind, e.g. table.commit (repeatable)"
    )
    _add_credentials(tail)
    tail.set_defaults(prog=tail.prog, command_parser=tail, handler=_tail)

    table_tail = commands.add_parser(
        "tail", help="print a table's rows as they are appended, until interrupted"
    )
    table_tail.add_argument("table", help="namespace.table")
    _add_server(table_tail)
    table_tail.add_argument(
        "--format",
        choices=("jsonl", "table"),
        default="jsonl",
        help="one JSON object a row, or tab-separated columns",
    )
    table_tail.add_argument(
        "--consumer", help="resume from this consumer's stored cursor, and advance it after each batch"
    )
    table_tail.add_argument(
        "--from-start",
        action="store_true",
        help="a new consumer starts with the table's rows as they are, not at its next commit",
    )
    table_tail.add_argument(
        "--on-expired",
        choices=("raise", "resync"),
        default="raise",
        help="when snapshots the consumer had not read were expired: stop, saying so, or print the "
        "table's rows as they are again and go on from there",
    )
    table_tail.add_argument(
        "--changes",
        action="store_true",
        help="print each commit's inserts, deletes and updates (with _change_type and _commit_seq), "
        "not only appended rows",
    )
    table_tail.add_argument(
        "--filter",
        dest="row_filter",
        help="only the rows that match this expression, as PyIceberg's row_filter takes it "
        "(e.g. \"region = 'eu' and amount > 100\")",
    )
    _add_credentials(table_tail)
    table_tail.set_defaults(prog=table_tail.prog, command_parser=table_tail, handler=_table_tail)

    lineage = commands.add_parser("lineage", help="OpenLineage delivery").add_subparsers(
        dest="lineage", required=True
    )
    status = lineage.add_parser("status", help="print the lineage outbox's state")
    _add_server(status)
    _add_credentials(status)
    status.set_defaults(prog=status.prog, command_parser=status, handler=_lineage_status)
    replay = lineage.add_parser("replay", help="send the lineage of past commits again")
    replay.add_argument("--from", dest="from_seq", type=int, required=True, help="first commit_seq to send")
    replay.add_argument("--to", type=int, help="last commit_seq to send (default: the newest)")
    replay.add_argument("--warehouse", help="the default warehouse (default ./warehouse)")
    replay.add_argument("--store", help=STORE_HELP)
    replay.add_argument("--config", type=Path, help="TOML settings file (for the lineage transport)")
    replay.set_defaults(prog=replay.prog, command_parser=replay, handler=_lineage_replay)

    store = commands.add_parser("store", help="the catalog's store").add_subparsers(
        dest="store", required=True
    )
    migrate = store.add_parser("migrate", help="bring a PostgreSQL store's schema up to date")
    migrate.add_argument("--store", help=STORE_HELP)
    migrate.add_argument("--config", type=Path, help="TOML settings file")
    migrate.set_defaults(prog=migrate.prog, command_parser=migrate, handler=_store_migrate)
    copy = store.add_parser(
        "copy", help="copy an LMDB catalog, history and cursors included, into PostgreSQL"
    )
    copy.add_argument(
        "--from", dest="source", required=True, help="the LMDB store directory (its server stopped)"
    )
    copy.add_argument("--to", help="an empty PostgreSQL store, postgresql://… (default: $ISBRE_STORE)")
    copy.set_defaults(prog=copy.prog, command_parser=copy, handler=_store_copy)

    ingest = commands.add_parser("ingest", help="load Parquet, CSV or JSON-lines files into a table, once")
    from isbre.sinks.ingest_arguments import add_arguments

    add_arguments(ingest)
    _add_credentials(ingest)
    ingest.set_defaults(prog=ingest.prog, command_parser=ingest, handler=_ingest)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command's own parser, with its own usage
        getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        if getattr(args, "handler", None) is not _serve:  # serve checks as it loads its settings
            from isbre.rest.settings import check_environment

            # A typo (ISBRE_PORTT) must not send a client to the default server unnoticed.
            check_environment(os.environ)
        return args.handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of the output went away (`isbre events tail | head`): nothing is wrong. Python
        # flushes stdout once more at exit; pointed elsewhere, that flush fails no more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as error:
        if args.debug:
            raise
        print(f"{args.prog}: {describe(error, getattr(args, 'url', None))}", file=sys.stderr)
        # By attribute: under `python -m rest.cli` this module is __main__, another copy of its class.
        return getattr(error, "exit_code", 1)


if __name__ == "__main__":
    raise SystemExit(main())
