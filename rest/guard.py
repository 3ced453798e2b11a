"""What every request must be before any route reads it: a path under a served prefix, a bounded
body, JSON where JSON is expected, and (with authentication off) a Host this server answers to.

Catalog routes live under `/v1/<prefix>/`; clients that skip `/v1/config` use
`/v1/namespaces/...` directly. Rewriting those paths once, before routing, keeps
a single copy of every route (route matching is a measurable share of a
request's cost), puts the unknown-prefix error in one place and keeps a name's
encoded `/` inside its path segment (rest/wire.py, `routed_path`).

A browser page on any site can send a `text/plain` or form POST to a server on
the user's loopback, and a DNS-rebinding page can send anything under a name it
controls; refusing bodies that are not JSON and foreign Host headers closes both
without authentication. Bodies are bounded while they are read, not after.
"""

from __future__ import annotations

from isbre.rest.asgi_answers import send_error
from isbre.rest.wire import BodyTooLargeError, routed_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
TOKEN_PATH = "/v1/oauth/tokens"
# A client-credentials form is a few hundred bytes.
TOKEN_BODY_LIMIT = 64 << 10
# First path segments under /v1/ that begin a catalog route.
CATALOG_ROOTS = frozenset({"namespaces", "tables", "views", "transactions", "events"})


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _host_name(host: str) -> str:
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class RequestGuard:
    def __init__(
        self, app: ASGIApp, max_body: int, allowed_hosts: frozenset[str] | None, prefixes: list[str]
    ) -> None:
        """`allowed_hosts`: names the Host header may carry (None: any, as with authentication on);
        `prefixes`: the served warehouses' prefixes; unprefixed paths go to the first."""
        self.app = app
        self.max_body = max_body
        self.allowed_hosts = allowed_hosts
        self.prefix = prefixes[0]
        self.prefixes = frozenset(prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path_or_refusal = self._routed(scope)
        if isinstance(path_or_refusal, tuple):
            await send_error(send, *path_or_refusal)
            return
        if path_or_refusal != scope["path"]:
            scope = dict(scope, path=path_or_refusal)
        headers = dict(scope["headers"])
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await send_error(send, *refusal)
            return
        limit = TOKEN_BODY_LIMIT if scope["path"] == TOKEN_PATH else self.max_body
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            message = (
                f"Request body of {int(declared)} bytes is larger than the limit of {limit} (max_body_mb)"
            )
            await send_error(send, 413, "RequestEntityTooLargeException", message)
            return
        await self.app(scope, _bounded(receive, limit), send)

    def _routed(self, scope: Scope) -> str | tuple[int, str, str]:
        """The path to route by, or why the path is refused."""
        path = routed_path(scope["path"], scope.get("raw_path"))
        if path is None:
            return 400, "BadRequestException", "The path holds a control character (%1E)"
        parts = path.split("/", 4)  # "", "v1", first, second, rest
        if len(parts) < 3 or parts[1] != "v1":
            return path
        if parts[2] in CATALOG_ROOTS:
            return f"/v1/{self.prefix}{path[3:]}"
        if len(parts) >= 4 and parts[3] in CATALOG_ROOTS and parts[2] not in self.prefixes:
            served = ", ".join(map(repr, sorted(self.prefixes)))
            message = f"Unknown catalog prefix {parts[2]!r}; this server serves {served}"
            return 404, "NotFoundException", message
        return path

    def _refusal(self, scope: Scope, headers: dict[bytes, bytes]) -> tuple[int, str, str] | None:
        if sum(1 for name, _ in scope["headers"] if name == b"host") > 1:
            # Which one counts differs between proxies, servers and this check: one, or none at all.
            return 400, "BadRequestException", "A request may carry one Host header, not several"
        if self.allowed_hosts is not None:
            host = _host_name(headers.get(b"host", b"").decode("latin-1").strip().lower())
            if host not in self.allowed_hosts:
                message = f"Host {host!r} is not served here; add it to allowed_hosts to serve it"
                return 400, "BadRequestException", message
        has_body = headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers
        if has_body and scope["path"] != TOKEN_PATH and scope["method"] in ("POST", "PUT", "PATCH"):
            content_type = headers.get(b"content-type", b"").decode("latin-1")
            if not _is_json(content_type):
                message = (
                    f"Request bodies must be JSON (Content-Type: application/json), not {content_type!r}"
                )
                return 415, "UnsupportedMediaTypeException", message
        return None


def _bounded(receive: Receive, limit: int) -> Receive:
    """`receive`, raising BodyTooLargeError (413) once the body passes `limit` bytes."""
    size = 0

    async def bounded() -> Message:
        nonlocal size
        message = await receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise BodyTooLargeError(
                    f"Request body is larger than the limit of {limit} bytes (max_body_mb)"
                )
        return message

    return bounded
