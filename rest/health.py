"""GET /health: the state of each component; GET /v1/lineage/status: the lineage outbox."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from isbre.catalog import CatalogService
from isbre.catalog.maintainer import Maintainer
from isbre.catalog.store import StoreUnavailableError
from isbre.rest.access import PUBLIC, READER, access
from isbre.rest.event_stream import events_health
from isbre.rest.runtime import runtime
from isbre.rest.shared_counters import running_workers
from isbre.rest.wire import json_response

router = APIRouter()
PROBE = [Depends(PUBLIC)]


def lineage_status(request: Request) -> dict[str, Any]:
    outbox = runtime(request).outbox
    if outbox is None:
        return {"enabled": False}
    status = outbox.status
    return {
        "enabled": True,
        "process": outbox.pid,
        # False on a server whose worker waits while another server's delivers (a shared store).
        "delivering": outbox.delivering,
        "delivered_commit_seq": status.delivered_seq,
        "backlog": outbox.backlog(),
        "events_sent": status.events_sent,
        "failures": status.failures,
        "last_error": status.last_error,
        "last_failure_at": status.last_failure_at,
        "last_delivery_at": status.last_delivery_at,
        "recent_failures": status.recent_failures,
        "mapping_errors": status.mapping_errors,
    }


@router.get("/v1/lineage/status", dependencies=[Depends(READER)])
def get_lineage_status(request: Request) -> Response:
    return json_response(lineage_status(request))


def liveness(service: CatalogService) -> tuple[int, dict[str, Any]]:
    if not service.core.writer.alive:
        return 503, {"status": "down", "reason": "the writer has stopped: commits cannot be made"}
    return 200, {"status": "ok"}


@router.get("/live", dependencies=PROBE)
def live(request: Request) -> Response:
    """The process answers and can still commit (Kubernetes restarts it when this fails)."""
    status, body = liveness(runtime(request).service)
    return json_response(body, status_code=status)


@router.get("/ready", dependencies=PROBE)
def ready(request: Request) -> Response:
    """Ready for traffic: the store opens a transaction and the writer takes mutations."""
    service = runtime(request).service
    try:
        service.core.commit_log.commit_seq()
    except Exception as exc:
        return json_response({"status": "down", "reason": f"store: {type(exc).__name__}"}, status_code=503)
    if not service.core.writer.alive:
        return json_response({"status": "down", "reason": "writer stopped"}, status_code=503)
    state = runtime(request)
    if state.shared_counters is not None:  # one of several workers: ready when all of them are
        up, wanted = len(running_workers(state.settings.state_path())), state.settings.worker_count()
        if up < wanted:
            reason = f"starting: {up} of {wanted} workers answer"
            return json_response({"status": "down", "reason": reason}, status_code=503)
    return json_response({"status": "ok"})


def _statuses_only(body: dict[str, Any]) -> dict[str, Any]:
    """What anyone may know of the server's health: each component's status, no paths, hosts,
    users or process ids."""
    components = {name: {"status": part["status"]} for name, part in body["components"].items()}
    return {"status": body["status"], "components": components}


@router.get("/health", dependencies=PROBE)
def health(request: Request) -> Response:
    """The state of each component; the details (store path or database, processes, lineage) only
    for an admin, or for anyone while authentication is off."""
    status, body = _health(request)
    if not access(request).may("admin"):
        body = _statuses_only(body)
    return json_response(body, status_code=status)


def maintenance_health(maintainer: Maintainer | None) -> dict[str, Any]:
    """Degraded, saying why, while a table's maintenance has failed several times in a row, or met
    files outside the table."""
    if maintainer is None:
        return {"status": "ok", "enabled": False}
    stats = maintainer.stats
    failing = stats.degraded()
    body: dict[str, Any] = {
        "status": "degraded" if failing else "ok",
        "enabled": True,
        # On a shared store or with several workers, one process maintains: this one, or another.
        "maintaining": maintainer.holding,
        "last_run_at": stats.last_run_at,
    }
    if failing:
        body["failing"] = failing[:10]
    return body


def relays_health(request: Request) -> dict[str, Any]:
    """Degraded while the relay process is down or a relay's last try failed with commits left to
    send: they wait, none is lost."""
    relays = runtime(request).relays
    if relays is None:
        return {"status": "ok", "enabled": False}
    report = relays.report()
    for each in report["relays"].values():
        each["status"] = "degraded" if each["failing"] and each["lag"] > 0 else "ok"
    failing = report["process"] is None or any(each["status"] != "ok" for each in report["relays"].values())
    return {"status": "degraded" if failing else "ok", "enabled": True, **report}


def _health(request: Request) -> tuple[int, dict[str, Any]]:
    service = runtime(request).service
    try:
        floor, high = service.core.commit_log.log_bounds()
        store = {
            "status": "ok",
            **service.core.store.describe(),
            "commit_seq": high,
            "oldest_commit_seq": floor,
        }
        lineage = lineage_status(request)
        relays = relays_health(request)
    except StoreUnavailableError as exc:
        # The database is down: nothing can be served until it is back (each server reconnects).
        store = {"status": "down", **service.core.store.describe(), "reason": str(exc)}
        return 503, {"status": "down", "process": os.getpid(), "components": {"store": store}}
    # Lineage that is failing, or whose worker is restarting, delays events but loses none:
    # the catalog is degraded, not down.
    degraded = lineage.get("enabled") and (
        lineage["process"] is None or (lineage["failures"] and lineage["backlog"] > 0)
    )
    events = events_health(runtime(request))
    maintenance = maintenance_health(runtime(request).maintainer)
    body = {
        "status": "degraded"
        if degraded or {events["status"], maintenance["status"], relays["status"]} != {"ok"}
        else "ok",
        "process": os.getpid(),  # with several workers, the one that answered
        "components": {
            "store": store,
            "writer": {
                "status": "ok" if service.core.writer.alive else "down",
                "queue_depth": service.core.writer.queue_depth(),
            },
            "events": events,
            "lineage": {"status": "degraded" if degraded else "ok", **lineage},
            "maintenance": maintenance,
            "relays": relays,
        },
    }
    return 200, body
