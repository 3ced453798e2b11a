"""Table routes of the Iceberg REST API, and the multi-table transaction."""

from __future__ import annotations

import hashlib
import logging
import uuid

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from starlette.concurrency import run_in_threadpool

from catalog import Identifier, TableChange, TableState
from catalog.metadata_files import metadata_json
from rest.idempotency import idempotent_mutation, no_content
from rest.models import (
    CommitTableRequest,
    CommitTransactionRequest,
    CreateTableRequest,
    RegisterTableRequest,
    RenameTableRequest,
    ReportMetricsRequest,
)
from rest.wire import identifiers_page, load_result, namespace_from_path, parse, raw_body, service

log = logging.getLogger(__name__)
router = APIRouter()


def _ident(namespace: str, table: str) -> Identifier:
    return Identifier.of(namespace_from_path(namespace), table)


def _refs_only(state: TableState) -> bytes:
    """Metadata with only the snapshots that a branch or tag points at."""
    wanted = {ref.snapshot_id for ref in state.metadata.refs.values()}
    metadata = state.metadata.model_copy(
        update={"snapshots": [s for s in state.metadata.snapshots if s.snapshot_id in wanted]}
    )
    return metadata_json(metadata)


def _committed_table(states: list[TableState], raw: bytes) -> Response:
    return load_result(states[0].metadata_location, states[0].json)


def _registered_table(state: TableState, raw: bytes) -> Response:
    return load_result(state.metadata_location, state.json)


def _etag(metadata_location: str, snapshots: str) -> str:
    return '"' + hashlib.sha256(f"{metadata_location}|{snapshots}".encode()).hexdigest()[:32] + '"'


@router.get("/namespaces/{namespace}/tables")
def list_tables(
    request: Request,
    namespace: str,
    page_token: str | None = Query(None, alias="pageToken"),
    page_size: int | None = Query(None, alias="pageSize"),
) -> Response:
    ns = namespace_from_path(namespace)
    return identifiers_page(
        request, page_token, page_size, lambda after, limit: service(request).list_tables(ns, after, limit)
    )


@router.post("/namespaces/{namespace}/tables")
@idempotent_mutation(_committed_table)
def create_table(request: Request, namespace: str, raw: bytes = Depends(raw_body)) -> Response:
    body = parse(CreateTableRequest, raw)
    state = service(request).create_table(
        Identifier.of(namespace_from_path(namespace), body.name),
        body.table_schema,
        body.partition_spec or UNPARTITIONED_PARTITION_SPEC,
        body.write_order or UNSORTED_SORT_ORDER,
        location=body.location,
        properties=body.properties,
        stage_only=body.stage_create,
    )
    return load_result(state.metadata_location, state.json)


@router.get("/namespaces/{namespace}/tables/{table}")
async def load_table(
    request: Request, namespace: str, table: str, snapshots: str = Query("all", pattern="^(all|refs)$")
) -> Response:
    # The hottest read runs on the event loop: a pointer read and a cache hit take microseconds.
    # Only a cache miss reads a file, and that goes to the thread pool.
    catalog = service(request)
    ident = _ident(namespace, table)
    state = catalog.load_table_if_cached(ident) or await run_in_threadpool(catalog.load_table, ident)
    etag = _etag(state.metadata_location or "", snapshots)
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers={"ETag": etag})
    response = load_result(state.metadata_location, _refs_only(state) if snapshots == "refs" else state.json)
    response.headers["ETag"] = etag
    return response


@router.head("/namespaces/{namespace}/tables/{table}")
def table_exists(request: Request, namespace: str, table: str) -> Response:
    service(request).table_pointer(_ident(namespace, table))
    return Response(status_code=204)


@router.get("/namespaces/{namespace}/tables/{table}/coverage")
def table_coverage(
    request: Request,
    namespace: str,
    table: str,
    source_id: str | None = Query(None, alias="source-id"),
    topic: str | None = Query(None),
    partition: int | None = Query(None),
    snapshot_id: int | None = Query(None, alias="snapshot-id"),
) -> Response:
    """isbre extension: the source offsets the table holds, as sinks declared them in their commits."""
    found = service(request).coverage(_ident(namespace, table), snapshot_id)
    streams = [
        entry
        for entry in found.coverage.to_json()
        if (source_id is None or entry["source-id"] == source_id)
        and (topic is None or entry["topic"] == topic)
        and (partition is None or entry["partition"] == partition)
    ]
    body: dict[str, object] = {"table-uuid": found.table_uuid, "coverage": streams}
    if snapshot_id is not None:
        body["commit-seq"] = found.commit_seq
    return JSONResponse(body)


@router.post("/namespaces/{namespace}/tables/{table}")
@idempotent_mutation(_committed_table)
def commit_table(request: Request, namespace: str, table: str, raw: bytes = Depends(raw_body)) -> Response:
    body = parse(CommitTableRequest, raw)
    ident = _ident(namespace, table)
    if body.identifier is not None and body.identifier.to_identifier() != ident:
        raise ValueError(
            f"Identifier in the body ({body.identifier.to_identifier()}) does not match the path ({ident})"
        )
    state = service(request).commit_table(TableChange(ident, body.requirements, body.updates))
    return load_result(state.metadata_location, state.json)


@router.delete("/namespaces/{namespace}/tables/{table}")
@idempotent_mutation(no_content)
def drop_table(
    request: Request, namespace: str, table: str, purge: bool = Query(False, alias="purgeRequested")
) -> Response:
    service(request).drop_table(_ident(namespace, table), purge=purge)
    return Response(status_code=204)


@router.post("/namespaces/{namespace}/register")
@idempotent_mutation(_registered_table)
def register_table(request: Request, namespace: str, raw: bytes = Depends(raw_body)) -> Response:
    body = parse(RegisterTableRequest, raw)
    ident = Identifier.of(namespace_from_path(namespace), body.name)
    state = service(request).register_table(ident, body.metadata_location, overwrite=body.overwrite)
    return load_result(state.metadata_location, state.json)


@router.post("/tables/rename")
@idempotent_mutation(no_content)
def rename_table(request: Request, raw: bytes = Depends(raw_body)) -> Response:
    body = parse(RenameTableRequest, raw)
    service(request).rename_table(body.source.to_identifier(), body.destination.to_identifier())
    return Response(status_code=204)


@router.post("/namespaces/{namespace}/tables/{table}/metrics")
@idempotent_mutation(no_content)
def report_metrics(request: Request, namespace: str, table: str, raw: bytes = Depends(raw_body)) -> Response:
    report = parse(ReportMetricsRequest, raw)
    service(request).table_pointer(_ident(namespace, table))
    request.app.state.metrics_reports[report.report_type] += 1
    log.debug("metrics report %s for %s.%s", report.report_type, namespace, table)
    return Response(status_code=204)


@router.post("/transactions/commit")
@idempotent_mutation(no_content)
def commit_transaction(request: Request, raw: bytes = Depends(raw_body)) -> Response:
    body = parse(CommitTransactionRequest, raw)
    if not body.table_changes:
        raise ValueError("A transaction needs at least one table change")
    changes = []
    for change in body.table_changes:
        if change.identifier is None:
            raise ValueError("Every table change of a transaction needs an identifier")
        changes.append(TableChange(change.identifier.to_identifier(), change.requirements, change.updates))
    service(request).commit_tables(changes, txn=str(uuid.uuid4()))
    return Response(status_code=204)
