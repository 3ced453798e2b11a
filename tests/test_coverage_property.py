"""Property: whatever producers do (overlapping replays, crashes before or after the commit),
the coverage a table reports never claims an offset whose row is not in it, and no row lands twice."""

from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st
from isbre.sinks.iceberg import IcebergSink
from pyiceberg.catalog import load_catalog

from tests.sink_helpers import offsets_in, rows, span

OUTCOMES = ("commit", "crash-before-commit", "crash-after-commit")

attempts = st.lists(
    st.tuples(
        st.integers(0, 2),  # partition
        st.integers(0, 60),  # first offset
        st.lists(st.integers(1, 15), min_size=1, max_size=3),  # batch sizes pushed in order
        st.sampled_from(OUTCOMES),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(attempts)
def test_coverage_never_leads_the_table(plan: list[tuple[int, int, list[int], str]]) -> None:
    with tempfile.TemporaryDirectory() as warehouse:
        properties = {"py-catalog-impl": "isbre.catalog.embedded.LmdbCatalog", "warehouse": warehouse}
        catalog = load_catalog("p", **properties)
        catalog.create_namespace("p")
        landed: set[tuple[int, int]] = set()
        for partition, first, sizes, outcome in plan:
            sink = IcebergSink(catalog, "p.t", target_file_bytes=1)  # a new producer process each time
            start = first
            for size in sizes:
                sink.push(rows(start, start + size), span(start, start + size, partition))
                start += size
            if outcome != "crash-before-commit":
                sink.finish()  # after a crash-after-commit the producer never hears of it: same here
                landed |= {(partition, o) for o in range(first, start)}
            sink.close()  # a crash before the commit: the pushed rows and their files are dropped
        if not catalog.table_exists("p.t"):
            return
        table = catalog.load_table("p.t")
        present = offsets_in(table)
        assert len(present) == len(set(present)), "a row landed twice"
        assert set(present) == landed
        claimed = {
            (key.partition, offset)
            for key, ranges in catalog.coverage("p.t").ranges.items()
            for start, end in ranges
            for offset in range(start, end)
        }
        assert claimed <= set(present), f"coverage claims offsets with no row: {claimed - set(present)}"
        assert claimed == landed, "coverage lags what landed"
        catalog.close()
