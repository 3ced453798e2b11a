"""Commits on an S3 warehouse (moto on loopback) beside a local one, and PyIceberg's SqlCatalog on the
same S3 endpoint as the peer.

A commit on S3 writes its metadata file with one conditional PUT instead of a
local write and two fsyncs. moto is an in-process Python server, slower than
S3 per request and without S3's network latency, so the figures compare the
catalogs' own costs on one endpoint; they are not S3 latencies.
"""

from __future__ import annotations

import statistics
import time
import uuid
from functools import partial
from pathlib import Path

import httpx
from pyiceberg.catalog.sql import SqlCatalog

from tests.bench.commits import SCHEMA, isbre_latency_ms, isbre_rate, sql_rate
from tests.bench.harness import RUNS, Report, median_of
from tests.s3 import REGION, MotoS3
from tests.server import IsbreServer


def sql_latency_ms(catalog: SqlCatalog, commits: int) -> float:
    table = catalog.create_table(("bench", f"l{uuid.uuid4().hex[:8]}"), schema=SCHEMA)
    samples = []
    for i in range(commits):
        start = time.perf_counter()
        with table.transaction() as transaction:
            transaction.set_properties({f"k{i}": str(i)})
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def run(workdir: Path, writer_counts: tuple[int, ...] = (1, 4, 16), commits_total: int = 400) -> Report:
    report = Report(
        "Commits on an S3 warehouse (moto on loopback) and on local disk: commits per second "
        f"(median of {RUNS} runs of {commits_total} commits), and the median latency of one commit",
        ["writers", "isbre local", "isbre S3", "SqlCatalog S3", "isbre S3 / SqlCatalog S3"],
    )
    moto = MotoS3.start(workdir / "moto.log", buckets=("lake",))
    s3 = IsbreServer("s3://lake/isbre", env=moto.server_env(), store=workdir / "s3-store" / "isbre.lmdb")
    (workdir / "s3-store").mkdir()
    servers = [IsbreServer(workdir / "local-warehouse"), s3]
    catalog = SqlCatalog(
        "bench",
        uri=f"sqlite:///{workdir / 'sql-s3.db'}",
        warehouse="s3://lake/sql",
        **{
            "s3.endpoint": moto.endpoint,
            "s3.access-key-id": moto.access_key_id,
            "s3.secret-access-key": moto.secret_access_key,
            "s3.region": REGION,
        },
    )
    try:
        for server in servers:
            server.start()
            httpx.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["bench"]}).raise_for_status()
        catalog.create_namespace("bench")
        for writers in writer_counts:
            commits = max(1, commits_total // writers)
            local, on_s3 = (
                median_of(RUNS, partial(isbre_rate, server, writers, commits)) for server in servers
            )
            sql = median_of(RUNS, partial(sql_rate, catalog, writers, commits))
            report.add(str(writers), local, on_s3, sql, f"{on_s3 / sql:.1f}x")
        local_ms, s3_ms = (median_of(RUNS, partial(isbre_latency_ms, server, 100)) for server in servers)
        sql_ms = median_of(RUNS, partial(sql_latency_ms, catalog, 100))
        report.add("latency, ms (1 writer)", local_ms, s3_ms, sql_ms, f"{sql_ms / s3_ms:.1f}x faster")
    finally:
        for server in servers:
            server.stop()
        catalog.close()
        moto.stop()
    return report
