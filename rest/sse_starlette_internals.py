"""The one place isbre reaches into sse-starlette: `EventSourceResponse._send_with_timeout`, the
method it sends each chunk through (tests/test_upstream_seams.py fails when it changes)."""

from __future__ import annotations

from sse_starlette import EventSourceResponse
from starlette.types import Message, Send


class EventStream(EventSourceResponse):
    """sse-starlette's response without a cancel scope around every chunk when no send timeout
    is set (isbre sets none): with a hundred subscribers those scopes were a quarter of the
    event loop's time, taken from the commits it also serves."""

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)
