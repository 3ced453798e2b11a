"""Follow isbre's commit events from Python instead of polling loadTable.

    from events.client import subscribe

    for event in subscribe("http://127.0.0.1:8181", tables=["sales.orders"]):
        print(event.commit_seq, event.kind, event.record.get("snapshot_id"))

`async for event in subscribe(...)` does the same on asyncio.

The client reconnects on its own (with `Last-Event-ID` and capped exponential
backoff), so a server restart goes unnoticed by the loop above. With
`cursor_file`, the position of the last event the caller finished with is
kept on disk, and a restarted consumer resumes after it: delivery is at least
once (an event may repeat after a crash of the consumer, never go missing).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, aconnect_sse, connect_sse


@dataclass(frozen=True)
class CommitEvent:
    commit_seq: int
    kind: str
    record: dict[str, Any]


class EventStreamError(RuntimeError):
    """The server refused the subscription (bad filter, expired cursor): retrying would not help."""


class _Resume:
    """What the sync and async loops share: the cursor, the filters, the backoff."""

    def __init__(
        self,
        url: str,
        after: int | None,
        tables: Iterable[str],
        namespace: str | None,
        kinds: Iterable[str],
        cursor_file: str | os.PathLike[str] | None,
        max_delay: float,
    ) -> None:
        self.url = url.rstrip("/")
        self.cursor_file = Path(cursor_file) if cursor_file else None
        if self.cursor_file and self.cursor_file.exists():
            after = int(self.cursor_file.read_text().strip())
        self.cursor = after
        self.params: list[tuple[str, str]] = [("table", t) for t in tables] + [("kind", k) for k in kinds]
        if namespace:
            self.params.append(("namespace", namespace))
        self.max_delay = max_delay
        self.delay = 0.0

    def request(self) -> dict[str, Any]:
        headers = {"Accept": "text/event-stream"}
        params = list(self.params)
        if self.cursor is not None:
            headers["Last-Event-ID"] = str(self.cursor)
        return {"params": params, "headers": headers}

    def check(self, response: httpx.Response, body: bytes) -> None:
        if 400 <= response.status_code < 500:
            try:
                message = json.loads(body)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = body.decode(errors="replace")
            raise EventStreamError(f"{response.status_code}: {message}")
        response.raise_for_status()
        self.delay = 0.0

    def event(self, sse: ServerSentEvent) -> CommitEvent | None:
        if sse.event == "error":
            raise EventStreamError(json.loads(sse.data)["error"]["message"])
        if not sse.id or not sse.data:
            return None  # the retry hint
        record = json.loads(sse.data)
        self.cursor = record["commit_seq"]
        return CommitEvent(record["commit_seq"], record["kind"], record)

    def done_with(self, event: CommitEvent) -> None:
        if self.cursor_file is not None:
            temporary = self.cursor_file.with_name(self.cursor_file.name + ".tmp")
            temporary.write_text(str(event.commit_seq))
            os.replace(temporary, self.cursor_file)

    def backoff(self) -> float:
        self.delay = min(self.max_delay, max(0.1, self.delay * 2))
        return self.delay


class Subscription:
    """Iterate it with `for` or with `async for`: every matching commit after `after`
    (or from the moment iteration starts, when None), in order, forever."""

    def __init__(
        self,
        url: str,
        after: int | None = None,
        tables: Iterable[str] = (),
        namespace: str | None = None,
        kinds: Iterable[str] = (),
        cursor_file: str | os.PathLike[str] | None = None,
        max_delay: float = 10.0,
        idle_timeout: float = 60.0,
    ) -> None:
        self._options = (url, after, tuple(tables), namespace, tuple(kinds), cursor_file, max_delay)
        # Keep-alive comments arrive every few seconds; silence longer than this means a dead connection.
        self._timeout = httpx.Timeout(10.0, read=idle_timeout)

    def __iter__(self) -> Iterator[CommitEvent]:
        state = _Resume(*self._options)
        with httpx.Client(timeout=self._timeout) as client:
            if state.cursor is None:
                state.cursor = client.get(f"{state.url}/v1/events/cursor").json()["commit_seq"]
            while True:
                try:
                    with connect_sse(client, "GET", f"{state.url}/v1/events", **state.request()) as source:
                        body = b"" if source.response.is_success else source.response.read()
                        state.check(source.response, body)
                        for sse in source.iter_sse():
                            if (event := state.event(sse)) is not None:
                                yield event
                                state.done_with(event)
                except (httpx.TransportError, httpx.HTTPStatusError):
                    time.sleep(state.backoff())

    async def __aiter__(self) -> AsyncIterator[CommitEvent]:
        state = _Resume(*self._options)
        async with httpx.AsyncClient(timeout=self._timeout) as client:
            if state.cursor is None:
                state.cursor = (await client.get(f"{state.url}/v1/events/cursor")).json()["commit_seq"]
            while True:
                try:
                    async with aconnect_sse(
                        client, "GET", f"{state.url}/v1/events", **state.request()
                    ) as source:
                        body = b"" if source.response.is_success else await source.response.aread()
                        state.check(source.response, body)
                        async for sse in source.aiter_sse():
                            if (event := state.event(sse)) is not None:
                                yield event
                                state.done_with(event)
                except (httpx.TransportError, httpx.HTTPStatusError):
                    await asyncio.sleep(state.backoff())


subscribe = Subscription
