"""An HTTP proxy on loopback that forwards everything but drops the answer to chosen requests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.http_client import http

# Headers that describe one connection or one encoding of the body, not the message.
HOP_BY_HOP = ("host", "content-length", "transfer-encoding", "connection", "content-encoding")


class AnswerDroppingProxy:
    """Requests for which `drop(method, path)` is true reach the server; their answers do not return."""

    def __init__(self, upstream: str, drop: Callable[[str, str], bool]) -> None:
        self.dropped = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                answer = http.request(self.command, upstream + self.path, content=body, headers=headers)
                if drop(self.command, self.path):
                    proxy.dropped += 1
                    self.close_connection = True  # the commit happened; the client never hears of it
                    return
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_DELETE = do_HEAD = _forward

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> AnswerDroppingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
