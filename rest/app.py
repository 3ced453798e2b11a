"""The application factory: the catalog service behind the Iceberg REST routes."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Query, Request, Response
from fastapi.routing import APIRoute

from catalog import CatalogService
from events import pull, sse
from events.broadcast import Broadcaster
from events.fanout import FanoutOptions, FanoutProcess
from events.retention import trim_periodically
from lineage.config import openlineage_configured
from lineage.mapping import LineageNames
from lineage.worker import LineageWorker
from rest import errors, health, metrics, namespaces, tables, views
from rest.auth import Authenticator, AuthMiddleware, token_response
from rest.metrics import RequestMetrics, RouteCapture
from rest.prefix import PrefixAliases
from rest.settings import Settings
from rest.wire import json_response

log = logging.getLogger(__name__)


_ROUTERS = (namespaces.router, tables.router, views.router, sse.router, pull.router)


def advertised_endpoints() -> list[str]:
    """The spec's `endpoints` list, read off the routes that are actually mounted."""
    found = []
    for module_router in _ROUTERS:
        for route in module_router.routes:
            if isinstance(route, APIRoute):
                found.extend(f"{method} /v1/{{prefix}}{route.path}" for method in sorted(route.methods))
    return found


def lineage_names(settings: Settings) -> LineageNames:
    return LineageNames(
        settings.lineage_namespace or f"isbre://{settings.host}:{settings.port}/{settings.prefix}"
    )


def _start_lineage(settings: Settings, service: CatalogService) -> LineageWorker | None:
    options = []
    if settings.lineage_transport:
        options += ["--transport", json.dumps(settings.lineage_transport)]
    elif settings.lineage_url:
        options += ["--url", settings.lineage_url]
        if settings.lineage_api_key:
            options += ["--api-key", settings.lineage_api_key]
    elif not openlineage_configured():
        log.info("lineage is off: no OpenLineage transport is configured")
        return None
    worker = LineageWorker(service, settings.warehouse.resolve(), lineage_names(settings).namespace, options)
    worker.start()
    log.info("lineage on: the outbox runs in its own process")
    return worker


def _start_fanout(settings: Settings, service: CatalogService) -> FanoutProcess | None:
    if not settings.events_process:
        return None
    options = FanoutOptions(
        settings.events_retry_ms, settings.events_keepalive_seconds, settings.events_ring_size
    )
    fanout = FanoutProcess(service, settings.warehouse.resolve(), options)
    try:
        fanout.start()
    except OSError as exc:  # e.g. a platform without SOCK_SEQPACKET Unix sockets
        log.warning("event streams are served in this process: the fan-out process cannot start (%s)", exc)
        return None
    return fanout


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = CatalogService.open(
            settings.warehouse,
            map_size=settings.map_size_mb << 20,
            max_batch=settings.max_batch,
            max_queue=settings.max_queue,
            allowed_locations=tuple(settings.allowed_locations),
        )
        app.state.service = service
        app.state.broadcaster = Broadcaster(service, capacity=settings.events_ring_size)
        trimming = asyncio.create_task(
            trim_periodically(
                service,
                settings.events_retention_records,
                settings.events_retention_days,
                settings.events_trim_interval_seconds,
                # Keys are kept twice their advertised lifetime: a grace for slow retries and clock skew.
                keep_keys_us=2 * settings.idempotency_key_lifetime_minutes * 60 * 10**6,
            )
        )
        app.state.outbox = _start_lineage(settings, service)
        app.state.fanout = _start_fanout(settings, service)
        log.info("isbre catalog %r on warehouse %s", settings.prefix, service.warehouse)
        try:
            yield
        finally:
            trimming.cancel()
            if app.state.fanout is not None:
                app.state.fanout.stop()
            if app.state.outbox is not None:
                app.state.outbox.stop()
            app.state.broadcaster.close()
            service.close()

    app = FastAPI(title="isbre", summary="An embedded Apache Iceberg REST catalog", lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics_reports = Counter()
    app.state.event_streams = 0  # served in this process
    app.state.fanout = None
    app.state.http_requests = Counter()
    errors.install(app)

    endpoints = advertised_endpoints()

    @app.get("/v1/config")
    def get_config(request: Request, warehouse: str | None = Query(None)) -> Response:
        service = request.app.state.service
        known = {
            settings.prefix,
            service.warehouse,
            str(settings.warehouse),
            str(settings.warehouse.resolve()),
        }
        if warehouse and warehouse not in known:
            raise ValueError(f"Unknown warehouse {warehouse!r}; this server serves {settings.prefix!r}")
        return json_response(
            {
                "defaults": {},
                "overrides": {"prefix": settings.prefix},
                "endpoints": endpoints,
                "idempotency-key-lifetime": f"PT{settings.idempotency_key_lifetime_minutes}M",
            }
        )

    app.include_router(metrics.router)
    app.include_router(health.router)
    for router in _ROUTERS:
        app.include_router(router, prefix=f"/v1/{settings.prefix}")
    # Starlette runs the middleware added last first: RequestMetrics, PrefixAliases, auth, RouteCapture.
    app.add_middleware(RouteCapture)
    if settings.auth.enabled:
        authenticator = Authenticator(settings.auth)

        @app.post("/v1/oauth/tokens")
        async def issue_token(request: Request) -> Response:
            authorization = request.headers.get("authorization", "")
            status, body = token_response(authenticator, await request.body(), authorization)
            return json_response(body, status_code=status, headers={"Cache-Control": "no-store"})

        # Added before PrefixAliases, so it runs after it and sees canonical paths.
        app.add_middleware(
            AuthMiddleware,
            authenticator=authenticator,
            prefix=settings.prefix,
            max_body=int(settings.max_body_mb * (1 << 20)),
        )
    app.add_middleware(PrefixAliases, prefix=settings.prefix)
    app.add_middleware(RequestMetrics, counter=app.state.http_requests)
    return app
