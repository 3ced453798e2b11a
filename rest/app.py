"""The application factory: the catalog service behind the Iceberg REST routes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.routing import APIRoute
from isbre.catalog import CatalogService
from isbre.catalog.commit_log import CommitLog
from isbre.catalog.feed import CommitFeed
from isbre.catalog.limits import Limits
from isbre.catalog.warehouses import open_warehouses
from isbre.events.broadcast import Broadcaster
from isbre.events.fanout import FanoutChannel, FanoutOptions, FanoutProcess, shared_socket
from isbre.events.retention import trim_periodically
from isbre.lineage.config import openlineage_configured
from isbre.lineage.mapping import LineageNames
from isbre.lineage.worker import LineageObserver, LineageWorker
from isbre.rest import console, errors, event_pages, event_stream, health, metrics, namespaces, tables, views
from isbre.rest.access import PUBLIC, READER, check_every_route_has_a_rule
from isbre.rest.auth import Authenticator, AuthMiddleware, FailureLimit, token_response
from isbre.rest.delegation import Delegation
from isbre.rest.guard import LOOPBACK_NAMES, RequestGuard
from isbre.rest.metrics import RequestMetrics, RouteCapture, RouteTemplates, own_counts
from isbre.rest.prefix import PrefixAliases
from isbre.rest.settings import Settings, warehouses
from isbre.rest.shared_counters import SharedCounters
from isbre.rest.wire import json_response

log = logging.getLogger(__name__)


_ROUTERS = (namespaces.router, tables.router, views.router, event_stream.router, event_pages.router)


def advertised_endpoints() -> list[str]:
    """The spec's `endpoints` list, read off the routes that are actually mounted."""
    found: list[str] = []
    for module_router in _ROUTERS:
        for route in module_router.routes:
            if isinstance(route, APIRoute):
                found.extend(
                    f"{method} /v1/{{prefix}}{route.path_format}" for method in sorted(route.methods or ())
                )
    return found


def lineage_names(settings: Settings) -> LineageNames:
    """The default warehouse's namespace is `lineage_namespace` (or isbre://host:port/prefix);
    another warehouse's adds its name to it."""
    default = settings.lineage_namespace or f"isbre://{settings.host}:{settings.port}/{settings.prefix}"
    base = settings.lineage_namespace or f"isbre://{settings.host}:{settings.port}"
    return LineageNames(default, {name: f"{base}/{name}" for name in settings.warehouses})


def lineage_delivery(settings: Settings) -> dict[str, str] | None:
    """Where the lineage worker delivers; None when lineage is off."""
    # Passed in the environment, never on the command line: a transport and a key are secrets.
    delivery: dict[str, str] = {}
    if settings.lineage_transport:
        delivery["transport"] = json.dumps(settings.lineage_transport)
    elif settings.lineage_url:
        delivery["url"] = settings.lineage_url
        if settings.lineage_api_key:
            delivery["api_key"] = settings.lineage_api_key
    elif not openlineage_configured():
        return None
    return delivery


def start_lineage(settings: Settings, services: list[CatalogService]) -> LineageWorker | None:
    delivery = lineage_delivery(settings)
    if delivery is None:
        log.info("lineage is off: no OpenLineage transport is configured")
        return None
    served = [
        replace(w, root=service.warehouse) for w, service in zip(warehouses(settings), services, strict=True)
    ]
    worker = LineageWorker(
        services[0].commit_log,
        settings.store_location(),
        settings.state_path(),
        served,
        lineage_names(settings),
        delivery,
    )
    worker.start()
    log.info("lineage on: the outbox runs in its own process")
    return worker


def catalog_limits(settings: Settings) -> Limits:
    return Limits(
        max_property_value_bytes=settings.max_property_value_kb << 10,
        max_metadata_bytes=int(settings.max_metadata_mb * (1 << 20)),
        min_free_disk_bytes=settings.min_free_disk_mb << 20,
    )


def _shut_down(failure: BaseException) -> None:
    """The writer broke: a server that cannot commit stops (its supervisor restarts it) rather than
    accept requests it can never answer."""
    log.critical("shutting down: the writer failed with %s", type(failure).__name__)
    os.kill(os.getpid(), signal.SIGTERM)


def fanout_options(settings: Settings) -> FanoutOptions:
    return FanoutOptions(
        settings.events_retry_ms,
        settings.events_keepalive_seconds,
        settings.events_ring_size,
        int(settings.events_ring_mb * (1 << 20)),
    )


def _start_fanout(
    settings: Settings, commit_log: CommitLog, worker: bool
) -> FanoutProcess | FanoutChannel | None:
    if not settings.events_process:
        return None
    if worker:  # the supervisor runs one fan-out process for every worker
        path = shared_socket(settings.state_path())
        if path is None:
            return None
        channel = FanoutChannel(path)
        channel.start()
        return channel
    fanout = FanoutProcess(commit_log, settings.store_location(), fanout_options(settings))
    try:
        fanout.start()
    except OSError as exc:  # e.g. a platform without SOCK_SEQPACKET Unix sockets
        log.warning("event streams are served in this process: the fan-out process cannot start (%s)", exc)
        return None
    return fanout


def create_app(settings: Settings, worker: bool = False) -> FastAPI:
    """The app; `worker`: one of several server processes, whose supervisor runs the lineage
    worker and the events fan-out process."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = open_warehouses(
            settings.store_location(),
            warehouses(settings),
            map_size=settings.map_size_mb << 20,
            max_batch=settings.max_batch,
            max_queue=settings.max_queue,
            allowed_locations=tuple(settings.allowed_locations),
            limits=catalog_limits(settings),
            on_fatal=_shut_down,
        )
        service = services[0]
        app.state.service = service
        app.state.services = {each.name: each for each in services}
        app.state.delegation = {
            name: Delegation.of(each, spec.delegation)
            for (name, spec), each in zip(settings.served(), services, strict=True)
        }
        app.state.broadcaster = Broadcaster(
            service.commit_log,
            capacity=settings.events_ring_size,
            max_bytes=int(settings.events_ring_mb * (1 << 20)),
        )
        trimming = asyncio.create_task(
            trim_periodically(
                service.commit_log,
                settings.events_retention_records,
                settings.events_retention_days,
                settings.events_trim_interval_seconds,
                # Keys are kept twice their advertised lifetime: a grace for slow retries and clock skew.
                keep_keys_us=2 * settings.idempotency_key_lifetime_minutes * 60 * 10**6,
            )
        )
        if not worker:
            app.state.outbox = start_lineage(settings, services)
        elif lineage_delivery(settings) is not None:  # the supervisor runs the lineage worker
            app.state.outbox = LineageObserver(service.commit_log, settings.state_path())
        else:
            app.state.outbox = None
        app.state.fanout = _start_fanout(settings, service.commit_log, worker)
        # Commits another process makes on this store (an embedded catalog, a tool) reach the
        # streams too; the lineage worker polls the log on its own.
        feed = CommitFeed(service.commit_log)
        feed.follow(app.state.broadcaster.publish_from_log)
        if isinstance(app.state.fanout, FanoutProcess):  # the shared one follows the store itself
            feed.follow(app.state.fanout.wake)
        feed.start()
        if worker:
            app.state.shared_counters = SharedCounters(settings.state_path())
            publishing = asyncio.create_task(
                app.state.shared_counters.publish_periodically(lambda: own_counts(app.state))
            )
        for each in services:
            log.info("isbre warehouse %r at %s", each.name, each.warehouse)
        if worker:  # this worker's file says it has started: /ready and the supervisor count them
            app.state.shared_counters.publish(own_counts(app.state))
        # What this process started, stopped in reverse order; each step runs whatever the one
        # before it did, so the store is always closed.
        steps: list[Callable[[], object]] = [service.close, app.state.broadcaster.close]
        if isinstance(app.state.outbox, LineageWorker):  # an observer has nothing to stop
            steps.append(app.state.outbox.stop)
        if app.state.fanout is not None:
            steps.append(app.state.fanout.stop)
        if worker:
            steps += [app.state.shared_counters.close, publishing.cancel]
        steps += [trimming.cancel, feed.close]
        try:
            yield
        finally:
            for step in reversed(steps):
                try:
                    step()
                except Exception:
                    log.exception("shutting down: %s failed", getattr(step, "__qualname__", step))

    # No generated docs pages: every route the app serves has an authorization rule, and those have none.
    app = FastAPI(
        title="isbre",
        summary="An embedded Apache Iceberg REST catalog",
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics_reports = Counter()
    app.state.event_streams = 0  # served in this process
    app.state.fanout = None
    app.state.shared_counters = None
    app.state.http_requests = Counter()
    errors.install(app)

    endpoints = advertised_endpoints()

    @app.get("/v1/config", dependencies=[Depends(READER)])
    def get_config(request: Request, warehouse: str | None = Query(None)) -> Response:
        services: dict[str, CatalogService] = request.app.state.services
        # A warehouse is named by its name, or by its root as configured or as served.
        # PyIceberg's own Spark defaults write the root with a trailing slash.
        wanted = warehouse.rstrip("/") if warehouse else warehouse
        found = next(
            (
                name
                for name, spec in settings.served()
                if wanted in (None, name, spec.root.rstrip("/"), services[name].warehouse)
            ),
            None,
        )
        if found is None:
            raise ValueError(f"Unknown warehouse {warehouse!r}; this server serves {', '.join(services)}")
        return json_response(
            {
                "defaults": {},
                "overrides": {"prefix": found},
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
    # Starlette runs the middleware added last first:
    # RequestMetrics, PrefixAliases, RequestGuard, auth, RouteCapture.
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
            status, body, headers = token_response(
                authenticator, failures, await request.body(), authorization
            )
            return json_response(body, status_code=status, headers={"Cache-Control": "no-store", **headers})

        # The console's page and scripts hold no data: what they fetch is authenticated.
        public = (console.PREFIX,) if settings.console else ()
        app.add_middleware(AuthMiddleware, authenticator=authenticator, public_prefixes=public)
    # Without authentication, only names of this server: a rebinding page's name is refused.
    hosts = None if settings.auth.enabled or "*" in settings.allowed_hosts else _served_names(settings)
    app.add_middleware(RequestGuard, max_body=int(settings.max_body_mb * (1 << 20)), allowed_hosts=hosts)
    app.add_middleware(PrefixAliases, prefixes=[name for name, _ in settings.served()])
    templates = RouteTemplates(((method, path) for method, path, _ in served_routes(app)), settings.prefix)
    app.add_middleware(RequestMetrics, counter=app.state.http_requests, templates=templates)
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
