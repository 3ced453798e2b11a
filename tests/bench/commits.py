"""Metadata-only commit throughput: isbre over REST against PyIceberg's SqlCatalog on SQLite, in-process.

Each writer owns one table and commits `set-properties` updates to it, the
smallest commit a catalog can take. isbre's writers are threads sending the
REST commit request a client sends; SqlCatalog's writers are threads calling
`commit_table` on one in-process catalog, the same work PyIceberg does for a
`with table.transaction(): set_properties(...)` block.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from functools import partial
from pathlib import Path

import httpx
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table.update import AssertTableUUID, SetPropertiesUpdate
from pyiceberg.types import LongType, NestedField

from tests.bench.harness import RUNS, Report, median_of, timed
from tests.server import IsbreServer

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True))
SCHEMA_JSON = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}


def _run_threads(writers: int, work) -> float:
    threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]

    def go() -> None:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    return timed(go)


def isbre_rate(server: IsbreServer, writers: int, commits: int, run: str | None = None) -> float:
    """Commits per second; writer w commits to table bench.<run>_w<w>, created first."""
    run = run or f"i{uuid.uuid4().hex[:8]}"
    base = f"{server.url}/v1/isbre/namespaces/bench/tables"
    uuids = []
    for w in range(writers):
        created = httpx.post(base, json={"name": f"{run}_w{w}", "schema": SCHEMA_JSON})
        created.raise_for_status()
        uuids.append(created.json()["metadata"]["table-uuid"])

    def work(w: int) -> None:
        with httpx.Client(timeout=60) as client:
            for i in range(commits):
                body = {
                    "requirements": [{"type": "assert-table-uuid", "uuid": uuids[w]}],
                    "updates": [{"action": "set-properties", "updates": {f"k{i}": str(i)}}],
                }
                client.post(f"{base}/{run}_w{w}", json=body).raise_for_status()

    return writers * commits / _run_threads(writers, work)


def sql_rate(catalog: SqlCatalog, writers: int, commits: int) -> float:
    run = f"s{uuid.uuid4().hex[:8]}"
    tables = [catalog.create_table(("bench", f"{run}_w{w}"), schema=SCHEMA) for w in range(writers)]

    def work(w: int) -> None:
        for i in range(commits):
            table = tables[w]
            requirement = AssertTableUUID(uuid=table.metadata.table_uuid)
            response = catalog.commit_table(
                table, (requirement,), (SetPropertiesUpdate(updates={f"k{i}": str(i)}),)
            )
            table.metadata, table.metadata_location = response.metadata, response.metadata_location

    return writers * commits / _run_threads(writers, work)


def writer_counters(server: IsbreServer) -> tuple[float, float]:
    values = {}
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(("isbre_commit_batches_total ", "isbre_commit_mutations_total ")):
            name, value = line.split()
            values[name] = float(value)
    return values["isbre_commit_batches_total"], values["isbre_commit_mutations_total"]


def run(workdir: Path, writer_counts: tuple[int, ...] = (1, 4, 16), commits_total: int = 800) -> Report:
    report = Report(
        "Metadata-only commits (set-properties), commits per second, median of "
        f"{RUNS} runs of {commits_total} commits",
        ["writers", "isbre REST", "SqlCatalog (SQLite, in-process)", "ratio", "isbre avg. batch"],
    )
    server = IsbreServer(workdir / "isbre-warehouse").start()
    sql_warehouse = workdir / "sql-warehouse"
    sql_warehouse.mkdir()
    catalog = SqlCatalog("bench", uri=f"sqlite:///{workdir / 'sql.db'}", warehouse=sql_warehouse.as_uri())
    try:
        httpx.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["bench"]}).raise_for_status()
        catalog.create_namespace("bench")
        for writers in writer_counts:
            commits = max(1, commits_total // writers)
            batches0, mutations0 = writer_counters(server)
            isbre = median_of(RUNS, partial(isbre_rate, server, writers, commits))
            batches1, mutations1 = writer_counters(server)
            sql = median_of(RUNS, partial(sql_rate, catalog, writers, commits))
            average_batch = (mutations1 - mutations0) / max(1.0, batches1 - batches0)
            report.add(str(writers), isbre, sql, f"{isbre / sql:.1f}x", average_batch)
    finally:
        server.stop()
        catalog.close()
    return report


def isbre_latency_ms(server: IsbreServer, commits: int) -> float:
    """Median milliseconds of one commit, one writer."""
    base = f"{server.url}/v1/isbre/namespaces/bench/tables"
    name = f"l{uuid.uuid4().hex[:8]}"
    httpx.post(base, json={"name": name, "schema": SCHEMA_JSON}).raise_for_status()
    samples = []
    with httpx.Client(timeout=60) as client:
        for i in range(commits):
            body = {"updates": [{"action": "set-properties", "updates": {f"k{i}": str(i)}}]}
            start = time.perf_counter()
            client.post(f"{base}/{name}", json=body).raise_for_status()
            samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000
