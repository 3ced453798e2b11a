"""Sinks: the Iceberg sink against plain PyIceberg appends of the same data, on one isbre server.

1. A million rows of ten columns into a new table: `IcebergSink` (pushes of
   100,000 rows, all metadata columns, one commit) against `create_table` and
   one `table.append` of the same Arrow table. Both go through PyIceberg's
   `RestCatalog` to a real `isbre serve`.
2. Small batches: 10,000 batches of 100 rows through the ack lane against one
   `table.append` per batch. The per-batch appends run for the first 1,000
   batches only (their rate is flat, and the full run would take minutes).
3. The million rows again under each metadata policy, and with a data-quality rule
   quarantining 1 % of them.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from isbre.sinks import Rule
from isbre.sinks.contract import OffsetSpan
from isbre.sinks.iceberg import IcebergSink
from isbre.sinks.lane import PipelinedSink
from pyiceberg.catalog.rest import RestCatalog

from tests.bench.harness import Report, timed
from tests.server import IsbreServer

ROWS = 1_000_000
PUSH_ROWS = 100_000
SMALL_BATCHES = int(os.environ.get("SB", 10_000))
SMALL_ROWS = 100
APPEND_SAMPLE = int(os.environ.get("AS", 1_000))
RUNS = 9
POLICY_RUNS = 7


def ten_columns(rows: int, first: int = 0) -> pa.Table:
    """About 74 MB of typical event data: ids, strings of several cardinalities, numbers, time, a flag."""
    index = pa.array(range(first, first + rows), pa.int64())
    text = pc.cast(index, pa.string())
    users = pc.cast(pc.bit_wise_and(index, 4095), pa.string())
    return pa.table(
        {
            "id": index,
            "user": pc.binary_join_element_wise("user-", users, ""),
            "amount": pc.divide(pc.cast(pc.bit_wise_and(index, 65535), pa.float64()), 100.0),
            "qty": pc.cast(pc.bit_wise_and(index, 63), pa.int32()),
            "country": pc.take(pa.array(["NO", "SE", "DK", "FI", "IS"]), pc.bit_wise_and(index, 3)),
            "ts": pc.cast(pc.multiply(index, 1000), pa.timestamp("us")),
            "flag": pc.equal(pc.bit_wise_and(index, 1), 0),
            "score": pc.cast(pc.divide(pc.cast(index, pa.float64()), 7.0), pa.float32()),
            "note": pc.binary_join_element_wise("note ", text, ""),
            "bucket": pc.bit_wise_and(index, 1023),
        }
    )


def _fresh(catalog: RestCatalog, schema: pa.Schema | None = None) -> str:
    ident = f"bench.s{uuid.uuid4().hex[:10]}"
    if schema is not None:
        catalog.create_table(ident, schema)
    return ident


def _append_seconds(catalog: RestCatalog, data: pa.Table) -> float:
    # Both writers start without a table (the sink creates its own), so creating it is timed too.
    ident = _fresh(catalog)
    return timed(lambda: catalog.create_table(ident, data.schema).append(data))


def _sink_seconds(catalog: RestCatalog, data: pa.Table) -> float:
    """Seconds for the sink to take `data` into a new table, with all nine metadata columns."""
    return _sink_into(catalog, _fresh(catalog), data, metadata_policy="all")


def _sink_into(catalog: RestCatalog, ident: str, data: pa.Table, **options: object) -> float:
    batches = data.to_batches(max_chunksize=PUSH_ROWS)
    sink = IcebergSink(catalog, ident, **options)  # type: ignore[arg-type]

    def run() -> None:
        start = 0
        for batch in batches:
            sink.push(batch, OffsetSpan("bench", "events", 0, start, start + batch.num_rows))
            start += batch.num_rows
        sink.finish()

    try:
        return timed(run)
    finally:
        sink.close()


def _bytes_per_row(catalog: RestCatalog, ident: str) -> float:
    summary = catalog.load_table(ident).current_snapshot().summary  # type: ignore[union-attr]
    return int(summary["total-files-size"]) / int(summary["total-records"])


# 1 row in 128 fails (0.8 %): ids whose low seven bits are 37.
ONE_PERCENT = Rule("id_not_x37", "1", lambda batch: pc.not_equal(pc.bit_wise_and(batch["id"], 127), 37))


def _variants(catalog: RestCatalog, data: pa.Table) -> Report:
    """Rows per second and data bytes per row under each metadata policy, and with a rule in
    quarantine mode, medians of POLICY_RUNS interleaved rounds; each against locator, the median
    of the rounds' ratios."""
    report = Report(
        f"Sink: {ROWS:,} rows x 10 columns by metadata policy, and with rules (median of {POLICY_RUNS})",
        ["sink", "rows/s", "data bytes per row", "vs locator"],
    )
    variants: dict[str, dict[str, object]] = {
        "locator (the default)": {"metadata_policy": "locator"},
        "all": {"metadata_policy": "all"},
        "none": {"metadata_policy": "none"},
        "locator, 1 rule, quarantine (0.8 % failing), new quarantine table": {
            "metadata_policy": "locator",
            "rules": [ONE_PERCENT],
        },
        "the same, quarantine table already there": {"metadata_policy": "locator", "rules": [ONE_PERCENT]},
    }
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    sizes: dict[str, float] = {}
    for _ in range(POLICY_RUNS):
        for name, options in variants.items():
            if "rules" in options:
                quarantined = _fresh(catalog)
                if name.endswith("already there"):  # as it is for a sink that has run before
                    _provision_quarantine(catalog, quarantined, data)
                quarantine = IcebergSink(catalog, quarantined)
                options = {**options, "enforcement": "quarantine", "quarantine": quarantine}
            ident = _fresh(catalog)
            seconds[name].append(_sink_into(catalog, ident, data, **options))
            sizes[name] = _bytes_per_row(catalog, ident)
    # Each round runs every variant once, one after the other: the median of a round's ratios
    # keeps a slower stretch of the machine from landing on one variant's runs only.
    base = seconds["locator (the default)"]
    for name in variants:
        ratio = statistics.median(b / s for b, s in zip(base, seconds[name], strict=True))
        rate = ROWS / statistics.median(seconds[name])
        report.add(name, f"{rate:,.0f}", f"{sizes[name]:.1f}", f"{ratio:.2f}")
    return report


def _provision_quarantine(catalog: RestCatalog, ident: str, data: pa.Table) -> None:
    """Create the quarantine table `ident` by quarantining a few rows of another stream into it."""
    first = data.slice(0, 256).to_batches()[0]  # rows 37 and 165 fail ONE_PERCENT
    with IcebergSink(
        catalog,
        _fresh(catalog),
        rules=[ONE_PERCENT],
        enforcement="quarantine",
        quarantine=IcebergSink(catalog, ident),
    ) as sink:
        sink.push(first, OffsetSpan("provisioning", "events", 0, 0, first.num_rows))
        sink.finish()


def _lane(catalog: RestCatalog, batches: list[pa.RecordBatch]) -> tuple[float, int]:
    sink = PipelinedSink(catalog, _fresh(catalog), metadata_policy="all")

    async def run() -> None:
        async with sink:
            start = 0
            for batch in batches:
                await sink.send(batch, OffsetSpan("bench", "small", 0, start, start + batch.num_rows))
                start += batch.num_rows
            await sink.flush()

    seconds = timed(lambda: asyncio.run(run()))
    return seconds, sink.stats.commits


def run(workdir: Path) -> list[Report]:
    server = IsbreServer(workdir / "sinks").start()
    try:
        catalog = RestCatalog("bench", uri=server.url)
        catalog.create_namespace("bench")
        data = ten_columns(ROWS)
        _append_seconds(catalog, data.slice(0, PUSH_ROWS))  # warm both paths once
        _sink_seconds(catalog, data.slice(0, PUSH_ROWS))
        big = Report(
            f"Sink: {ROWS:,} rows x 10 columns, one commit (median of {RUNS} alternating pairs)",
            ["writer", "rows/s", "vs append"],
        )
        # Alternating the two, and taking the median of each pair's ratio, keeps a noisy
        # neighbour from landing on one writer's runs only.
        pairs = [(_append_seconds(catalog, data), _sink_seconds(catalog, data)) for _ in range(RUNS)]
        appended = ROWS / statistics.median(a for a, _ in pairs)
        sunk = ROWS / statistics.median(s for _, s in pairs)
        ratio = statistics.median(a / s for a, s in pairs)
        big.add("PyIceberg table.append", f"{appended:,.0f}", "1.00")
        big.add("IcebergSink (+9 metadata columns, exactly-once)", f"{sunk:,.0f}", f"{ratio:.2f}")

        small = ten_columns(SMALL_BATCHES * SMALL_ROWS).to_batches(max_chunksize=SMALL_ROWS)
        lane_seconds, lane_commits = _lane(catalog, small)
        table = catalog.load_table(_fresh(catalog, small[0].schema))
        sample = small[:APPEND_SAMPLE]
        append_seconds = timed(lambda: [table.append(pa.Table.from_batches([b])) for b in sample])
        per_batch = Report(
            f"Sink: {SMALL_BATCHES:,} batches of {SMALL_ROWS} rows",
            ["writer", "rows/s", "commits", "vs append"],
        )
        append_rate = APPEND_SAMPLE * SMALL_ROWS / append_seconds
        lane_rate = SMALL_BATCHES * SMALL_ROWS / lane_seconds
        appended_label = f"table.append per batch (first {APPEND_SAMPLE:,})"
        per_batch.add(appended_label, f"{append_rate:,.0f}", str(APPEND_SAMPLE), "1.00")
        ratio = f"{lane_rate / append_rate:.1f}"
        per_batch.add("ack lane (PipelinedSink)", f"{lane_rate:,.0f}", str(lane_commits), ratio)
        return [big, per_batch, _variants(catalog, data)]
    finally:
        server.stop()
