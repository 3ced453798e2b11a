"""Prometheus text exposition of the catalog's counters at GET /metrics."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from isbre.catalog.append_rebase import OUTCOMES
from isbre.catalog.sink_rows import SinkRows
from isbre.catalog.store import StoreUnavailableError
from isbre.catalog.writer import Histogram
from isbre.rest.access import PUBLIC
from isbre.rest.labels import labels, method_label
from isbre.rest.runtime import runtime
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

router = APIRouter(dependencies=[Depends(PUBLIC)])
log = logging.getLogger(__name__)


def _line(name: str, kind: str, help_text: str, samples: Sequence[tuple[str, float]]) -> str:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [
        f"{name}{labels} {value if isinstance(value, int) else f'{value:g}'}" for labels, value in samples
    ]
    return "\n".join(lines)


def _relays(relays: dict[str, dict[str, Any]]) -> list[str]:
    def each(field: str) -> list[tuple[str, float]]:
        return [(labels(relay=name), relay[field]) for name, relay in relays.items()]

    return [
        _line(
            "isbre_relay_position",
            "gauge",
            "Last commit_seq a relay has sent or passed over.",
            each("position"),
        ),
        _line("isbre_relay_lag", "gauge", "Commits a relay has still to send or pass over.", each("lag")),
        _line(
            "isbre_relay_messages_total",
            "counter",
            "Messages a relay's target acknowledged.",
            each("messages"),
        ),
        _line(
            "isbre_relay_failures_total", "counter", "Failed tries of a relay's messages.", each("failures")
        ),
    ]


def _histogram(name: str, help_text: str, histogram: Histogram) -> str:
    samples: list[tuple[str, float]] = []
    cumulative = 0
    for bound, count in zip((*histogram.bounds, float("inf")), histogram.counts, strict=True):
        cumulative += count
        samples.append(("_bucket" + labels(le="+Inf" if bound == float("inf") else f"{bound:g}"), cumulative))
    samples += [("_sum", histogram.total), ("_count", cumulative)]
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    return "\n".join(lines + [f"{name}{suffix} {value:g}" for suffix, value in samples])


class RouteTemplates:
    """The route template of a path, for requests refused before routing (authentication, limits)."""

    def __init__(self, routes: Iterable[tuple[str, str]], prefix: str) -> None:
        self._routes = [(method, template, compile_path(template)[0]) for method, template in routes]
        self._prefix = prefix

    def find(self, method: str, path: str) -> str:
        # Unprefixed aliases (/v1/namespaces/...) are rewritten further in: try both spellings.
        candidates = (path, f"/v1/{self._prefix}{path[3:]}") if path.startswith("/v1/") else (path,)
        for method_, template, pattern in self._routes:
            if method_ == method and any(pattern.match(candidate) for candidate in candidates):
                return template
        return "unmatched"


class RequestMetrics:
    """Counts every request by method, route template and status; outermost, so refusals count too.

    A request whose answer starts later than `slow_seconds` after it arrived is logged as a
    warning (the start, so that a long event stream is not slow): the one trace an operator has of
    a stall that no error reports."""

    def __init__(
        self,
        app: ASGIApp,
        counter: Counter[tuple[str, str, int]],
        templates: RouteTemplates,
        slow_seconds: float = 0.0,
    ) -> None:
        self.app = app
        self.counter = counter
        self.templates = templates
        self.slow_seconds = slow_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route: list[str] = []
        status = [500]
        arrived = time.monotonic()

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                waited = time.monotonic() - arrived
                if self.slow_seconds and waited > self.slow_seconds:
                    log.warning(
                        "slow request: %s %r answered %d after %.3f s (slow_request_seconds = %g)",
                        scope["method"],
                        scope["path"],
                        status[0],
                        waited,
                        self.slow_seconds,
                    )
            await send(message)

        try:
            await self.app({**scope, ROUTE_KEY: route}, receive, watch)
        finally:
            method = scope["method"]
            template = route[0] if route else self.templates.find(method, scope["path"])
            self.counter[(method_label(method), template, status[0])] += 1


ROUTE_KEY = "isbre.route"


class RouteCapture:
    """Innermost: passes the matched route's template out to RequestMetrics (other layers copy the scope)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            route, holder = scope.get("route"), scope.get(ROUTE_KEY)
            if route is not None and holder is not None:
                holder.append(getattr(route, "path_format", None) or getattr(route, "path", "?"))


def _sink_rows(totals: list[SinkRows], named: bool) -> str:
    """`named`: per table, by warehouse and name; else (the endpoint is public while authentication
    guards the names) summed over every table: a table's uuid is no label either, as the catalog
    keeps each table's state under it."""
    summed: Counter[tuple[tuple[str, str], ...]] = Counter()
    for table in totals:
        for name, count in table.rows.items():
            disposition, _, reason = name.partition(".")
            where = [("warehouse", table.warehouse), ("table", table.table)] if named else []
            where.append(("disposition", disposition))
            summed[tuple(where + ([("reason", reason)] if reason else []))] += count
    samples = [(labels(**dict(where)), count) for where, count in sorted(summed.items())]
    return _line(
        "isbre_sink_rows_total",
        "counter",
        "Rows given to a sink table's sinks, by what became of them (catalog/sink_rows.py).",
        samples,
    )


@router.get("/metrics")
def metrics(request: Request) -> Response:
    """This process's counters, or with several workers the sum of every worker's."""
    state = runtime(request)
    service = state.service
    counts = state.own_counts()
    if state.shared_counters is not None:
        counts = state.shared_counters.total(counts)
    stats, reports = counts.writer, counts.reports
    outbox = state.outbox
    try:  # what the store says: absent while a database store is unreachable, which store_up tells
        stored = [
            _line(
                "isbre_commit_seq",
                "gauge",
                "Highest commit_seq in the commit log.",
                [("", service.core.commit_log.commit_seq())],
            ),
            _line(
                "isbre_metadata_files_unsynced",
                "gauge",
                "Table metadata files written by commits and not synced yet (their bytes wait in the store).",
                [("", service.core.unsynced_files())],
            ),
            _line(
                "isbre_store_capacity_bytes",
                "gauge",
                "Bytes reserved by the store.",
                [("", service.core.store.capacity())],
            ),
        ]
        stored.append(_sink_rows(service.tables.sink_rows(), named=not state.settings.auth.enabled))
        if outbox is not None:
            status = outbox.status
            stored += [
                _line(
                    "isbre_lineage_backlog",
                    "gauge",
                    "Commit records not yet sent as lineage.",
                    [("", outbox.backlog())],
                ),
                _line(
                    "isbre_lineage_events_sent_total",
                    "counter",
                    "Lineage events delivered.",
                    [("", status.events_sent)],
                ),
                _line(
                    "isbre_lineage_failures_total",
                    "counter",
                    "Failed lineage deliveries.",
                    [("", status.failures)],
                ),
            ]
        if state.relays is not None:
            stored += _relays(state.relays.report()["relays"])
    except StoreUnavailableError:
        stored = []
    blocks = [
        _line(
            "isbre_store_up",
            "gauge",
            "1 while the store answers, 0 while it cannot be reached.",
            [("", int(bool(stored)))],
        ),
        *stored,
        _line(
            "isbre_commit_batches_total",
            "counter",
            "Write transactions committed by the writer.",
            [("", stats.batches)],
        ),
        _line(
            "isbre_commit_mutations_total",
            "counter",
            "Mutations committed by the writer.",
            [("", stats.mutations)],
        ),
        _line(
            "isbre_commit_shared_batches_total",
            "counter",
            "Write transactions that held the table commits of more than one worker process.",
            [("", stats.shared_batches)],
        ),
        _line(
            "isbre_commit_rebases_total",
            "counter",
            "Table commits refused for a moved branch, by what became of them: made again on the new "
            "head and committed, gave up, or not rebased (and why).",
            [(labels(outcome=outcome), counts.rebases[outcome]) for outcome in OUTCOMES],
        ),
        _line("isbre_event_streams", "gauge", "Open SSE event streams.", [("", counts.streams)]),
        _line(
            "isbre_metrics_reports_total",
            "counter",
            "Scan and commit reports received from clients.",
            [(labels(type=kind), count) for kind, count in sorted(reports.items())],
        ),
    ]
    blocks.append(
        _line(
            "isbre_writer_queue_depth",
            "gauge",
            "Mutations waiting for the writer's next transaction (with workers: every writer's).",
            [("", counts.queued)],
        )
    )
    blocks.append(
        _line(
            "isbre_writer_committing",
            "gauge",
            "Mutations in the write transaction under way (with workers: every writer's); one "
            "that stays is waiting for the store.",
            [("", counts.committing)],
        )
    )
    blocks.append(
        _histogram(
            "isbre_commit_latency_seconds", "Submission to durable answer, per mutation.", stats.latency
        )
    )
    blocks.append(_histogram("isbre_commit_batch_size", "Mutations per write transaction.", stats.batch_size))
    if state.maintainer is not None:  # this process's own jobs: the one holding the lease runs them
        done = state.maintainer.stats
        blocks += [
            _line(
                "isbre_maintenance_jobs_total",
                "counter",
                "Maintenance jobs run by this process, by job and outcome.",
                [(labels(job=job, outcome=outcome), n) for (job, outcome), n in sorted(done.jobs.items())],
            ),
            _line(
                "isbre_maintenance_snapshots_removed_total",
                "counter",
                "Snapshots expired by maintenance.",
                [("", done.snapshots_removed)],
            ),
            _line(
                "isbre_maintenance_files_deleted_total",
                "counter",
                "Files maintenance deleted once they were unreachable.",
                [("", done.files_deleted)],
            ),
            _line(
                "isbre_maintenance_files_rewritten_total",
                "counter",
                "Data files compaction replaced by files of the target size.",
                [("", done.files_rewritten)],
            ),
            _line(
                "isbre_maintenance_bytes_rewritten_total",
                "counter",
                "Bytes of the data files compaction replaced.",
                [("", done.bytes_rewritten)],
            ),
            _line(
                "isbre_maintenance_foreign_paths_total",
                "counter",
                "Paths outside their table that a table's metadata named to a job, which left them alone.",
                [("", done.foreign_paths)],
            ),
            _line(
                "isbre_maintenance_commits_abandoned_total",
                "counter",
                "Maintenance jobs' commits that Iceberg's conflict rules refused on the table's head.",
                [(labels(job=job), n) for job, n in sorted(done.abandoned.items())],
            ),
        ]
    requests = counts.requests
    blocks.append(
        _line(
            "isbre_http_requests_total",
            "counter",
            "HTTP requests by method, route template and status ('unmatched': refused before routing).",
            [
                (labels(method=method, route=route, status=status), count)
                for (method, route, status), count in sorted(requests.items())
            ],
        )
    )
    return Response("\n".join(blocks) + "\n", media_type="text/plain; version=0.0.4")
