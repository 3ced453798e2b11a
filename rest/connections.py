"""uvicorn's HTTP protocol with the limits a server facing unknown clients needs, and each request's
connection offered to the application to take over.

Limits: a request's line and headers may take at most `max_header_bytes` (431
beyond, and the connection is closed) and must arrive within
`header_timeout` seconds of the connection opening or the previous response
ending (the connection is closed after): idle and slow connections cannot pile
up. The event stream route takes connections over to pass them to the fan-out
process (events/fanout.py); a request whose connection is not taken is served
exactly as uvicorn serves it.

This is the one module that reaches into uvicorn's protocol internals (tests/test_upstream_seams.py
fails when they change underneath).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, cast

from isbre.events.fanout import DETACHABLE
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import is_ssl


class _Connection:
    def __init__(self, protocol: HttpToolsProtocol, cycle: RequestResponseCycle) -> None:
        self._protocol = protocol
        self._cycle = cycle

    def duplicate(self) -> int | None:
        protocol, cycle = self._protocol, self._cycle
        transport = protocol.transport
        if (
            protocol.cycle is not cycle  # a later request on this connection has begun
            or protocol.pipeline  # requests queued behind this one
            or cycle.response_started
            or cycle.scope.get("http_version") != "1.1"  # a stream is sent in chunks
            or transport is None
            or transport.is_closing()
            or transport.get_write_buffer_size()  # an earlier response is still being sent
            or is_ssl(transport)
        ):
            return None
        sock = transport.get_extra_info("socket")
        return None if sock is None else os.dup(sock.fileno())

    def release(self) -> None:
        # uvicorn must neither answer this request nor close the connection: closing the
        # transport closes only this process's descriptor.
        self._cycle.disconnected = True
        self._protocol.transport.close()


def _too_large(limit: int) -> bytes:
    message = f"Request line and headers are larger than the limit of {limit} bytes (max_header_kb)"
    body = json.dumps(
        {"error": {"message": message, "type": "RequestHeaderFieldsTooLargeException", "code": 431}}
    )
    head = "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    head += f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    return (head + body).encode()


class GuardedHttpProtocol(HttpToolsProtocol):
    max_header_bytes = 64 << 10
    header_timeout = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._cancel_head_timer()
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.max_header_bytes and not self._refused:
            self._refused = True
            self._cancel_head_timer()
            self.transport.write(_too_large(self.max_header_bytes))
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        if not self._refused:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        if not self._refused:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._cancel_head_timer()
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.scope is self.scope:
            # ASGI's types say extensions are dicts; this one is the object the app calls.
            extensions = cast(dict[str, Any], self.scope.setdefault("extensions", {}))
            extensions[DETACHABLE] = _Connection(self, self.cycle)

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline:
            self._await_head()


def guarded_protocol(max_header_bytes: int, header_timeout: float) -> type[GuardedHttpProtocol]:
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {"max_header_bytes": max_header_bytes, "header_timeout": header_timeout},
    )
