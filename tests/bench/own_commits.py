"""The catalog's own commits: what compaction and a rebased append cost, beside PyIceberg doing the
same work itself.

- Compaction of 40 small files (1,000 rows each) into one, in process on an embedded catalog: the
  CPU of `compact-data-files` (read, write, check against what was committed since, commit),
  beside PyIceberg's own rewrite of the same rows on SqlCatalog (`overwrite` of the table with
  what it reads), median of several runs each.
- A stale append made again on the head by the server, beside a plain append, server CPU per
  commit (tests/bench/hot_table.py's pairs).
"""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path

import psutil
import pyarrow as pa
from isbre.catalog import Identifier
from isbre.catalog.embedded import LmdbCatalog
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog

from tests.bench.harness import Report
from tests.bench.hot_table import _one_commit_cpu
from tests.server import IsbreServer

FILES = 40
ROWS = 1_000
RUNS = 5
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])


def _filled(catalog: Catalog, identifier: str, properties: dict[str, str]) -> None:
    table = catalog.create_table(identifier, schema=SCHEMA, properties=properties)
    for i in range(FILES):
        ids = range(i * ROWS, (i + 1) * ROWS)
        table.append(pa.table({"id": list(ids), "name": [f"n{n}" for n in ids]}, schema=SCHEMA))


def _compaction_cpu(workdir: Path) -> float:
    catalog = LmdbCatalog("bench", warehouse=str(workdir / "warehouse"))
    try:
        catalog.create_namespace("bench")
        _filled(catalog, "bench.t", {"isbre.maintenance.compact.min-input-files": "5"})
        started = time.process_time()
        (report,) = catalog.service.maintenance.run(Identifier.of(("bench",), "t"), ["compact-data-files"])
        spent = time.process_time() - started
        assert report.committed and report.rewritten_files == FILES, report
        return spent
    finally:
        catalog.service.close()


def _pyiceberg_rewrite_cpu(workdir: Path) -> float:
    (workdir / "sql").mkdir(parents=True)
    catalog = SqlCatalog("bench", uri=f"sqlite:///{workdir / 'sql.db'}", warehouse=(workdir / "sql").as_uri())
    catalog.create_namespace("bench")
    _filled(catalog, "bench.t", {})
    table = catalog.load_table("bench.t")
    started = time.process_time()
    table.overwrite(table.scan().to_arrow())
    spent = time.process_time() - started
    assert table.scan().to_arrow().num_rows == FILES * ROWS
    return spent


def run(workdir: Path) -> list[Report]:
    compaction = Report(
        f"Compaction of {FILES} files of {ROWS:,} rows into one, CPU in process (median of {RUNS} runs)",
        ["rewrite", "CPU s", "÷ PyIceberg"],
    )
    ours = statistics.median(_compaction_cpu(workdir / f"isbre-{uuid.uuid4().hex[:6]}") for _ in range(RUNS))
    theirs = statistics.median(
        _pyiceberg_rewrite_cpu(workdir / f"sql-{uuid.uuid4().hex[:6]}") for _ in range(RUNS)
    )
    compaction.add("isbre compact-data-files", ours, f"{ours / theirs:.2f}x")
    compaction.add("PyIceberg overwrite of the rows it read (SqlCatalog)", theirs, "1.00x")
    cost = Report(
        "Server CPU of one commit, plain and rebased, in turn on one table (medians)",
        ["commit", "commits", "server CPU ms", "÷ plain"],
    )
    (workdir / "server").mkdir()
    server = IsbreServer(workdir / "server" / "warehouse").start()
    try:
        catalog = RestCatalog("bench", uri=server.url)
        catalog.create_namespace("bench")
        _one_commit_cpu(catalog, psutil.Process(server.pid), cost)
    finally:
        server.stop()
    return [compaction, cost]
