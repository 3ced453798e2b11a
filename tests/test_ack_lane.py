"""The pipelined ack lane against a real server: coalescing, ordered confirmation, poison."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest
from isbre.sinks.catalogs import coverage_source
from isbre.sinks.contract import PoisonedError, Receipt
from isbre.sinks.lane import PipelinedSink
from pyiceberg.catalog.rest import RestCatalog

from tests.server import IsbreServer
from tests.sink_helpers import offsets_in, rows, span

# Run against a server on each store.
SERVER_STORES = ("lmdb", "postgresql")


def test_many_sends_become_few_commits_confirmed_in_order_after_the_commit(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    ident = f"{namespace}.lane"
    confirmed: list[tuple[int, int]] = []
    durable_at_confirmation: list[bool] = []
    coverage = None

    def on_confirm(receipt: asyncio.Future[Receipt]) -> None:
        done = receipt.result()
        confirmed.append((done.span.partition, done.span.start))
        # The span must already be in the catalog's coverage when its confirmation fires.
        ranges = coverage.coverage(rest_catalog.load_table(ident)).of(done.span.key)
        durable_at_confirmation.append(any(s <= done.span.start and done.span.end <= e for s, e in ranges))

    async def produce() -> tuple[list[Receipt], PipelinedSink]:
        nonlocal coverage
        sink = PipelinedSink(rest_catalog, ident, queue_size=1000)
        async with sink:
            first = await sink.send(rows(0, 10), span(0, 10))
            await first  # creates the table, so the coverage endpoint can be found
            coverage = coverage_source(rest_catalog, ident)
            first.add_done_callback(on_confirm)
            for start in range(10, 2000, 10):
                for partition in (0, 1):
                    receipt = await sink.send(rows(start, start + 10), span(start, start + 10, partition))
                    receipt.add_done_callback(on_confirm)
                watermarks = sink.watermarks()
                for key, delivered in watermarks.delivered.items():
                    assert delivered <= watermarks.submitted[key]
            receipts = await sink.flush()
            watermarks = sink.watermarks()
            assert watermarks.delivered == watermarks.submitted
        return receipts, sink

    before = server.high_water()
    receipts, sink = asyncio.run(produce())
    commits = server.high_water() - before
    sends = 1 + 199 * 2
    assert len(receipts) == sends
    assert sink.stats.commits == commits - 1  # the other one created the table
    assert commits < sends / 4, f"{commits} commits for {sends} sends: the lane did not coalesce"
    for partition in (0, 1):
        starts = [s for p, s in confirmed if p == partition]
        assert starts == sorted(starts)
    assert all(durable_at_confirmation)
    expected = [(0, i) for i in range(2000)] + [(1, i) for i in range(10, 2000)]
    assert offsets_in(rest_catalog.load_table(ident)) == sorted(expected)


def test_a_permanent_error_poisons_the_lane(rest_catalog: RestCatalog, namespace: str) -> None:
    ident = f"{namespace}.poison"
    wrong = pa.RecordBatch.from_pydict({"n": pa.array(["not a number"]), "label": pa.array(["x"])})

    async def produce() -> None:
        sink = PipelinedSink(rest_catalog, ident, queue_size=100)
        good = await sink.send(rows(0, 5), span(0, 5))
        await good
        bad = await sink.send(wrong, span(5, 6))
        after = await sink.send(rows(6, 8), span(6, 8))
        with pytest.raises(PoisonedError, match=r"'n'.*string.*long") as poisoned:
            await bad
        assert "cannot be written" in str(poisoned.value.__cause__)
        with pytest.raises(PoisonedError):
            await after
        with pytest.raises(PoisonedError, match="'n'"):
            await sink.send(rows(8, 9), span(8, 9))
        watermarks = sink.watermarks()
        assert watermarks.delivered[span(0, 1).key] == 5
        await sink.close()

    asyncio.run(produce())
    assert offsets_in(rest_catalog.load_table(ident)) == [(0, i) for i in range(5)]
    covered = coverage_source(rest_catalog, ident).coverage(rest_catalog.load_table(ident))
    assert covered.of(span(0, 1).key) == [(0, 5)]


def test_sending_backwards_is_refused(rest_catalog: RestCatalog, namespace: str) -> None:
    async def produce() -> None:
        async with PipelinedSink(rest_catalog, f"{namespace}.back") as sink:
            await sink.send(rows(0, 5), span(0, 5))
            with pytest.raises(Exception, match="goes back"):
                await sink.send(rows(3, 4), span(3, 4))

    asyncio.run(produce())
