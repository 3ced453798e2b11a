"""The application factory: the catalog service behind the Iceberg REST routes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.routing import APIRoute
from isbre.rest import (
    console,
    consumer_routes,
    errors,
    event_pages,
    event_stream,
    health,
    metrics,
    namespace_routes,
    plan_routes,
    table_routes,
    view_routes,
)
from isbre.rest.access import PUBLIC, READER, check_every_route_has_a_rule
from isbre.rest.auth import Authenticator, AuthMiddleware, FailureLimit, token_response
from isbre.rest.guard import LOOPBACK_NAMES, RequestGuard
from isbre.rest.lean_routes import HOT_ROUTES, lean_routes
from isbre.rest.metrics import RequestMetrics, RouteCapture, RouteTemplates
from isbre.rest.runtime import RequestCounters, runtime
from isbre.rest.settings import Settings
from isbre.rest.startup import running
from isbre.rest.wire import json_response
from starlette.concurrency import run_in_threadpool

log = logging.getLogger(__name__)


_ROUTERS = (
    namespace_routes.router,
    table_routes.router,
    plan_routes.router,
    consumer_routes.router,
    view_routes.router,
    event_stream.router,
    event_pages.router,
)


def advertised_endpoints() -> list[str]:
    """The spec's `endpoints` list, read off the routes that are actually mounted."""
    found: list[str] = []
    for module_router in _ROUTERS:
        for route in module_router.routes:
            if isinstance(route, APIRoute):
                # Path parameters are identifiers here; the spec spells one with a hyphen.
                path = route.path_format.replace("{plan_id}", "{plan-id}")
                found.extend(f"{method} /v1/{{prefix}}{path}" for method in sorted(route.methods or ()))
    return found


def create_app(settings: Settings, worker: bool = False) -> FastAPI:
    """The app; `worker`: one of several server processes (see `running`)."""

    counters = RequestCounters()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running(settings, worker, counters) as started:
            app.state.runtime = started
            yield

    # No generated docs pages: every route the app serves has an authorization rule, and those have none.
    app = FastAPI(
        title="isbre",
        summary="An embedded Apache Iceberg REST catalog",
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    errors.install(app)

    endpoints = advertised_endpoints()

    @app.get("/v1/config", dependencies=[Depends(READER)])
    def get_config(request: Request, warehouse: str | None = Query(None)) -> Response:
        services = runtime(request).services
        # A warehouse is named by its name, or by its root as configured or as served.
        # PyIceberg's own Spark defaults write the root with a trailing slash.
        wanted = warehouse.rstrip("/") if warehouse else warehouse
        found = next(
            (
                name
                for name, spec in settings.served()
                if wanted in (None, name, spec.root.rstrip("/"), services[name].core.warehouse)
            ),
            None,
        )
        if found is None:
            raise ValueError(f"Unknown warehouse {warehouse!r}; this server serves {', '.join(services)}")
        overrides = {"prefix": found, **runtime(request).planning.client_config(found)}
        return json_response(
            {
                "defaults": {},
                "overrides": overrides,
                "endpoints": endpoints,
                "idempotency-key-lifetime": f"PT{settings.idempotency_key_lifetime_minutes}M",
            }
        )

    @app.get("/v1/warehouses", dependencies=[Depends(READER)])
    def list_warehouses() -> Response:
        """isbre extension: the warehouses this server serves, by name (their catalog prefix)."""
        served = [{"name": name, "default": name == settings.prefix} for name, _ in settings.served()]
        return json_response({"warehouses": served})

    app.state.mounted = [(metrics.router, ""), (health.router, "")]
    if settings.console:
        app.state.mounted.append((console.console_router(), ""))
    app.state.mounted += [(router, "/v1/{prefix}") for router in _ROUTERS]
    for router, prefix in app.state.mounted:
        app.include_router(router, prefix=prefix)
    app.router.routes[:0] = lean_routes(app.state.mounted, HOT_ROUTES)  # tried first
    # Starlette runs the middleware added last first:
    # RequestMetrics, RequestGuard, auth, RouteCapture.
    app.add_middleware(RouteCapture)
    if settings.auth.enabled:
        authenticator = Authenticator(settings.auth)
        failures = FailureLimit(
            settings.auth.max_failed_logins,
            settings.auth.failed_login_window_seconds,
            settings.state_path() / "failed-logins.sqlite3",
        )

        @app.post("/v1/oauth/tokens", dependencies=[Depends(PUBLIC)])
        async def issue_token(request: Request) -> Response:
            authorization = request.headers.get("authorization", "")
            form = await request.body()
            # The failure count is a file the workers share: waiting on its lock must not hold up the loop.
            status, body, headers = await run_in_threadpool(
                token_response, authenticator, failures, form, authorization
            )
            return json_response(body, status_code=status, headers={"Cache-Control": "no-store", **headers})

        # The console's page and scripts hold no data: what they fetch is authenticated.
        public = (console.PREFIX,) if settings.console else ()
        app.add_middleware(AuthMiddleware, authenticator=authenticator, public_prefixes=public)
    # Without authentication, only names of this server: a rebinding page's name is refused.
    hosts = None if settings.auth.enabled or "*" in settings.allowed_hosts else _served_names(settings)
    app.add_middleware(
        RequestGuard,
        max_body=int(settings.max_body_mb * (1 << 20)),
        allowed_hosts=hosts,
        prefixes=[name for name, _ in settings.served()],
    )
    templates = RouteTemplates(((method, path) for method, path, _ in served_routes(app)), settings.prefix)
    app.add_middleware(
        RequestMetrics,
        counter=counters.http_requests,
        templates=templates,
        slow_seconds=settings.slow_request_seconds,
    )
    check_every_route_has_a_rule(served_routes(app))
    return app


def served_routes(app: FastAPI) -> Iterator[tuple[str, str, APIRoute]]:
    """(method, path, route) for every route the app serves: its own and its routers'."""
    for route in app.routes:
        if isinstance(route, APIRoute):
            yield from ((method, route.path_format, route) for method in sorted(route.methods or ()))
    for router, prefix in app.state.mounted:
        for route in router.routes:
            if isinstance(route, APIRoute):
                yield from (
                    (method, prefix + route.path_format, route) for method in sorted(route.methods or ())
                )


def _served_names(settings: Settings) -> frozenset[str]:
    host = settings.host.lower()
    names = {*LOOPBACK_NAMES, host, *(name.lower() for name in settings.allowed_hosts)}
    if ":" in host:  # an IPv6 address comes bracketed in a Host header
        names.add(f"[{host}]")
    return frozenset(names)
