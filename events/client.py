"""Follow isbre's commit events from Python instead of polling loadTable.

    from isbre.events.client import subscribe

    for event in subscribe("http://127.0.0.1:8181", tables=["sales.orders"]):
        print(event.commit_seq, event.kind, event.record.get("snapshot_id"))

`async for event in subscribe(...)` does the same on asyncio.

The client reconnects on its own (with `Last-Event-ID` and capped exponential
backoff), so a server restart goes unnoticed by the loop above. Against a server
with authentication on, pass `token=` (a bearer token) or `credential="id:secret"`
(exchanged for access tokens at the server's token endpoint, again whenever one
expires); `ISBRE_TOKEN` and `ISBRE_CREDENTIAL` in the environment do the same. With
`cursor_file`, the position of the last event the caller finished with is
kept on disk, and a restarted consumer resumes after it: delivery is at least
once (an event may repeat after a crash of the consumer, never go missing).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
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
    """The server refused the subscription (bad filter, expired cursor, bad credentials): retrying
    would not help."""


class _Expired(Exception):
    """The stream's access token expired: get a new one and reconnect."""


class Credentials:
    """A bearer token, or client credentials exchanged for one at the server's token endpoint."""

    def __init__(self, token: str | None = None, credential: str | None = None) -> None:
        self.token = token or os.environ.get("ISBRE_TOKEN") or None
        self.credential = credential or os.environ.get("ISBRE_CREDENTIAL") or None
        if self.credential is not None and ":" not in self.credential:
            raise ValueError("a credential is client_id:client_secret")
        self._issued: str | None = None

    @property
    def renewable(self) -> bool:
        return self.credential is not None

    def headers(self) -> dict[str, str]:
        bearer = self._issued or self.token
        return {"Authorization": f"Bearer {bearer}"} if bearer else {}

    def needs_token(self) -> bool:
        return self.credential is not None and self._issued is None

    def token_request(self, url: str) -> dict[str, Any]:
        assert self.credential is not None
        client_id, _, secret = self.credential.partition(":")
        form = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}
        return {"url": f"{url}/v1/oauth/tokens", "data": form}

    def accept(self, response: httpx.Response) -> None:
        if response.status_code != 200:
            raise EventStreamError(f"{response.status_code}: the token endpoint refused the credential")
        self._issued = response.json()["access_token"]

    def expire(self) -> None:
        self._issued = None


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
        credentials: Credentials,
    ) -> None:
        self.url = url.rstrip("/")
        self.credentials = credentials
        self.cursor_file = Path(cursor_file) if cursor_file else None
        if self.cursor_file and self.cursor_file.exists():
            after = int(self.cursor_file.read_text().strip())
        self.cursor = after
        self.params: list[tuple[str, str]] = [("table", t) for t in tables] + [("kind", k) for k in kinds]
        if namespace:
            self.params.append(("namespace", namespace))
        self.max_delay = max_delay
        self.delay = 0.0
        self.renewals = 0

    def request(self) -> dict[str, Any]:
        headers = {"Accept": "text/event-stream", **self.credentials.headers()}
        params = list(self.params)
        if self.cursor is not None:
            headers["Last-Event-ID"] = str(self.cursor)
        return {"params": params, "headers": headers}

    def check(self, response: httpx.Response, body: bytes) -> None:
        if response.status_code == 401 and self.credentials.renewable:
            self.expired()
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
            error = json.loads(sse.data)["error"]
            if error.get("code") == 401 and self.credentials.renewable:
                self.expired()
            raise EventStreamError(error["message"])
        if not sse.id or not sse.data:
            return None  # the retry hint
        record = json.loads(sse.data)
        self.cursor = record["commit_seq"]
        self.renewals = 0
        return CommitEvent(record["commit_seq"], record["kind"], record)

    def expired(self) -> None:
        """The access token ran out: get another, unless fresh ones are refused too."""
        self.renewals += 1
        if self.renewals > 3:
            raise EventStreamError("401: the server refuses the access tokens its token endpoint issues")
        self.credentials.expire()
        raise _Expired

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
        token: str | None = None,
        credential: str | None = None,
        on_retry: Callable[[Exception, float], None] | None = None,
        on_connect: Callable[[int], None] | None = None,
    ) -> None:
        """`on_retry(error, delay)` hears of each failed attempt to reach the server before the
        client waits `delay` seconds and tries again; `on_connect(cursor)` of each stream opened,
        with the commit_seq its events come after."""
        credentials = Credentials(token, credential)
        self._options = (
            url,
            after,
            tuple(tables),
            namespace,
            tuple(kinds),
            cursor_file,
            max_delay,
            credentials,
        )
        self._on_retry = on_retry
        self._on_connect = on_connect
        # Keep-alive comments arrive every few seconds; silence longer than this means a dead connection.
        self._timeout = httpx.Timeout(10.0, read=idle_timeout)

    def _connected(self, state: _Resume) -> None:
        if self._on_connect is not None and state.cursor is not None:
            self._on_connect(state.cursor)

    def _retrying(self, state: _Resume, error: Exception) -> float:
        delay = state.backoff()
        if self._on_retry is not None:
            self._on_retry(error, delay)
        return delay

    def __iter__(self) -> Iterator[CommitEvent]:
        state = _Resume(*self._options)
        with httpx.Client(timeout=self._timeout) as client:
            while True:
                try:
                    if state.credentials.needs_token():
                        state.credentials.accept(client.post(**state.credentials.token_request(state.url)))
                    if state.cursor is None:
                        state.cursor = _high_water(
                            client.get(f"{state.url}/v1/events/cursor", headers=state.credentials.headers())
                        )
                    with connect_sse(client, "GET", f"{state.url}/v1/events", **state.request()) as source:
                        body = b"" if source.response.is_success else source.response.read()
                        state.check(source.response, body)
                        self._connected(state)
                        for sse in source.iter_sse():
                            if (event := state.event(sse)) is not None:
                                yield event
                                state.done_with(event)
                except _Expired:
                    continue
                except (httpx.TransportError, httpx.HTTPStatusError) as error:
                    time.sleep(self._retrying(state, error))

    async def __aiter__(self) -> AsyncIterator[CommitEvent]:
        state = _Resume(*self._options)
        async with httpx.AsyncClient(timeout=self._timeout) as client:
            while True:
                try:
                    if state.credentials.needs_token():
                        request = state.credentials.token_request(state.url)
                        state.credentials.accept(await client.post(**request))
                    if state.cursor is None:
                        cursor_url = f"{state.url}/v1/events/cursor"
                        state.cursor = _high_water(
                            await client.get(cursor_url, headers=state.credentials.headers())
                        )
                    async with aconnect_sse(
                        client, "GET", f"{state.url}/v1/events", **state.request()
                    ) as source:
                        body = b"" if source.response.is_success else await source.response.aread()
                        state.check(source.response, body)
                        self._connected(state)
                        async for sse in source.aiter_sse():
                            if (event := state.event(sse)) is not None:
                                yield event
                                state.done_with(event)
                except _Expired:
                    continue
                except (httpx.TransportError, httpx.HTTPStatusError) as error:
                    await asyncio.sleep(self._retrying(state, error))


def _high_water(response: httpx.Response) -> int:
    if response.status_code in (401, 403):
        raise EventStreamError(f"{response.status_code}: {response.json()['error']['message']}")
    response.raise_for_status()
    return response.json()["commit_seq"]


subscribe = Subscription
