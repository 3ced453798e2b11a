"""GET /v1/events: commit records as Server-Sent Events; GET /v1/events/cursor: the high-water."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Query, Request, Response
from sse_starlette import EventSourceResponse
from starlette.types import Message, Send

from events.filters import EventFilter
from events.frames import retry_frame
from events.subscription import CursorExpiredError, check_cursor, follow

router = APIRouter()


class _EventStream(EventSourceResponse):
    """sse-starlette's response without a cancel scope around every chunk when no send timeout
    is set (isbre sets none): with a hundred subscribers those scopes were a quarter of the
    event loop's time, taken from the commits it also serves."""

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)


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
    state = request.app.state
    caller = getattr(request.state, "caller", None)  # set when authentication is on
    event_filter = EventFilter.parse(namespace, table or (), kind or (), caller.namespaces if caller else ())
    cursor = _start(after, last_event_id, state.broadcaster.high)
    check_cursor(state.service, cursor)

    # Set by sse-starlette when the server begins to shut down: the stream then ends by itself,
    # with a complete response, instead of being cut.
    shutdown = anyio.Event()

    async def body() -> AsyncIterator[bytes]:
        state.event_streams += 1
        try:
            yield retry_frame(state.settings.events_retry_ms)
            async for entries in follow(state.broadcaster, state.service, cursor, event_filter, shutdown):
                yield b"".join(entry.frame for entry in entries)
        except CursorExpiredError as exc:
            error = {"error": {"message": str(exc), "type": "CursorExpiredException", "code": 410}}
            yield b"event: error\ndata: %s\n\n" % json.dumps(error).encode()
        finally:
            state.event_streams -= 1

    return _EventStream(
        body(),
        shutdown_event=shutdown,
        shutdown_grace_period=2.0,
        ping=state.settings.events_keepalive_seconds,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.get("/events/cursor")
def events_cursor(request: Request) -> Response:
    floor, high = request.app.state.service.log_bounds()
    body = json.dumps({"commit_seq": high, "oldest_commit_seq": floor})
    return Response(body, media_type="application/json")
