"""Starting and stopping what a server process runs (`running`), and the helper processes a
supervisor starts for its workers (the lineage worker)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace

from isbre.catalog import CatalogService
from isbre.catalog.commit_log import CommitLog
from isbre.catalog.feed import CommitFeed
from isbre.catalog.file_uris import file_uri
from isbre.catalog.job_process import JobProcesses
from isbre.catalog.limits import Limits
from isbre.catalog.maintainer import Maintainer
from isbre.catalog.shared_writer import connect
from isbre.catalog.warehouse_config import Warehouse
from isbre.catalog.warehouses import open_warehouses
from isbre.events.broadcast import Broadcaster
from isbre.events.fanout import FanoutChannel, FanoutOptions, FanoutProcess, shared_socket
from isbre.events.relay_handle import RelayObserver, RelayProcess
from isbre.events.retention import trim_periodically
from isbre.lineage.config import openlineage_configured
from isbre.lineage.handle import LineageObserver, LineageWorker
from isbre.lineage.names import LineageNames
from isbre.rest.delegation import Delegation
from isbre.rest.plan_work import PlanWork
from isbre.rest.runtime import RequestCounters, Runtime
from isbre.rest.scan_json import PLAN_TOKEN_KEY
from isbre.rest.settings import Settings, warehouses
from isbre.rest.shared_counters import SharedCounters

log = logging.getLogger(__name__)


def lineage_names(settings: Settings) -> LineageNames:
    """The default warehouse's namespace is `lineage_namespace`, and another warehouse's that with
    its name added; without the setting each warehouse's is its root (`file:///srv/lake`,
    `s3://bucket/prefix`): where its tables are, whatever host or port serves them."""
    served = warehouses(settings)
    roots = {w.name: w.root if (local := w.local_root()) is None else file_uri(local) for w in served}
    if settings.lineage_namespace is None:
        return LineageNames(roots[settings.prefix], {name: roots[name] for name in settings.warehouses})
    base = settings.lineage_namespace
    return LineageNames(base, {name: f"{base}/{name}" for name in settings.warehouses})


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


def _served(settings: Settings, services: list[CatalogService]) -> list[Warehouse]:
    """The warehouses as their services opened them (a helper process opens them the same way)."""
    served = zip(warehouses(settings), services, strict=True)
    return [replace(warehouse, root=service.core.warehouse) for warehouse, service in served]


def start_lineage(settings: Settings, services: list[CatalogService]) -> LineageWorker | None:
    delivery = lineage_delivery(settings)
    if delivery is None:
        log.info("lineage is off: no OpenLineage transport is configured")
        return None
    worker = LineageWorker(
        services[0].core.commit_log,
        settings.store_location(),
        settings.state_path(),
        _served(settings, services),
        lineage_names(settings),
        delivery,
    )
    worker.start()
    log.info("lineage on: the outbox runs in its own process")
    return worker


# The store's key that the catalog's id is made from (the relays' CloudEvents name it as their source).
CATALOG_ID_KEY = "catalog-id"


def start_relays(settings: Settings, services: list[CatalogService]) -> RelayProcess | None:
    """The relay process, when relays are configured; what it needs comes in its environment."""
    if not settings.relays:
        return None
    principals = {principal.name: principal for principal in settings.auth.principals}
    config = {
        "relays": [relay.model_dump(mode="json") for relay in settings.relays],
        # A relay acting for a principal sees what that principal's namespaces hold.
        "scopes": {
            relay.key(): [namespace.split(".") for namespace in principals[relay.principal].namespaces]
            for relay in settings.relays
            if relay.principal is not None
        },
        "tags": {service.name: list(service.core.record_tags) for service in services},
        "source": {
            "catalog_id": str(uuid.UUID(bytes=services[0].core.key(CATALOG_ID_KEY)[:16], version=4)),
            "default_warehouse": settings.prefix,
        },
    }
    process = RelayProcess(
        services[0].core.commit_log, settings.store_location(), settings.state_path(), settings.relays, config
    )
    process.start()
    log.info("relays on: %s", ", ".join(relay.key() for relay in settings.relays))
    return process


def catalog_limits(settings: Settings) -> Limits:
    return Limits(
        max_property_value_bytes=settings.max_property_value_kb << 10,
        max_metadata_bytes=int(settings.max_metadata_mb * (1 << 20)),
        min_free_disk_bytes=settings.min_free_disk_mb << 20,
    )


def shut_down(failure: BaseException) -> None:
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
    fanout.start()  # its process runs once the first stream comes
    return fanout


@asynccontextmanager
async def running(settings: Settings, worker: bool, counters: RequestCounters) -> AsyncIterator[Runtime]:
    """Start what the process serves with, in order; stop it in reverse, each step whatever the
    one before it did (a failed start stops what had started), so the store is always closed.
    `worker`: one of several server processes, whose supervisor runs the lineage worker and the
    events fan-out process."""
    stops: list[Callable[[], object]] = []
    try:
        services = open_warehouses(
            settings.store_location(),
            warehouses(settings),
            map_size=settings.map_size_mb << 20,
            max_batch=settings.max_batch,
            metadata_sync_s=settings.metadata_sync_seconds,
            max_queue=settings.max_queue,
            commit_wait_s=settings.commit_wait_ms / 1000,
            allowed_locations=tuple(settings.allowed_locations),
            limits=catalog_limits(settings),
            on_fatal=shut_down,
            manifest_cache_bytes=settings.manifest_cache_mb << 20,
        )
        commit_log = services[0].core.commit_log
        stops.append(services[0].close)
        if worker and settings.shared_commits:
            committer = connect(settings.state_path(), services[0].core.writer.stats)
            if committer is not None:
                stops.append(committer.close)
                for each in services:
                    each.core.swaps = committer
        jobs = JobProcesses(
            settings.store_location(),
            _served(settings, services),
            directory=settings.state_path(),
            limits=catalog_limits(settings),
        )
        for each in services:
            each.maintenance.job_processes = jobs
        broadcaster = Broadcaster(
            commit_log, capacity=settings.events_ring_size, max_bytes=int(settings.events_ring_mb * (1 << 20))
        )
        stops.append(broadcaster.close)
        trimming = asyncio.create_task(
            trim_periodically(
                commit_log,
                settings.events_retention_records,
                settings.events_retention_days,
                settings.events_trim_interval_seconds,
                # Keys are kept twice their advertised lifetime: a grace for slow retries and clock skew.
                keep_keys_us=2 * settings.idempotency_key_lifetime_minutes * 60 * 10**6,
            )
        )
        stops.append(trimming.cancel)
        outbox: LineageWorker | LineageObserver | None
        if not worker:
            outbox = start_lineage(settings, services)
            if outbox is not None:
                stops.append(outbox.stop)
        elif lineage_delivery(settings) is not None:  # the supervisor runs the lineage worker
            outbox = LineageObserver(commit_log, settings.state_path())
        else:
            outbox = None
        relays: RelayProcess | RelayObserver | None
        if not worker:
            relays = start_relays(settings, services)
            if relays is not None:
                stops.append(relays.stop)
        elif settings.relays:  # the supervisor runs the relay process
            relays = RelayObserver(commit_log, settings.state_path(), settings.relays)
        else:
            relays = None
        fanout = _start_fanout(settings, commit_log, worker)
        if fanout is not None:
            stops.append(fanout.stop)
        # Commits another process makes on this store (an embedded catalog, a tool) reach the
        # streams too; the lineage worker polls the log on its own.
        feed = CommitFeed(commit_log)
        stops.append(feed.close)
        feed.follow(broadcaster.publish_from_log)
        if isinstance(fanout, FanoutProcess):  # the shared one follows the store itself
            feed.follow(fanout.wake)
        feed.start()
        shared = SharedCounters(settings.state_path()) if worker else None
        maintainer = (
            Maintainer(services, settings.maintenance_interval_seconds) if settings.maintenance else None
        )
        if maintainer is not None:
            maintainer.start()
            stops.append(maintainer.stop)
        server_planned = frozenset(
            name for name, spec in settings.served() if spec.scan_planning_mode == "server"
        )
        planning = PlanWork(
            settings.max_concurrent_plans,
            settings.plan_wait_seconds,
            services[0].core.key(PLAN_TOKEN_KEY),
            server_planned,
        )
        stops.append(planning.close)
        found = Runtime(
            settings,
            counters,
            {each.name: each for each in services},
            {
                name: Delegation.of(each, spec.delegation)
                for (name, spec), each in zip(settings.served(), services, strict=True)
            },
            broadcaster,
            outbox,
            relays,
            fanout,
            shared,
            maintainer,
            planning,
        )
        if shared is not None:
            stops.append(shared.close)
            publishing = asyncio.create_task(shared.publish_periodically(found.own_counts))
            stops.append(publishing.cancel)
        for each in services:
            log.info("isbre warehouse %r at %s", each.name, each.core.warehouse)
        if shared is not None:  # this worker's file says it has started: /ready and the supervisor count them
            shared.publish(found.own_counts())
        yield found
    finally:
        for stop in reversed(stops):
            try:
                stop()
            except Exception:
                log.exception("shutting down: %s failed", getattr(stop, "__qualname__", stop))
