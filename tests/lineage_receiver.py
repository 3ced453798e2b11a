"""A real OpenLineage HTTP receiver on loopback, and offline validation against the spec's JSON schemas."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

SPECS = Path(__file__).resolve().parent / "specs" / "openlineage"
RUN_EVENT = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"


def serve_in_thread(handler: type[BaseHTTPRequestHandler], port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server on loopback answering with `handler`, on a thread of its own."""
    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def shut(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


class Receiver:
    """Accepts POST /api/v1/lineage (Marquez's endpoint) and keeps every event, in arrival order."""

    def __init__(self, port: int = 0) -> None:
        self.events: list[dict[str, Any]] = []
        self.authorizations: set[str | None] = set()
        self._lock = threading.Lock()
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._connections: set[socket.socket] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real receivers do

            def setup(self) -> None:
                super().setup()
                with receiver._lock:
                    receiver._connections.add(self.connection)

            def finish(self) -> None:
                super().finish()
                with receiver._lock:
                    receiver._connections.discard(self.connection)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path != "/api/v1/lineage":
                    self.send_response(404)
                else:
                    with receiver._lock:
                        receiver.events.append(json.loads(body))
                        receiver.authorizations.add(self.headers.get("Authorization"))
                    self.send_response(201)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                body = str(len(receiver.events)).encode()  # GET /count, for benchmarks in another process
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = serve_in_thread(Handler, self._port)
        self._port = self._server.server_address[1]
        return self

    def stop(self) -> None:
        """Stop listening and drop open connections, as a crashed or stopped receiver would."""
        if self._server is not None:
            shut(self._server)
            self._server = None
        with self._lock:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
            self._connections.clear()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)


@cache
def registry() -> Registry:
    resources = []
    for path in SPECS.rglob("*.json"):
        schema = json.loads(path.read_text())
        resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


# openlineage-python adds this run facet (its own version, as a tag) to every event it sends;
# its schema is not among the spec files, so the core schema's generic facet rules check it.
CLIENT_FACETS = {"tags"}


def validate(event: dict[str, Any]) -> None:
    """The event against RunEvent, and every facet against the schema its _schemaURL names."""
    Draft202012Validator({"$ref": RUN_EVENT}, registry=registry()).validate(event)
    facets = [*event["run"].get("facets", {}).items(), *event["job"].get("facets", {}).items()]
    for dataset in event.get("inputs", []) + event.get("outputs", []):
        facets += [*dataset.get("facets", {}).items(), *dataset.get("outputFacets", {}).items()]
    known = {str(uri) for uri in registry()}
    for name, facet in facets:
        if facet["_schemaURL"].split("#")[0] not in known:
            assert name in CLIENT_FACETS, (
                f"facet {name} ({facet['_schemaURL']}) has no schema to validate against"
            )
            continue
        Draft202012Validator({"$ref": facet["_schemaURL"]}, registry=registry()).validate(facet)
