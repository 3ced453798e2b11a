"""Prometheus text exposition of the catalog's counters at GET /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

router = APIRouter()


def _line(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> str:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{labels} {value:g}" for labels, value in samples]
    return "\n".join(lines)


@router.get("/metrics")
def metrics(request: Request) -> Response:
    service = request.app.state.service
    stats = service.writer.stats
    reports = request.app.state.metrics_reports
    blocks = [
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
            "isbre_commit_seq", "gauge", "Highest commit_seq in the commit log.", [("", service.commit_seq())]
        ),
        _line(
            "isbre_event_streams", "gauge", "Open SSE event streams.", [("", request.app.state.event_streams)]
        ),
        _line(
            "isbre_store_capacity_bytes",
            "gauge",
            "Bytes reserved by the store.",
            [("", service.store.capacity())],
        ),
        _line(
            "isbre_metrics_reports_total",
            "counter",
            "Scan and commit reports received from clients.",
            [(f'{{type="{kind}"}}', count) for kind, count in sorted(reports.items())],
        ),
    ]
    outbox = request.app.state.outbox
    if outbox is not None:
        blocks += [
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
                [("", outbox.status.events_sent)],
            ),
            _line(
                "isbre_lineage_failures_total",
                "counter",
                "Failed lineage deliveries.",
                [("", outbox.status.failures)],
            ),
        ]
    return Response("\n".join(blocks) + "\n", media_type="text/plain; version=0.0.4")
