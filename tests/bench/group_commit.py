"""How commits group across a server's workers: 64 writers, each committing set-properties to its
own table, against one server with one worker and with two (their commits in one group, with and
without `commit_wait_ms`, and each worker grouping its own: `shared_commits = false`), beside
PyIceberg's SqlCatalog on SQLite with its writers in as many processes.

Reported: commits per second; commits per store write transaction (the writers' batches, from
`isbre_commit_batches_total` and `isbre_commit_mutations_total`, summed over the workers and the
supervisor); and sync system calls (fsync, fdatasync, msync, sync_file_range, syncfs) per commit
over every thread of every process of the server, counted by strace where it is installed. Tracing
slows the server, so the calls are counted in a run of their own after the timed ones. And what
the way to the store costs a writer alone: the median time of one commit of a single writer
committing one after another.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from functools import partial
from pathlib import Path

import psutil
from pyiceberg.catalog.sql import SqlCatalog

from tests.bench.commits import isbre_latency_ms, writer_counters
from tests.bench.harness import RUNS, Report, median_of
from tests.bench.workers import isbre_rate, isbre_run, prepare, sql_rate
from tests.server import IsbreServer

WRITERS = 64
COMMITS_TOTAL = 1280
LONE_COMMITS = 200  # one writer's commits one after another: what the way to the store costs it
SYNC_CALLS = "fsync,fdatasync,msync,sync_file_range,syncfs"


def _threads_of(pid: int) -> list[int]:
    """Every thread of the process `pid` and of its descendants."""
    found = []
    for process in (psutil.Process(pid), *psutil.Process(pid).children(recursive=True)):
        try:
            found += [thread.id for thread in process.threads()]
        except psutil.NoSuchProcess:
            continue
    return found


def _traced_syncs(server: IsbreServer, per_writer: int, workdir: Path) -> tuple[dict[str, int], int]:
    """(sync calls by system call, commits) of one run of the writers with strace attached to
    the server."""
    summary = workdir / f"strace-{server.port}.txt"
    attach = [arg for tid in _threads_of(server.pid) for arg in ("-p", str(tid))]
    tracer = subprocess.Popen(
        ["strace", "-qq", "-f", "-c", "-e", f"trace={SYNC_CALLS}", "-o", str(summary), *attach],
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached to every thread
    try:
        isbre_run(server, WRITERS, per_writer)
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=60)
    # strace -c's table: % time, seconds, usecs/call, calls, errors (often blank), syscall.
    calls = {}
    for line in summary.read_text().splitlines():
        fields = line.split()
        if fields and fields[-1] in SYNC_CALLS.split(","):
            calls[fields[-1]] = int(fields[3])
    return calls, WRITERS * per_writer


def run(workdir: Path) -> Report:
    per_writer = COMMITS_TOTAL // WRITERS
    traced = shutil.which("strace") is not None
    report = Report(
        f"{WRITERS} writers on their own tables (set-properties, clients in processes), median of "
        f"{RUNS} runs of {COMMITS_TOTAL} commits; sync calls per commit "
        + ("counted by strace in one more run" if traced else "not counted (no strace)"),
        [
            "server",
            "commits/s",
            "vs SqlCatalog",
            "commits per store transaction",
            "sync calls per commit",
            f"a writer alone, ms per commit (median of {LONE_COMMITS})",
        ],
    )
    servers = {
        "isbre, 1 worker": IsbreServer(workdir / "group-1", workers=1),
        "isbre, 2 workers, each its own group": IsbreServer(
            workdir / "group-2-own", workers=2, env={"ISBRE_SHARED_COMMITS": "false"}
        ),
        "isbre, 2 workers, one group": IsbreServer(workdir / "group-2", workers=2),
        "isbre, 2 workers, one group, commit_wait_ms = 20": IsbreServer(
            workdir / "group-2-wait", workers=2, env={"ISBRE_COMMIT_WAIT_MS": "20"}
        ),
    }
    sql_dir = workdir / "group-sql"
    sql_dir.mkdir()
    uri, warehouse = f"sqlite:///{sql_dir / 'catalog.db'}", sql_dir.as_uri()
    SqlCatalog("bench", uri=uri, warehouse=warehouse).create_namespace("bench")
    try:
        sql = median_of(RUNS, partial(sql_rate, uri, warehouse, WRITERS, per_writer))
        for label, server in servers.items():
            prepare(server.start())
            batches, mutations = writer_counters(server)
            rate = median_of(RUNS, partial(isbre_rate, server, WRITERS, per_writer))
            batches_after, mutations_after = writer_counters(server)
            grouped = (mutations_after - mutations) / max(1.0, batches_after - batches)
            syncs = "—"
            if traced:
                calls, commits = _traced_syncs(server, per_writer, workdir)
                each = ", ".join(f"{name} {n / commits:.2f}" for name, n in sorted(calls.items()))
                syncs = f"{sum(calls.values()) / commits:.2f} ({each})"
            lone = f"{median_of(RUNS, partial(isbre_latency_ms, server, LONE_COMMITS)):.2f}"
            report.add(label, rate, f"{rate / sql:.2f}", f"{grouped:.1f}", syncs, lone)
            server.stop()
        report.add("SqlCatalog (SQLite)", sql, "1.00", "", "", "")
    finally:
        for server in servers.values():
            server.stop()
    return report
