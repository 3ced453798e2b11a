"""The in-process subscription: replay, the live ring, and falling back to the log."""

from __future__ import annotations

import asyncio
import time

import pytest
from isbre.catalog import CatalogService
from isbre.events import subscription
from isbre.events.broadcast import Broadcaster
from isbre.events.filters import EventFilter
from isbre.events.subscription import CursorAheadError, CursorExpiredError, follow, subscribe

from tests.waiting import until


async def take(stream, count: int) -> list[int]:
    seqs: list[int] = []
    async for entries in stream:
        seqs += [e.record.commit_seq for e in entries]
        if len(seqs) >= count:
            return seqs
    return seqs


def create(service: CatalogService, names: range, prefix: str = "n") -> None:
    for i in names:
        service.namespaces.create((f"{prefix}{i}",), {})


def test_replay_then_live_without_gap(service: CatalogService) -> None:
    create(service, range(10))
    broadcaster = Broadcaster(service.core.commit_log, capacity=4)

    async def scenario() -> list[int]:
        stream = follow(broadcaster, service.core.commit_log, after=0)
        first = await take(stream, 10)  # all from the log: the ring started empty
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, create, service, range(10, 15))
        return first + await take(stream, 5)

    assert asyncio.run(scenario()) == list(range(1, 16))


def test_a_subscriber_behind_the_ring_reads_the_log(service: CatalogService) -> None:
    broadcaster = Broadcaster(service.core.commit_log, capacity=4)

    async def scenario() -> list[int]:
        stream = follow(broadcaster, service.core.commit_log, after=0)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, create, service, range(2))
        seqs = await take(stream, 2)
        # Not iterated while 50 commits land: the ring keeps only the last 4.
        await loop.run_in_executor(None, create, service, range(2, 52))
        assert broadcaster.since(2) is None, "the subscriber should be behind the ring now"
        return seqs + await take(stream, 50)

    assert asyncio.run(scenario()) == list(range(1, 53))
    assert broadcaster.subscribers_waiting() == 0


def test_a_broadcaster_in_another_process_follows_the_log(service: CatalogService) -> None:
    """The fan-out process's broadcaster: nothing commits where it runs, it publishes from the log."""
    broadcaster = Broadcaster(service.core.commit_log, capacity=4)
    broadcaster.close()  # as in the fan-out process: no writer calls it

    async def scenario() -> list[int]:
        near, far = (
            follow(broadcaster, service.core.commit_log, after=0),
            follow(broadcaster, service.core.commit_log, after=0),
        )
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, create, service, range(3))
        assert broadcaster.high == 0, "only publish_from_log moves it"
        broadcaster.publish_from_log()
        seqs = await take(near, 3)
        # Ten commits, one look at the log: only the newest ring's worth is kept, consecutive.
        await loop.run_in_executor(None, create, service, range(3, 13))
        broadcaster.publish_from_log()
        assert broadcaster.since(8) is None and [e.record.commit_seq for e in broadcaster.since(9)] == [
            10,
            11,
            12,
            13,
        ]
        return seqs + await take(near, 10) + [-1] + await take(far, 13)

    assert asyncio.run(scenario()) == [*range(1, 14), -1, *range(1, 14)]


def test_many_subscribers_share_one_ring(service: CatalogService) -> None:
    broadcaster = Broadcaster(service.core.commit_log, capacity=64)

    async def scenario() -> list[list[int]]:
        streams = [follow(broadcaster, service.core.commit_log, after=0) for _ in range(20)]
        readers = [asyncio.ensure_future(take(s, 30)) for s in streams]
        await until(lambda: broadcaster.subscribers_waiting() == 20, "20 subscribers waiting")
        await asyncio.get_running_loop().run_in_executor(None, create, service, range(30))
        return await asyncio.gather(*readers)

    assert all(seqs == list(range(1, 31)) for seqs in asyncio.run(scenario()))


def test_filtered_subscription_yields_records(service: CatalogService) -> None:
    create(service, range(3), prefix="keep")
    create(service, range(3), prefix="skip")
    broadcaster = Broadcaster(service.core.commit_log)

    async def scenario() -> list[str]:
        names = []
        async for record in subscribe(
            broadcaster, service.core.commit_log, 0, EventFilter(namespace=("keep1",))
        ):
            names.append(record.namespace[0])
            break
        return names

    assert asyncio.run(scenario()) == ["keep1"]


def test_cursor_checks(service: CatalogService) -> None:
    create(service, range(10))
    broadcaster = Broadcaster(service.core.commit_log)
    service.core.commit_log.trim_log(keep_records=3, keep_us=10**15)

    async def first(after: int) -> None:
        async for _ in subscribe(broadcaster, service.core.commit_log, after):
            return

    assert service.core.commit_log.log_bounds() == (8, 10)  # the 3 newest records are kept
    with pytest.raises(CursorExpiredError):
        asyncio.run(first(6))
    with pytest.raises(CursorAheadError):
        asyncio.run(first(11))
    asyncio.run(first(7))  # the oldest valid cursor: the record after it is still there


def test_a_filtered_subscriber_sleeps_through_what_it_does_not_want(service: CatalogService) -> None:
    broadcaster = Broadcaster(service.core.commit_log, capacity=4)
    looks = []
    since = broadcaster.since

    def counting(cursor: int):
        looks.append(cursor)
        return since(cursor)

    broadcaster.since = counting  # observe, do not change: every call still reads the real ring

    async def scenario() -> list[tuple[int, str]]:
        stream = follow(
            broadcaster, service.core.commit_log, after=0, event_filter=EventFilter(namespace=("keep",))
        )
        reader = asyncio.ensure_future(stream.__anext__())
        await until(lambda: broadcaster.subscribers_waiting() == 1, "caught up at 0 and waiting")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, create, service, range(50), "skip")
        assert not reader.done(), "woken by records its filter rejects"
        await loop.run_in_executor(None, service.namespaces.create, ("keep",), {})
        entries = await asyncio.wait_for(reader, 5)
        return [(e.record.commit_seq, e.record.namespace[0]) for e in entries]

    assert asyncio.run(scenario()) == [(51, "keep")]
    # Once on subscribing, once when woken for the match, which it reads from just before it:
    # never for the 50 records it skipped (and never from the log, which 50 > 4 would need).
    assert looks == [0, 50]


def test_a_busy_loop_coalesces_sends_and_an_idle_one_does_not(
    service: CatalogService, monkeypatch: pytest.MonkeyPatch
) -> None:
    broadcaster = Broadcaster(service.core.commit_log)

    async def batches_for(commits: int, prefix: str) -> tuple[int, list[int]]:
        stream = follow(broadcaster, service.core.commit_log, after=service.core.commit_log.commit_seq())
        loop = asyncio.get_running_loop()

        def commit_paced() -> None:
            # A few ms apart: an idle loop sends each before the next, even on a loaded machine.
            for i in range(commits):
                service.namespaces.create((f"{prefix}{i}",), {})
                time.sleep(0.003)

        writing = loop.run_in_executor(None, commit_paced)
        batches, seqs = 0, []
        async for entries in stream:
            batches += 1
            seqs += [e.record.commit_seq for e in entries]
            if len(seqs) >= commits:
                break
        await writing
        return batches, seqs

    first = service.core.commit_log.commit_seq()
    broadcaster.lag = lambda loop: 0.0  # type: ignore[method-assign]  # idle, however loaded this machine is
    idle_batches, idle = asyncio.run(batches_for(30, "idle"))
    assert idle == list(range(first + 1, first + 31))
    # A loop that runs notifications late: the subscriber pauses after each send and takes what
    # came meanwhile at once. The pause is 25 ms at most in service; here it is 1.5 s, for the 30
    # commits to come within one or two pauses however slow this machine's commits are: a send
    # for the first, one or two for the rest.
    monkeypatch.setattr(subscription, "COALESCE_MAX_S", 1.5)
    broadcaster.lag = lambda loop: 1.0  # type: ignore[method-assign]
    busy_batches, busy = asyncio.run(batches_for(30, "busy"))
    assert busy == list(range(first + 31, first + 61))
    assert busy_batches <= 3 and idle_batches > 2 * busy_batches, (busy_batches, idle_batches)
