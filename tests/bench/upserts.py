"""Keyed sinks: upserts by key against PyIceberg's own `table.upsert` and against plain appends;
and a keyed table under back-to-back upserts with the catalog's compaction on (`hot_run`).

Each round writes COMMITS commits of BATCH rows (ten columns, keyed by `id`) into a new table on
one isbre server, half of each commit's keys new and half earlier ones: the keyed sink (an
equality delete file beside each commit's rows), PyIceberg's `table.upsert` (copy-on-write: it
reads the rows of the keys it matches and rewrites their files), and the same batches appended by
the sink without a key (no replacing at all), median of ROUNDS rounds. Then the time DuckDB's
iceberg extension takes to read each table whole, which for the keyed one applies every
commit's delete file.
"""

from __future__ import annotations

import re
import statistics
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from isbre.catalog.maintenance import COMPACT_DATA_FILES, JOB_PROPERTY
from isbre.events import TableFeed
from isbre.sinks.contract import OffsetSpan
from isbre.sinks.iceberg import IcebergSink
from pyiceberg.catalog.rest import RestCatalog

from tests.bench.harness import Report, timed
from tests.bench.sinks import ten_columns
from tests.duck import connect
from tests.http_client import http
from tests.server import IsbreServer

COMMITS = 20
BATCH = 10_000
ROUNDS = 3
SMALL_COMMITS = 100  # the table read before and after compaction
SMALL_BATCH = 1_000
READS = 3


def _batches() -> list[pa.Table]:
    """Commit i: keys from i * BATCH / 2, so that half of them were written by commit i - 1."""
    base = ten_columns(BATCH * (COMMITS + 1) // 2 + BATCH)
    batches = []
    for i in range(COMMITS):
        rows = base.slice(i * BATCH // 2, BATCH)
        batches.append(rows.set_column(2, "amount", pc.add(rows["amount"], float(i))))  # new values
    return batches


def _keyed(
    catalog: RestCatalog, batches: list[pa.Table], key: list[str], pause_s: float = 0.0, **properties: str
) -> tuple[float, str]:
    ident = f"bench.u{uuid.uuid4().hex[:10]}"
    with IcebergSink(catalog, ident, key=key, metadata_policy="none", table_properties=properties) as sink:

        def run() -> None:
            start = 0
            for rows in batches:
                sink.push(
                    rows.to_batches()[0], OffsetSpan("bench", "upserts", 0, start, start + rows.num_rows)
                )
                start += rows.num_rows
                sink.finish()
                time.sleep(pause_s)

        return timed(run), ident


def _pyiceberg(catalog: RestCatalog, batches: list[pa.Table]) -> tuple[float, str]:
    ident = f"bench.p{uuid.uuid4().hex[:10]}"
    schema = batches[0].schema.set(0, pa.field("id", pa.int64(), nullable=False))
    table = catalog.create_table(ident, schema)
    return timed(lambda: [table.upsert(rows.cast(schema), join_cols=["id"]) for rows in batches]), ident


def _read_seconds(catalog: RestCatalog, ident: str, workdir: Path) -> tuple[float, int]:
    duck = connect(workdir)
    location = catalog.load_table(ident).metadata_location
    started = time.perf_counter()
    # A column summed, so that every data file is read (a bare count can come from the metadata).
    found = duck.execute("SELECT count(*), sum(amount) FROM iceberg_scan(?)", [location]).fetchone()
    count = found[0]  # type: ignore[index]
    return time.perf_counter() - started, count


def run(workdir: Path) -> list[Report]:
    server = IsbreServer(workdir / "upserts").start()
    try:
        catalog = RestCatalog("bench", uri=server.url)
        catalog.create_namespace("bench")
        batches = _batches()
        rows = COMMITS * BATCH
        seconds: dict[str, list[float]] = {"keyed": [], "pyiceberg": [], "append": []}
        reads: dict[str, list[float]] = {"keyed": [], "pyiceberg": [], "append": []}
        counts: dict[str, int] = {}
        for _ in range(ROUNDS):
            for name, write in (
                ("keyed", lambda: _keyed(catalog, batches, ["id"])),
                ("pyiceberg", lambda: _pyiceberg(catalog, batches)),
                ("append", lambda: _keyed(catalog, batches, [])),
            ):
                took, ident = write()
                seconds[name].append(took)
                read, counts[name] = _read_seconds(catalog, ident, workdir)
                reads[name].append(read)
        report = Report(
            f"Upserts: {COMMITS} commits of {BATCH:,} rows x 10 columns, half of each commit's keys "
            f"written before (median of {ROUNDS})",
            ["writer", "rows/s", "vs PyIceberg upsert", "rows read", "DuckDB read s"],
        )
        peer = statistics.median(seconds["pyiceberg"])
        labels = {
            "pyiceberg": "PyIceberg table.upsert (copy-on-write)",
            "keyed": "IcebergSink(key=['id']) (equality deletes)",
            "append": "IcebergSink without a key (appends: no replacing)",
        }
        for name, label in labels.items():
            took = statistics.median(seconds[name])
            report.add(
                label,
                f"{rows / took:,.0f}",
                f"{peer / took:.2f}",
                f"{counts[name]:,}",
                f"{statistics.median(reads[name]):.3f}",
            )
        return [report, _compacted(server, catalog, workdir)]
    finally:
        server.stop()


def _feed_read_seconds(server: IsbreServer, ident: str) -> tuple[float, int]:
    """isbre's own reader: a feed from the start reads the table as it is (equality deletes applied)."""
    feed = TableFeed(server.url, ident, consumer=None, from_start=True)
    try:
        started = time.perf_counter()
        count = feed.read(timeout=30).num_rows
        return time.perf_counter() - started, count
    finally:
        feed.close()


def _compacted(server: IsbreServer, catalog: RestCatalog, workdir: Path) -> Report:
    """A keyed table after SMALL_COMMITS upsert commits, read whole before and after compaction
    applies its deletes (median of READS reads each)."""
    base = ten_columns(SMALL_BATCH * (SMALL_COMMITS + 1) // 2 + SMALL_BATCH)
    batches = [base.slice(i * SMALL_BATCH // 2, SMALL_BATCH) for i in range(SMALL_COMMITS)]
    # The catalog's own compaction held back until the table is read: then asked for.
    _, ident = _keyed(catalog, batches, ["id"], **{"isbre.maintenance.compact.enabled": "false"})
    readers = {
        "DuckDB iceberg_scan": lambda: _read_seconds(catalog, ident, workdir),
        "isbre TableFeed(from_start=True)": lambda: _feed_read_seconds(server, ident),
    }
    before = {name: [read() for _ in range(READS)] for name, read in readers.items()}
    namespace, name = ident.split(".")
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{name}/maintenance"
    started = time.perf_counter()
    answer = http.post(url, json={"jobs": ["compact-data-files"]}, timeout=600).json()["jobs"][0]
    compaction_s = time.perf_counter() - started
    after = {name: [read() for _ in range(READS)] for name, read in readers.items()}
    report = Report(
        f"A keyed table after {SMALL_COMMITS} upsert commits of {SMALL_BATCH:,} rows, read whole before "
        f"and after compaction applied its deletes ({answer.get('rewritten-files')} files into "
        f"{answer.get('added-files')} in {compaction_s:.2f} s; median of {READS} reads)",
        ["reader", "rows", "before s", "after s", "before / after"],
    )
    for label in readers:
        counts = {count for _, count in before[label] + after[label]}
        took = [statistics.median(t for t, _ in found) for found in (before[label], after[label])]
        report.add(
            label,
            ", ".join(f"{c:,}" for c in sorted(counts)),
            f"{took[0]:.3f}",
            f"{took[1]:.3f}",
            f"{took[0] / took[1]:.1f}",
        )
    return report


HOT_COMMITS = 150
HOT_MIN_INPUT_FILES = "10"
HOT_PAUSE_S = 0.1  # between commits: a sink that never stops, not one that ends before a job starts
_SETTLED_S = 3.0


def _compaction_counters(server: IsbreServer) -> dict[str, float]:
    """The compaction job's counters on /metrics, by metric and labels."""
    found = {}
    for line in http.get(f"{server.url}/metrics").text.splitlines():
        if 'job="compact-data-files"' in line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def _settled(server: IsbreServer, limit_s: float = 120.0) -> dict[str, float]:
    """The counters once no compaction job has ended for _SETTLED_S seconds."""
    last, since, started = _compaction_counters(server), time.monotonic(), time.monotonic()
    while time.monotonic() - since < _SETTLED_S and time.monotonic() - started < limit_s:
        time.sleep(0.5)
        now = _compaction_counters(server)
        if now != last:
            last, since = now, time.monotonic()
    return last


def _total(counters: dict[str, float], metric: str) -> float:
    return sum(v for k, v in counters.items() if re.match(rf"{metric}\{{", k))


def hot_run(workdir: Path) -> Report:
    """HOT_COMMITS upsert commits of SMALL_BATCH rows, HOT_PAUSE_S apart, into a new keyed table whose
    compaction the catalog runs itself once HOT_MIN_INPUT_FILES small files pile up: every commit
    adds an equality delete that applies to every older file, so a compaction that loses to it
    leaves the table growing."""
    server = IsbreServer(workdir / "hot-upserts").start()
    try:
        catalog = RestCatalog("bench", uri=server.url)
        catalog.create_namespace("bench")
        base = ten_columns(SMALL_BATCH * (HOT_COMMITS + 1) // 2 + SMALL_BATCH)
        batches = [base.slice(i * SMALL_BATCH // 2, SMALL_BATCH) for i in range(HOT_COMMITS)]
        before = _compaction_counters(server)
        properties = {"isbre.maintenance.compact.min-input-files": HOT_MIN_INPUT_FILES}
        took, ident = _keyed(catalog, batches, ["id"], HOT_PAUSE_S, **properties)
        after = _settled(server)
        table = catalog.load_table(ident)
        summary = table.current_snapshot().summary  # type: ignore[union-attr]
        replaces = [
            s
            for s in table.metadata.snapshots
            if s.summary is not None and s.summary.get(JOB_PROPERTY) == COMPACT_DATA_FILES
        ]
        last_sink = max(
            s.sequence_number or 0
            for s in table.metadata.snapshots
            if s.summary is not None and s.summary.operation.value != "replace"
        )
        totals = [
            (int(s.summary.get("total-data-files") or 0), int(s.summary.get("total-delete-files") or 0))
            for s in table.metadata.snapshots
            if s.summary is not None and s.summary.operation.value != "replace"
        ]
        reads = [_read_seconds(catalog, ident, workdir) for _ in range(READS)]
        report = Report(
            f"A keyed table under {HOT_COMMITS} upsert commits of {SMALL_BATCH:,} rows, "
            f"the catalog's compaction on (min-input-files {HOT_MIN_INPUT_FILES}), once its jobs settle",
            ["what", "figure"],
        )
        jobs = _total(after, "isbre_maintenance_jobs_total") - _total(before, "isbre_maintenance_jobs_total")
        abandoned = _total(after, "isbre_maintenance_commits_abandoned_total") - _total(
            before, "isbre_maintenance_commits_abandoned_total"
        )
        report.add(f"upsert commits/s ({HOT_PAUSE_S} s apart)", f"{HOT_COMMITS / took:.1f}")
        report.add("compaction jobs run", f"{jobs:.0f}")
        while_writing = sum((s.sequence_number or 0) < last_sink for s in replaces)
        report.add("compaction commits while the sink wrote", while_writing)
        report.add("compaction commits in all", len(replaces))
        report.add("compaction commits abandoned (conflicts)", f"{abandoned:.0f}")
        most_data, most_deletes = (max(each) for each in zip(*totals, strict=True))
        last_data, last_deletes = totals[-1]
        report.add("most live data files / delete files a sink commit left", f"{most_data} / {most_deletes}")
        report.add(
            "live data files / delete files after the last sink commit", f"{last_data} / {last_deletes}"
        )
        report.add("live data files at the end", summary.get("total-data-files"))  # type: ignore[union-attr]
        report.add("live delete files at the end", summary.get("total-delete-files"))  # type: ignore[union-attr]
        report.add("rows", f"{reads[0][1]:,}")
        report.add(f"DuckDB read s (median of {READS})", f"{statistics.median(t for t, _ in reads):.3f}")
        return report
    finally:
        server.stop()
