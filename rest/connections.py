"""uvicorn's HTTP protocol, with each request's connection offered to the application to take over.

The event stream route uses it to pass a subscriber's connection to the
fan-out process (events/fanout.py). Nothing else changes: a request whose
connection is not taken is served exactly as uvicorn serves it.
"""

from __future__ import annotations

import os

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import is_ssl

from events.fanout import DETACHABLE


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


class DetachableHttpProtocol(HttpToolsProtocol):
    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.scope is self.scope:
            self.scope.setdefault("extensions", {})[DETACHABLE] = _Connection(self, self.cycle)
