"""Scan planning on the server beside PyIceberg's own local planning, and plans from a commit
cursor on a short and a long history."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import httpx
import psutil
import pyarrow as pa
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.expressions import And, BooleanExpression, GreaterThanOrEqual, LessThan
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import StaticTable
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField

from tests.bench.commit_cpu import _history
from tests.bench.harness import RUNS, Report, cpu_seconds, percentile
from tests.crafted import crafted_snapshot
from tests.server import IsbreServer

APPENDS = 200  # each one manifest of PARTITIONS data files
PARTITIONS = 10
ROWS = 100  # per append
PLANS = 30  # per run
HISTORIES = (10, 10_000)
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True), NestedField(2, "p", LongType(), required=True)
)
# 1 % of the files: the ids of two appends of two hundred.
ONE_PERCENT: BooleanExpression = And(GreaterThanOrEqual("id", 100 * ROWS), LessThan("id", 102 * ROWS))
ONE_PERCENT_JSON = {
    "type": "and",
    "left": {"type": "gt-eq", "term": "id", "value": 100 * ROWS},
    "right": {"type": "lt", "term": "id", "value": 102 * ROWS},
}


def _wide_table(catalog: RestCatalog) -> StaticTable:
    table = catalog.create_table(
        "bench.wide", SCHEMA, partition_spec=PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "p"))
    )
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False), pa.field("p", pa.int64(), nullable=False)]
    )
    for append in range(APPENDS):
        ids = list(range(append * ROWS, (append + 1) * ROWS))
        table.append(pa.table({"id": ids, "p": [i % PARTITIONS for i in ids]}, schema=schema))
    return StaticTable.from_metadata(catalog.load_table("bench.wide").metadata_location)


def _local(table: StaticTable, row_filter: BooleanExpression) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process, files) of one plan PyIceberg makes itself."""
    process = psutil.Process()
    cpu, start = sum(process.cpu_times()[:2]), time.perf_counter()
    files = len(list(table.scan(row_filter=row_filter).plan_files()))
    return time.perf_counter() - start, sum(process.cpu_times()[:2]) - cpu, files


def _served(client: httpx.Client, url: str, body: dict[str, object]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process, files) of one plan the server makes, every page."""
    process = psutil.Process()
    cpu, start = sum(process.cpu_times()[:2]), time.perf_counter()
    answer = client.post(url, json=body)
    answer.raise_for_status()
    files, pending = len(answer.json()["file-scan-tasks"]), answer.json()["plan-tasks"]
    while pending:  # the rest of a large plan, as a client fetches it
        page = client.post(url.removesuffix("/plan") + "/tasks", json={"plan-task": pending.pop()})
        page.raise_for_status()
        files += len(page.json()["file-scan-tasks"])
        pending += page.json()["plan-tasks"]
    return time.perf_counter() - start, sum(process.cpu_times()[:2]) - cpu, files


def _median_run(measure, server: psutil.Process | None) -> tuple[float, float, float, int]:  # type: ignore[no-untyped-def]
    """p50 wall ms, client CPU ms per plan, server CPU ms per plan (median of RUNS runs), files."""
    runs = []
    for _ in range(RUNS):
        before = cpu_seconds(server) if server else 0.0
        samples = [measure() for _ in range(PLANS)]
        spent = (cpu_seconds(server) - before) / PLANS if server else 0.0
        walls = [s[0] for s in samples]
        runs.append((percentile(walls, 0.5), statistics.mean(s[1] for s in samples), spent, samples[0][2]))
    runs.sort()
    wall, client_cpu, server_cpu, files = runs[len(runs) // 2]
    return wall * 1000, client_cpu * 1000, server_cpu * 1000, files


def _filters(server: IsbreServer, report: Report) -> None:
    catalog = RestCatalog("bench", uri=server.url)
    catalog.create_namespace("bench")
    table = _wide_table(catalog)
    process = psutil.Process(server.pid)
    url = f"{server.url}/v1/isbre/namespaces/bench/tables/wide/plan"
    with httpx.Client(timeout=120) as client:
        for label, expression, body in (
            ("1 %", ONE_PERCENT, {"filter": ONE_PERCENT_JSON}),
            ("all", None, {}),
        ):
            row_filter = expression if expression is not None else GreaterThanOrEqual("id", 0)
            wall, cpu, _, files = _median_run(lambda: _local(table, row_filter), None)  # noqa: B023
            report.add(f"{label} of {APPENDS * PARTITIONS} files", "PyIceberg, local", files, wall, cpu, "-")
            cold = _served(client, url, body)  # the first plan reads and keeps the manifests
            served = _median_run(lambda: _served(client, url, body), process)  # noqa: B023
            report.add(
                f"{label} of {APPENDS * PARTITIONS} files",
                f"isbre server (first plan {cold[0] * 1000:,.1f} ms)",
                served[3],
                served[0],
                served[1],
                served[2],
            )
            report.add(
                f"{label}: server ÷ local", "", "", served[0] / wall, (served[1] + served[2]) / cpu, ""
            )


def _cursor(server: IsbreServer, report: Report) -> None:
    catalog = RestCatalog("bench", uri=server.url)
    catalog.create_namespace("cursor")
    process = psutil.Process(server.pid)
    found = {}
    with httpx.Client(timeout=120) as client:
        for snapshots in HISTORIES:
            root = Path(server.warehouse) / "cursor" / f"history-{snapshots}"  # a place tables may be
            (root / "metadata").mkdir(parents=True)
            metadata_file = root / "metadata" / "00000-history.metadata.json"
            metadata_file.write_text(_history(root.as_uri(), snapshots).model_dump_json(exclude_none=True))
            name = f"h{snapshots}"
            body = {"name": name, "metadata-location": metadata_file.as_uri()}
            registered = client.post(f"{server.url}/v1/isbre/namespaces/cursor/register", json=body)
            assert registered.status_code == 200, registered.text
            cursor = client.get(f"{server.url}/v1/events/cursor").json()["commit_seq"]
            metadata = catalog.load_table(f"cursor.{name}").metadata
            updates = crafted_snapshot(
                metadata,
                f"{root}/metadata/snap-new.avro",
                [(f"{root}/metadata/new-m0.avro", [f"{root}/data/new.parquet"])],
            )
            table = f"{server.url}/v1/isbre/namespaces/cursor/tables/{name}"
            committed = client.post(table, json={"updates": updates})
            assert committed.status_code == 200, committed.text
            plan = f"{table}/plan"
            wall, client_cpu, server_cpu, files = _median_run(
                lambda: _served(client, plan, {"isbre-after-commit-seq": cursor}),  # noqa: B023
                process,
            )
            assert files == 1
            found[snapshots] = (wall, server_cpu)
            report.add(f"{snapshots:,}", wall, server_cpu, client_cpu)
    (short, long) = (found[HISTORIES[0]], found[HISTORIES[1]])
    report.add(f"{HISTORIES[1]:,} ÷ {HISTORIES[0]}", long[0] / short[0], long[1] / short[1], "")


def run(workdir: Path) -> list[Report]:
    filters = Report(
        f"Planning a scan of {APPENDS * PARTITIONS:,} data files in {APPENDS} manifests: PyIceberg's "
        f"local plan beside the server's (warm manifest cache), median of {RUNS} runs of {PLANS} plans",
        ["scan", "planned by", "files", "p50 ms", "client CPU ms", "server CPU ms"],
    )
    cursor = Report(
        f"A plan from a commit cursor of one new commit, by table history, median of {RUNS} runs",
        ["snapshots", "p50 ms", "server CPU ms", "client CPU ms"],
    )
    server = IsbreServer(workdir / "plans-warehouse").start()
    try:
        _filters(server, filters)
        _cursor(server, cursor)
    finally:
        server.stop()
    return [filters, cursor]
