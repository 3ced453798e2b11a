"""GET /v1/events: commit records as Server-Sent Events; GET /v1/events/cursor: the high-water;
GET /v1/events/recent: the newest records, to show before following."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from isbre.events.fanout import (
    DETACHABLE,
    Detachable,
    FanoutChannel,
    FanoutProcess,
    StreamRequest,
    until_expiry,
)
from isbre.events.filters import EventFilter
from isbre.events.frames import STREAM_HEADERS, expired_frame, retry_frame, token_expired_frame
from isbre.events.subscription import CursorExpiredError, check_cursor, follow, latest
from isbre.rest.access import READER
from isbre.rest.runtime import Runtime, runtime
from isbre.rest.sse_starlette_internals import EventStream
from isbre.rest.wire import caller_of, warehouse_tags
from starlette.types import Receive, Scope, Send

# Any authenticated caller may follow events; its namespace scopes filter what it sees.
router = APIRouter(dependencies=[Depends(READER)])
RECENT_LIMIT = 1000
# Records read at most for one /events/recent answer, whatever its filter matches.
RECENT_SCAN_LIMIT = 10_000


class _HandedOver(Response):
    """Passes the connection to the fan-out process, or streams here when it cannot take it."""

    def __init__(
        self,
        fanout: FanoutProcess | FanoutChannel,
        connection: Detachable,
        request: StreamRequest,
        here: Callable[[], Response],
    ) -> None:
        super().__init__(status_code=200)
        self._fanout, self._connection, self._request, self._here = fanout, connection, request, here

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fd = self._connection.duplicate() if self._fanout.take() else None
        if fd is None or not self._fanout.hand_over(fd, self._request):
            await self._here()(scope, receive, send)
            return
        self._connection.release()
        # Only the middleware sees this (request metrics): the connection is no longer the server's.
        await send({"type": "http.response.start", "status": 200, "headers": []})


def _filter(
    request: Request, namespace: str | None, table: list[str] | None, kind: list[str] | None
) -> EventFilter:
    caller = caller_of(request)
    scope = caller.namespaces if caller else ()
    return EventFilter.parse(namespace, table or (), kind or (), scope, warehouse_tags(request))


def _start(after: int | None, last_event_id: str | None, high: int) -> int:
    """Last-Event-ID (a reconnecting EventSource) wins over `after`; neither means "from now"."""
    if last_event_id:
        try:
            return int(last_event_id)
        except ValueError as exc:
            raise ValueError(f"Invalid Last-Event-ID {last_event_id!r}: expected a commit_seq") from exc
    return high if after is None else after


@router.get("/events")
async def stream_events(
    request: Request,
    after: int | None = Query(None, ge=0),
    namespace: str | None = None,
    table: Annotated[list[str] | None, Query()] = None,
    kind: Annotated[list[str] | None, Query()] = None,
    last_event_id: str | None = Header(None),
) -> Response:
    state = runtime(request)
    caller = caller_of(request)
    event_filter = _filter(request, namespace, table, kind)
    cursor = _start(after, last_event_id, state.broadcaster.high)
    # On the thread pool: on PostgreSQL this reads the database, which may keep it waiting.
    await anyio.to_thread.run_sync(check_cursor, state.service.core.commit_log, cursor)
    expires_at = caller.expires_at if caller else None
    connection = request.scope.get("extensions", {}).get(DETACHABLE)
    if state.fanout is not None and connection is not None:
        scopes = [list(scope) for scope in event_filter.scopes]
        warehouses = list(event_filter.warehouses)
        wanted = StreamRequest(cursor, namespace, table or [], kind or [], scopes, expires_at, warehouses)
        here = partial(_stream_here, state, cursor, event_filter, expires_at)
        return _HandedOver(state.fanout, connection, wanted, here)
    return _stream_here(state, cursor, event_filter, expires_at)


def _stream_here(
    state: Runtime, cursor: int, event_filter: EventFilter, expires_at: float | None
) -> Response:
    # Set by sse-starlette when the server begins to shut down, or when the caller's token expires:
    # the stream then ends by itself, with a complete response, instead of being cut.
    shutdown = anyio.Event()

    expired = anyio.Event()

    def expire() -> None:
        expired.set()
        shutdown.set()

    async def body() -> AsyncIterator[bytes]:
        state.counters.event_streams += 1
        expiry = None
        if (delay := until_expiry(expires_at)) is not None:
            expiry = asyncio.get_running_loop().call_later(delay, expire)
        try:
            yield retry_frame(state.settings.events_retry_ms)
            async for entries in follow(
                state.broadcaster, state.service.core.commit_log, cursor, event_filter, shutdown
            ):
                yield b"".join(entry.frame for entry in entries)
            if expired.is_set():
                yield token_expired_frame()
        except CursorExpiredError as exc:
            yield expired_frame(exc)
        finally:
            if expiry is not None:
                expiry.cancel()
            state.counters.event_streams -= 1

    return EventStream(
        body(),
        shutdown_event=shutdown,
        shutdown_grace_period=2.0,
        ping=state.settings.events_keepalive_seconds,
        headers=STREAM_HEADERS,
    )


def events_health(state: Runtime) -> dict[str, object]:
    """Streams open, and the fan-out process serving them (null before the first stream, which
    starts it; degraded: it is restarting, streams are served in the server's process meanwhile)."""
    fanout = state.fanout
    body: dict[str, object] = {"status": "ok", "streams": state.open_streams}
    if fanout is not None:
        body["process"] = fanout.pid
        body["status"] = "ok" if fanout.alive or fanout.idle else "degraded"
    return body


@router.get("/events/cursor")
def events_cursor(request: Request) -> Response:
    floor, high = runtime(request).service.core.commit_log.log_bounds()
    body = json.dumps({"commit_seq": high, "oldest_commit_seq": floor})
    return Response(body, media_type="application/json")


@router.get("/events/recent")
def recent_events(
    request: Request,
    limit: int = Query(50, ge=0, le=RECENT_LIMIT),
    namespace: str | None = None,
    table: Annotated[list[str] | None, Query()] = None,
    kind: Annotated[list[str] | None, Query()] = None,
) -> Response:
    event_filter = _filter(request, namespace, table, kind)
    records, high = latest(runtime(request).service.core.commit_log, event_filter, limit, RECENT_SCAN_LIMIT)
    body = b'{"commit_seq":%d,"records":[%s]}' % (high, b",".join(r.to_json() for r in records))
    return Response(body, media_type="application/json")
