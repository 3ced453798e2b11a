"""`make bench`: isbre's figures side by side with a peer measured in the same run.

`python -m tests.bench` runs every benchmark; `python -m tests.bench NAME...` the ones named;
`--list` names them.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path

from tests.bench import (
    carried,
    commit_cpu,
    commits,
    console,
    events,
    feeds,
    group_commit,
    hot_table,
    lineage,
    load_table,
    maintenance,
    object_storage,
    own_commits,
    pipelines,
    planning,
    relays,
    replicas,
    request_cpu,
    signing,
    sinks,
    startup,
    upserts,
    workers,
)
from tests.bench.harness import Report

# In the order `make bench` runs them; each returns one report or several.
BENCHMARKS: dict[str, tuple[Callable[[Path], Report | list[Report]], str]] = {
    "startup": (startup.run, "seconds until a server answers, beside a minimal FastAPI app"),
    "commit_cpu": (
        commit_cpu.run,
        "server CPU per commit and loadTable beside SqlCatalog, LMDB and PostgreSQL",
    ),
    "commits": (commits.run, "set-properties commits beside SqlCatalog on SQLite"),
    "object_storage": (object_storage.run, "commits on an S3 warehouse (moto) beside local disk"),
    "signing": (signing.run, "the remote signer beside botocore signing in process"),
    "load_table": (load_table.run, "loadTable requests per second and latency"),
    "planning": (planning.run, "server-side scan plans beside PyIceberg's local ones; plans from a cursor"),
    "request_cpu": (request_cpu.run, "server CPU per read request beside an ASGI app and FastAPI; idle CPU"),
    "hot_table": (hot_table.run, "1 to 16 writer processes appending to one table, beside SqlCatalog"),
    "own_commits": (
        own_commits.run,
        "compaction and a rebased append, CPU, beside PyIceberg's own rewrite and a plain append",
    ),
    "workers": (workers.run, "clients in processes, 1 worker and N workers"),
    "group_commit": (
        group_commit.run,
        "64 writers on own tables, 1 and 2 workers: commits per store transaction, syncs per commit",
    ),
    "replicas": (replicas.run, "replicas on PostgreSQL beside SqlCatalog on PostgreSQL"),
    "maintenance": (
        maintenance.run,
        "a streaming table's appends with maintenance on and off, beside SqlCatalog",
    ),
    "events": (events.run, "commit-to-event latency, replay, commits with subscribers"),
    "feeds": (feeds.run, "commit to rows in a TableFeed's hands, beside a polling reader; idle CPU"),
    "carried": (
        carried.run,
        "copy-on-write deletes to a change feed: the catalog or the reader nets",
    ),
    "pipelines": (pipelines.run, "a table-to-table hop beside a plain sink, rows per second"),
    "lineage": (lineage.run, "commits with lineage delivery on"),
    "relays": (relays.run, "commit to message in JetStream; commits with a NATS and a webhook relay on"),
    "sinks": (sinks.run, "sink rows per second and batches"),
    "upserts": (upserts.run, "a keyed sink's upserts beside PyIceberg's table.upsert and plain appends"),
    "hot_upserts": (upserts.hot_run, "a keyed table under back-to-back upserts, the catalog compacting it"),
    "console": (console.run, "the console's live feed in Chromium at 200 commits/s"),
}


def main(argv: list[str] | None = None) -> None:
    named = "\n".join(f"  {name:15} {what}" for name, (_, what) in BENCHMARKS.items())
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench",
        description=__doc__.splitlines()[0],
        epilog=f"benchmarks:\n{named}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    parser.add_argument("--list", action="store_true", help="name the benchmarks and stop")
    arguments = parser.parse_args(argv)
    if arguments.list:
        for name, (_, what) in BENCHMARKS.items():
            print(f"{name:15} {what}")
        return
    unknown = [name for name in arguments.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"no benchmark named {', '.join(unknown)} (--list names them)")
    chosen = arguments.names or list(BENCHMARKS)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"# isbre benchmarks on {machine}", end="\n\n")
    reports: list[Report] = []
    with tempfile.TemporaryDirectory(prefix="isbre-bench-") as workdir:
        for name in chosen:
            own = Path(workdir) / name  # each its own: several name their files alike
            own.mkdir()
            found = BENCHMARKS[name][0](own)
            reports += found if isinstance(found, list) else [found]
    print()
    for report in reports:
        print(report.markdown(), end="\n\n")


if __name__ == "__main__":
    main()
