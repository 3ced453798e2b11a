"""Table routes of the Iceberg REST API, and the multi-table transaction."""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from importlib.metadata import version
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from isbre.catalog import TableChange, TableState
from isbre.catalog.maintenance import health
from isbre.catalog.metadata_files import metadata_json
from isbre.rest.access import InNamespace, ManagesNamespace, ReadsNamespace, Writer, WritesNamespace
from isbre.rest.delegation import HEADER, VENDED, Delegation, TableAccess, wanted
from isbre.rest.idempotency import NO_CONTENT, TABLE, idempotent_mutation
from isbre.rest.labels import report_type
from isbre.rest.models import (
    CommitTableRequest,
    CommitTransactionRequest,
    CreateTableRequest,
    MaintenanceRequest,
    RegisterTableRequest,
    RenameTableRequest,
    ReportMetricsRequest,
    SignRequest,
)
from isbre.rest.runtime import runtime
from isbre.rest.wire import (
    Context,
    identifiers_page,
    json_response,
    load_result,
    parse,
    raw_body,
    referenced_by,
    service,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from starlette.concurrency import run_in_threadpool

log = logging.getLogger(__name__)
router = APIRouter()


def _refs_only(state: TableState) -> bytes:
    """Metadata with only the snapshots that a branch or tag points at."""
    wanted = {ref.snapshot_id for ref in state.metadata.refs.values()}
    metadata = state.metadata.model_copy(
        update={"snapshots": [s for s in state.metadata.snapshots if s.snapshot_id in wanted]}
    )
    return metadata_json(metadata)


# How a server version writes its answers: an upgrade may write the same metadata otherwise.
_ANSWERS = version("isbre")


def etag(metadata_location: str, snapshots: str, config: dict[str, str] | None) -> str:
    """The entity tag of a loadTable answer: it changes whenever anything the answer carries
    does (metadata files never change in place, so their location names their contents; the
    config, which carries what the server's storage settings say; the snapshots asked for; the
    server's version), and is the same from every worker and replica that would answer alike."""
    found = json.dumps([metadata_location, snapshots, config or {}, _ANSWERS], sort_keys=True)
    return '"' + hashlib.sha256(found.encode()).hexdigest()[:32] + '"'


def not_modified(if_none_match: str | None, tag: str) -> bool:
    """Whether `If-None-Match` names `tag` (weak comparison, as RFC 9110 has it for this header)."""
    if not if_none_match:
        return False
    listed = [each.strip().removeprefix("W/") for each in if_none_match.split(",")]
    return "*" in listed or tag in listed


def _delegation(request: Request) -> Delegation:
    """The access delegation of the route's warehouse."""
    return runtime(request).delegation[service(request).name]


def _planning(request: Request) -> dict[str, str]:
    """A loaded table's `config` entries on scan planning (the warehouse's `scan_planning_mode`)."""
    return runtime(request).planning.client_config(service(request).name)


def delegated(request: Request, target: InNamespace, table: str, location: str) -> TableAccess:
    """The table's config, storage credentials and signer settings for the access the client asked for."""
    modes = wanted(request.headers.get(HEADER))
    catalog = service(request)
    namespace = quote(request.path_params["namespace"], safe="")
    signer = (
        str(request.base_url).rstrip("/"),
        f"v1/{catalog.name}/namespaces/{namespace}/tables/{quote(table, safe='')}/sign",
    )
    return _delegation(request).table_config(modes, location, target.access.may("writer"), signer)


def _table_result(
    request: Request, target: InNamespace, table: str, state: TableState, metadata: bytes
) -> Response:
    access = delegated(request, target, table, state.metadata.location)
    config = {**access.config, **_planning(request)}
    return load_result(state.metadata_location, metadata, config, access.credentials, access.remote_signing)


@router.get("/namespaces/{namespace:name}/tables")
def list_tables(
    request: Request,
    target: ReadsNamespace,
    page_token: str | None = Query(None, alias="pageToken"),
    page_size: int | None = Query(None, alias="pageSize"),
) -> Response:
    ns = target.namespace
    return identifiers_page(
        request, page_token, page_size, lambda after, limit: service(request).tables.listing(ns, after, limit)
    )


@router.post("/namespaces/{namespace:name}/tables")
@idempotent_mutation(TABLE)
def create_table(
    request: Request, target: WritesNamespace, context: Context, raw: bytes = Depends(raw_body)
) -> Response:
    body = parse(CreateTableRequest, raw)
    catalog = service(request)
    state = catalog.tables.create(
        target.ident(body.name),
        body.table_schema,
        body.partition_spec or UNPARTITIONED_PARTITION_SPEC,
        body.write_order or UNSORTED_SORT_ORDER,
        location=body.location,
        properties=body.properties,
        stage_only=body.stage_create,
        context=context.within(target.access.places(catalog)),
    )
    return _table_result(request, target, body.name, state, state.json)


@router.get("/namespaces/{namespace:name}/tables/{table:name}")
async def load_table(
    request: Request,
    target: ReadsNamespace,
    table: str,
    snapshots: str = Query("all", pattern="^(all|refs)$"),
    through: str | None = Query(None, alias="referenced-by"),
) -> Response:
    # The hottest read runs on the event loop: a pointer read and a cache hit take microseconds.
    # Only a cache miss reads a file, and that goes to the thread pool.
    catalog = service(request)
    ident = target.ident(table)
    referenced_by(through)
    state = catalog.tables.load_if_cached(ident)
    if state is None:
        state = await run_in_threadpool(catalog.tables.load, ident)
    metadata = _refs_only(state) if snapshots == "refs" else state.json
    if wanted(request.headers.get(HEADER)):
        # Credentials come with every answer: no 304 that would leave a client with old ones.
        return await run_in_threadpool(_table_result, request, target, table, state, metadata)
    config = _planning(request) or None
    if state.metadata.location.startswith("s3://"):  # the bucket's endpoint, path style, region
        config = {
            **_delegation(request).table_config(set(), state.metadata.location, False, None).config,
            **(config or {}),
        }
    tag = etag(state.metadata_location or "", snapshots, config)
    if not_modified(request.headers.get("if-none-match"), tag):
        return Response(status_code=304, headers={"ETag": tag})
    response = load_result(state.metadata_location, metadata, config)
    response.headers["ETag"] = tag
    return response


@router.get("/namespaces/{namespace:name}/tables/{table:name}/credentials")
def load_credentials(
    request: Request,
    target: ReadsNamespace,
    table: str,
    through: str | None = Query(None, alias="referenced-by"),
) -> Response:
    """Fresh vended credentials for the table (none where vending is off or the table is local)."""
    referenced_by(through)
    state = service(request).tables.load(target.ident(table))
    access = _delegation(request).table_config(
        {VENDED}, state.metadata.location, target.access.may("writer"), None
    )
    return JSONResponse({"storage-credentials": access.credentials})


@router.post("/namespaces/{namespace:name}/tables/{table:name}/sign")
def sign_request(
    request: Request, target: ReadsNamespace, table: str, raw: bytes = Depends(raw_body)
) -> Response:
    """The S3 remote signer (Iceberg's S3 signer protocol) for one table's objects: the operations
    of rest/s3_signer.py's allow-list, reads for a reader, inside the table's location only."""
    body = parse(SignRequest, raw)
    state = service(request).tables.load(target.ident(table))
    signed = _delegation(request).sign(state.metadata.location, target.access.may("writer"), body)
    return JSONResponse(signed, headers={"Cache-Control": "no-store"})


@router.head("/namespaces/{namespace:name}/tables/{table:name}")
async def table_exists(request: Request, target: ReadsNamespace, table: str) -> Response:
    # As loadTable's: a pointer read from memory is answered on the event loop, a database read is not.
    catalog, ident = service(request), target.ident(table)
    if catalog.core.store.reads_in_process:
        catalog.tables.pointer(ident)
    else:
        await run_in_threadpool(catalog.tables.pointer, ident)
    return Response(status_code=204)


@router.get("/namespaces/{namespace:name}/tables/{table:name}/coverage")
def table_coverage(
    request: Request,
    target: ReadsNamespace,
    table: str,
    source_id: str | None = Query(None, alias="source-id"),
    topic: str | None = Query(None),
    partition: int | None = Query(None),
    snapshot_id: int | None = Query(None, alias="snapshot-id"),
) -> Response:
    """isbre extension: the source offsets the table holds, as sinks declared them in their commits."""
    found = service(request).tables.coverage(target.ident(table), snapshot_id)
    streams = [
        entry
        for entry in found.coverage.to_json()
        if (source_id is None or entry["source-id"] == source_id)
        and (topic is None or entry["topic"] == topic)
        and (partition is None or entry["partition"] == partition)
    ]
    body: dict[str, object] = {"table-uuid": found.table_uuid, "coverage": streams, "rows": found.rows}
    if snapshot_id is not None:
        body["commit-seq"] = found.commit_seq
    return JSONResponse(body)


@router.post("/namespaces/{namespace:name}/tables/{table:name}")
@idempotent_mutation(TABLE)
def commit_table(
    request: Request,
    target: WritesNamespace,
    table: str,
    context: Context,
    raw: bytes = Depends(raw_body),
) -> Response:
    body = parse(CommitTableRequest, raw)
    ident = target.ident(table)
    if body.identifier is not None and body.identifier.to_identifier() != ident:
        raise ValueError(
            f"Identifier in the body ({body.identifier.to_identifier()}) does not match the path ({ident})"
        )
    catalog = service(request)
    change = TableChange(ident, body.requirements, body.updates)
    state = catalog.tables.commit(change, context.within(target.access.places(catalog)))
    return load_result(state.metadata_location, state.json)


@router.delete("/namespaces/{namespace:name}/tables/{table:name}")
@idempotent_mutation(NO_CONTENT)
def drop_table(
    request: Request,
    target: ManagesNamespace,
    table: str,
    context: Context,
    purge: bool = Query(False, alias="purgeRequested"),
) -> Response:
    service(request).tables.drop(target.ident(table), purge=purge, context=context)
    return Response(status_code=204)


@router.post("/namespaces/{namespace:name}/register")
@idempotent_mutation(TABLE)
def register_table(
    request: Request, target: WritesNamespace, context: Context, raw: bytes = Depends(raw_body)
) -> Response:
    body = parse(RegisterTableRequest, raw)
    catalog = service(request)
    state = catalog.tables.register(
        target.ident(body.name),
        body.metadata_location,
        overwrite=body.overwrite,
        context=context.within(target.access.places(catalog)),
    )
    return _table_result(request, target, body.name, state, state.json)


@router.get("/namespaces/{namespace:name}/tables/{table:name}/maintenance")
def maintenance_status(request: Request, target: ReadsNamespace, table: str) -> Response:
    """isbre extension: what maintenance sees in the table (docs/maintenance.md#watching-it)."""
    catalog, ident = service(request), target.ident(table)
    state = catalog.tables.load(ident)
    body = health(state.metadata, len(state.json), int(time.time() * 1000))
    maintainer = runtime(request).maintainer
    last = maintainer.stats.last_runs.get(f"{catalog.name}.{ident}") if maintainer is not None else None
    return json_response({**body, "last-maintenance-at": last})


@router.post("/namespaces/{namespace:name}/tables/{table:name}/maintenance")
def run_maintenance(
    request: Request, target: ManagesNamespace, table: str, context: Context, raw: bytes = Depends(raw_body)
) -> Response:
    """isbre extension: run maintenance jobs on the table now (docs/maintenance.md); what each did."""
    body = parse(MaintenanceRequest, raw)
    catalog, ident = service(request), target.ident(table)
    maintainer = runtime(request).maintainer
    if maintainer is None:  # maintenance after commits is off; asked for, it runs all the same
        reports = catalog.maintenance.run(ident, body.jobs, context=context)
    else:  # counted in /metrics and /health with the ones after commits
        reports = maintainer.run(catalog, ident, body.jobs, context)
    return json_response({"jobs": [report.to_json() for report in reports]})


@router.post("/tables/rename")
@idempotent_mutation(NO_CONTENT)
def rename_table(
    request: Request, access: Writer, context: Context, raw: bytes = Depends(raw_body)
) -> Response:
    body = parse(RenameTableRequest, raw)
    source, destination = body.source.to_identifier(), body.destination.to_identifier()
    access.identifiers([source, destination])
    service(request).tables.rename(source, destination, context=context)
    return Response(status_code=204)


@router.post("/namespaces/{namespace:name}/tables/{table:name}/metrics")
def report_metrics(
    request: Request,
    target: ReadsNamespace,
    table: str,
    raw: bytes = Depends(raw_body),
) -> Response:
    """Scan and commit reports change nothing, so they take no Idempotency-Key. The table need not
    exist: Spark reports a CTAS's commit while the table is only staged (as the reference server
    does, the report is accepted and counted)."""
    report = parse(ReportMetricsRequest, raw)
    ident = target.ident(table)
    runtime(request).counters.metrics_reports[report_type(report.report_type)] += 1
    log.debug("metrics report %s for %s", report_type(report.report_type), ident)
    return Response(status_code=204)


@router.post("/transactions/commit")
@idempotent_mutation(NO_CONTENT)
def commit_transaction(
    request: Request, access: Writer, context: Context, raw: bytes = Depends(raw_body)
) -> Response:
    body = parse(CommitTransactionRequest, raw)
    if not body.table_changes:
        raise ValueError("A transaction needs at least one table change")
    changes = []
    for change in body.table_changes:
        if change.identifier is None:
            raise ValueError("Every table change of a transaction needs an identifier")
        changes.append(TableChange(change.identifier.to_identifier(), change.requirements, change.updates))
    access.identifiers(change.ident for change in changes)
    catalog = service(request)
    catalog.tables.commit_all(changes, str(uuid.uuid4()), context.within(access.places(catalog)))
    return Response(status_code=204)
