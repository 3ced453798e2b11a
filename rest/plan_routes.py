"""Server-side scan planning (the REST spec's planTableScan, fetchPlanningResult, cancelPlanning
and fetchScanTasks), authorized as loadTable is: a reader of the table's namespace.

A plan's first page is answered with it; its other pages are plan tasks, each a range of the
scan's data manifests that any worker (or replica) plans again on request. isbre extensions:
`isbre-after-commit-seq` in the request, `isbre-commit-seq`, `isbre-snapshot-id` and
`isbre-rewrites` in a completed answer (docs/rest-api.md).
"""

from __future__ import annotations

import json
import os
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from isbre.catalog import CatalogService
from isbre.catalog.change_plans import ChangePlan
from isbre.catalog.plans import PlanRequest
from isbre.catalog.scan_planning import PlannedTask, Planner, RowFilter
from isbre.rest.access import InNamespace, ReadsNamespace
from isbre.rest.delegation import HEADER, wanted
from isbre.rest.models import PlanTableScanRequest
from isbre.rest.plan_filters import bounded_filter
from isbre.rest.runtime import runtime
from isbre.rest.scan_json import PlanId, PlanTask, TaskWriter, isbre_fields, pages
from isbre.rest.table_routes import delegated
from isbre.rest.wire import parse, raw_body, service
from pyiceberg.catalog.rest.scan_planning import FetchScanTasksRequest
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.schema import Schema

router = APIRouter()
PLAN = "/namespaces/{namespace:name}/tables/{table:name}/plan"


def _field_ids(schema: Schema, names: list[str] | None, case_sensitive: bool) -> tuple[int, ...]:
    """The ids of the fields `names` names (ValueError naming one the schema lacks)."""
    found = []
    for name in names or ():
        field = schema.find_field(name, case_sensitive)  # raises ValueError for an unknown field
        found.append(field.field_id)
    return tuple(found)


def _first_page(
    catalog: CatalogService, planner: Planner, plan: PlanId, page_size: int, key: bytes
) -> dict[str, Any]:
    """The plan's first page: manifests planned in order until they give `page_size` tasks (a
    selective filter is answered whole), the rest as plan tasks of about `page_size` files each."""
    manifests = planner.data_manifests()
    tasks: list[PlannedTask] = []
    planned = 0
    while planned < len(manifests) and len(tasks) < page_size:
        tasks += planner.tasks(manifests[planned : planned + 1])
        planned += 1
    counts = [(m.added_files_count or 0) + (m.existing_files_count or 0) for m in manifests[planned:]]
    rest = [(planned + a, planned + b) for a, b in pages(counts, page_size)]
    writer = TaskWriter(planner.metadata, plan.stats_fields)
    rewrites = catalog.plans.rewrites(planner)
    return {
        "status": "completed",
        **writer.scan_tasks(tasks),
        "plan-tasks": [PlanTask(plan.scan, a, b, plan.stats_fields).token(key) for a, b in rest],
        **isbre_fields(plan.scan, plan.commit_seq, rewrites, writer),
    }


def _answer(
    request: Request, target: InNamespace, table: str, planner: Planner, found: dict[str, Any]
) -> Response:
    """A completed plan with the storage credentials the client asked for."""
    if wanted(request.headers.get(HEADER)):
        credentials = delegated(request, target, table, planner.metadata.location).credentials
        if credentials:
            found = {**found, "storage-credentials": credentials}
    return JSONResponse(found, headers={"Cache-Control": "no-store"})


def _plan(
    request: Request, target: InNamespace, table: str, planner: Planner, plan: PlanId, token: str
) -> Response:
    catalog = service(request)
    work = runtime(request).planning
    page_size = runtime(request).settings.plan_page_size
    found = work.run(token, lambda: _first_page(catalog, planner, plan, page_size, work.key))
    if found is None:
        return JSONResponse({"status": "submitted", "plan-id": token})
    return _answer(request, target, table, planner, {**found, "plan-id": token})


def _plan_request(raw: bytes, max_terms: int) -> PlanTableScanRequest:
    """The request, its filter bounded and balanced first (rest/plan_filters.py)."""
    try:
        found = json.loads(raw)
    except RecursionError as exc:
        raise ValueError("Invalid request: the JSON body is nested too deeply") from exc
    except ValueError:
        return parse(PlanTableScanRequest, raw)  # refused, in the words every request gets
    if isinstance(found, dict) and isinstance(found.get("filter"), dict):
        found["filter"] = bounded_filter(found["filter"], max_terms)
    return parse(PlanTableScanRequest, json.dumps(found).encode())


@router.post(PLAN)
def plan_table_scan(
    request: Request, target: ReadsNamespace, table: str, raw: bytes = Depends(raw_body)
) -> Response:
    work = runtime(request).planning
    max_terms = runtime(request).settings.plan_max_filter_terms

    def resolved() -> tuple[PlanId | dict[str, Any], Planner]:
        body = _plan_request(raw, max_terms)
        rows = RowFilter(
            body.filter if body.filter is not None else AlwaysTrue(),
            body.case_sensitive,
            body.use_snapshot_schema,
        )
        if body.changes:
            assert body.after_commit_seq is not None  # the request's validator says so
            page_size = runtime(request).settings.plan_page_size
            planner, changes = service(request).plans.changes(
                target.ident(table),
                body.after_commit_seq,
                page_size,
                rows,
                runtime(request).settings.change_net_max_rows,
            )
            return _changes_answer(planner, changes), planner
        found = service(request).plans.resolve(
            target.ident(table),
            PlanRequest(
                snapshot_id=body.snapshot_id,
                start_snapshot_id=body.start_snapshot_id,
                end_snapshot_id=body.end_snapshot_id,
                after_commit_seq=body.after_commit_seq,
                rows=rows,
            ),
        )
        schema = found.planner.metadata.schema()
        _field_ids(schema, body.select, body.case_sensitive)
        stats = _field_ids(schema, body.stats_fields, body.case_sensitive)
        return PlanId.new(found.scan, stats, found.commit_seq), found.planner

    # Parsing and resolving a request is planning work too: it takes a slot like the plan.
    plan, planner = work.bounded(resolved)
    if isinstance(plan, dict):  # a change plan, answered whole
        return _answer(request, target, table, planner, plan)
    return _plan(request, target, table, planner, plan, plan.token(work.key))


def _changes_answer(planner: Planner, changes: ChangePlan) -> dict[str, Any]:
    """A change plan, always answered whole: it ends at a commit, and the next plan starts there. Its
    `plan-id`, which the spec asks of every completed answer, names nothing left to fetch."""
    tasks = TaskWriter(planner.metadata, ()).change_tasks(changes.tasks)
    found = {"status": "completed", "plan-id": f"isbre-changes-{os.urandom(8).hex()}", **tasks}
    found["plan-tasks"] = []
    found["isbre-commit-seq"] = changes.commit_seq
    return found


@router.get(PLAN + "/{plan_id}")
def fetch_planning_result(request: Request, target: ReadsNamespace, table: str, plan_id: str) -> Response:
    plan = PlanId.of(plan_id, runtime(request).planning.key)
    planner = service(request).plans.planner(target.ident(table), plan.scan)
    if runtime(request).planning.cancelled(plan_id):
        return JSONResponse({"status": "cancelled"})
    return _plan(request, target, table, planner, plan, plan_id)


@router.delete(PLAN + "/{plan_id}")
def cancel_planning(request: Request, target: ReadsNamespace, table: str, plan_id: str) -> Response:
    plan = PlanId.of(plan_id, runtime(request).planning.key)
    service(request).plans.planner(target.ident(table), plan.scan)  # the plan must be this table's
    runtime(request).planning.cancel(plan_id)
    return Response(status_code=204)


@router.post("/namespaces/{namespace:name}/tables/{table:name}/tasks")
def fetch_scan_tasks(
    request: Request, target: ReadsNamespace, table: str, raw: bytes = Depends(raw_body)
) -> Response:
    task = PlanTask.of(parse(FetchScanTasksRequest, raw).plan_task, runtime(request).planning.key)
    planner = service(request).plans.planner(target.ident(table), task.scan)

    def plan() -> dict[str, Any]:
        manifests = planner.data_manifests()
        if task.end > len(manifests) or task.first >= task.end:
            raise PlanTask.missing()
        tasks = planner.tasks(manifests[task.first : task.end])
        return {**TaskWriter(planner.metadata, task.stats_fields).scan_tasks(tasks), "plan-tasks": []}

    return _answer(request, target, table, planner, runtime(request).planning.bounded(plan))
