"""Catalog routes live under `/v1/<prefix>/`; this middleware serves the unprefixed aliases, and keeps
a name's encoded `/` inside its path segment (rest/wire.py, `routed_path`).

Clients that skip `/v1/config` use `/v1/namespaces/...` directly. Rewriting
those paths once, before routing, keeps a single copy of every route (route
matching is a measurable share of a request's cost) and puts the
unknown-prefix error in one place.
"""

from __future__ import annotations

from isbre.rest.asgi_answers import send_error
from isbre.rest.wire import routed_path
from starlette.types import ASGIApp, Receive, Scope, Send

# First path segments under /v1/ that begin a catalog route.
CATALOG_ROOTS = frozenset({"namespaces", "tables", "views", "transactions", "events"})


class PrefixAliases:
    def __init__(self, app: ASGIApp, prefixes: list[str]) -> None:
        """`prefixes`: the served warehouses' prefixes; unprefixed paths go to the first."""
        self.app = app
        self.prefix = prefixes[0]
        self.prefixes = frozenset(prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = routed_path(scope["path"], scope.get("raw_path"))
            if path is None:
                await send_error(send, 400, "BadRequestException", "The path holds a control character (%1E)")
                return
            if path != scope["path"]:
                scope = dict(scope, path=path)
            parts = scope["path"].split("/", 4)  # "", "v1", first, second, rest
            if len(parts) >= 3 and parts[1] == "v1":
                if parts[2] in CATALOG_ROOTS:
                    scope = dict(scope, path=f"/v1/{self.prefix}{scope['path'][3:]}")
                elif len(parts) >= 4 and parts[3] in CATALOG_ROOTS and parts[2] not in self.prefixes:
                    await self._unknown_prefix(parts[2], send)
                    return
        await self.app(scope, receive, send)

    async def _unknown_prefix(self, prefix: str, send: Send) -> None:
        served = ", ".join(map(repr, sorted(self.prefixes)))
        message = f"Unknown catalog prefix {prefix!r}; this server serves {served}"
        await send_error(send, 404, "NotFoundException", message)
