"""POST /v1/{prefix}/events: the draft Iceberg REST events endpoint, served from the same log as SSE.

The draft (apache/iceberg pull request 12584) may still change. Events are
read in commit_seq order; the continuation token is the position after the
last record examined, so paging resumes exactly where the previous page ended.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import anyio
from fastapi import APIRouter, Depends, Request, Response
from isbre.catalog.commit_log import CommitLog
from isbre.catalog.records import CommitRecord
from isbre.events.filters import EventFilter
from isbre.events.subscription import EVERYTHING, check_cursor
from isbre.rest.access import READER
from isbre.rest.runtime import runtime
from isbre.rest.wire import caller_of, warehouse_tags
from pydantic import BaseModel, ConfigDict, Field

# Any authenticated caller may follow events; its namespace scopes filter what it sees.
router = APIRouter(dependencies=[Depends(READER)])

OPERATION_TYPES = {
    "table.create": "create-table",
    "table.commit": "update-table",
    "table.drop": "drop-table",
    "table.rename": "rename-table",
    "table.register": "register-table",
    "view.create": "create-view",
    "view.replace": "replace-view",
    "view.drop": "drop-view",
    "view.rename": "rename-view",
    "view.register": "register-view",
    "namespace.create": "create-namespace",
    "namespace.update": "update-namespace-properties",
    "namespace.drop": "drop-namespace",
}
DEFAULT_PAGE_SIZE = 100
# Records examined per request at most, so a narrow filter over a long log still answers quickly.
SCAN_LIMIT = 10_000
_TOKEN_PREFIX = "isbre-events-v1:"


class QueryEventsRequest(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    continuation_token: str | None = Field(None, alias="continuation-token")
    page_size: int | None = Field(None, alias="page-size", ge=1)
    since_timestamp_ms: int | None = Field(None, alias="since-timestamp-ms", ge=0)
    operation_types: list[str] | None = Field(None, alias="operation-types")
    catalog_objects_by_name: list[list[str]] | None = Field(None, alias="catalog-objects-by-name")


def encode_token(cursor: int) -> str:
    return base64.urlsafe_b64encode(f"{_TOKEN_PREFIX}{cursor}".encode()).decode()


def decode_token(token: str) -> int:
    try:
        text = base64.urlsafe_b64decode(token.encode()).decode()
        if not text.startswith(_TOKEN_PREFIX):
            raise ValueError(token)
        return int(text[len(_TOKEN_PREFIX) :])
    except ValueError as exc:
        raise ValueError(f"Invalid continuation-token: {token!r}") from exc


def _identifier(namespace: list[str], name: str | None) -> dict[str, Any]:
    return {"namespace": namespace, "name": name}


def operation(record: CommitRecord) -> dict[str, Any]:
    kind = record.kind
    op: dict[str, Any] = {"operation-type": OPERATION_TYPES[kind]}
    if kind.startswith("namespace."):
        op["namespace"] = record.namespace
        properties = record.properties or {}
        if kind == "namespace.create":
            op["properties"] = properties
        elif kind == "namespace.update":
            op["updated"] = sorted(properties.get("updated", {}))
            op["removed"] = properties.get("removed", [])
        return op
    uuid_key = "table-uuid" if kind.startswith("table.") else "view-uuid"
    op[uuid_key] = record.table_uuid
    if kind.endswith(".rename"):
        previous = record.previous or {}
        op["source"] = _identifier(previous.get("namespace", []), previous.get("name"))
        op["destination"] = _identifier(record.namespace, record.name)
    else:
        op["identifier"] = _identifier(record.namespace, record.name)
    if kind == "table.drop":
        op["purge"] = bool((record.properties or {}).get("purge"))
    if record.metadata_location:
        op["metadata-location"] = record.metadata_location  # an isbre addition: where to load the new state
    return op


def event(record: CommitRecord) -> dict[str, Any]:
    return {
        "event-id": str(record.commit_seq),
        "request-id": record.txn or record.run_id,
        "request-event-count": record.txn_size or 1,
        "timestamp-ms": record.ts // 1000,
        "operation": operation(record),
    }


def _object_names(record: CommitRecord) -> list[list[str]]:
    names = [record.namespace + ([record.name] if record.name else [])]
    if record.previous:
        names.append(record.previous["namespace"] + [record.previous["name"]])
    return names


def _matches(record: CommitRecord, query: QueryEventsRequest) -> bool:
    if record.kind not in OPERATION_TYPES:  # isbre's own kinds (a purge's report) have no spec type
        return False
    if query.operation_types and OPERATION_TYPES[record.kind] not in query.operation_types:
        return False
    if query.catalog_objects_by_name:
        return any(
            name[: len(wanted)] == wanted
            for wanted in query.catalog_objects_by_name
            for name in _object_names(record)
        )
    return True


def page(
    commit_log: CommitLog, query: QueryEventsRequest, page_size: int, visible: EventFilter = EVERYTHING
) -> dict[str, Any]:
    if query.continuation_token:
        cursor = decode_token(query.continuation_token)
    elif query.since_timestamp_ms is not None:
        cursor = commit_log.cursor_before(query.since_timestamp_ms * 1000)
    else:
        cursor = commit_log.log_bounds()[0] - 1
    check_cursor(commit_log, cursor)

    events: list[dict[str, Any]] = []
    scanned = 0
    while len(events) < page_size and scanned < SCAN_LIMIT:
        records = commit_log.commits_since(cursor, min(1000, SCAN_LIMIT - scanned))
        if not records:
            break
        for record in records:
            cursor = record.commit_seq
            scanned += 1
            if visible.matches(record) and _matches(record, query):
                events.append(event(record))
                if len(events) == page_size:
                    break
    return {"continuation-token": encode_token(cursor), "events": events}


@router.post("/events")
async def query_events(request: Request) -> Response:
    query = QueryEventsRequest.model_validate_json(await request.body() or b"{}")
    running = runtime(request)
    page_size = min(query.page_size or DEFAULT_PAGE_SIZE, running.settings.max_page_size)
    caller = caller_of(request)
    visible = EventFilter(
        scopes=caller.namespaces if caller else (), warehouses=frozenset(warehouse_tags(request))
    )
    body = await anyio.to_thread.run_sync(page, running.service.core.commit_log, query, page_size, visible)
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")
