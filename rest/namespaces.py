"""Namespace routes of the Iceberg REST API."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request, Response

from catalog.service import PropertiesChange
from rest.idempotency import idempotent_mutation, no_content
from rest.models import CreateNamespaceRequest, UpdateNamespacePropertiesRequest
from rest.wire import (
    NAMESPACE_SEPARATOR,
    json_response,
    namespace_from_path,
    page,
    parse,
    raw_body,
    service,
)

router = APIRouter()


@router.get("/namespaces")
def list_namespaces(
    request: Request,
    parent: str | None = None,
    page_token: str | None = Query(None, alias="pageToken"),
    page_size: int | None = Query(None, alias="pageSize"),
) -> Response:
    parent_ns = tuple(parent.split(NAMESPACE_SEPARATOR)) if parent else ()
    items, token = page(
        request,
        page_token,
        page_size,
        lambda after, limit: service(request).list_namespaces(
            parent_ns, tuple(after) if after else None, limit
        ),
        key=list,
    )
    body: dict = {"namespaces": [list(ns) for ns in items]}
    if token:
        body["next-page-token"] = token
    return json_response(body)


def _created_namespace(properties: dict[str, str], raw: bytes) -> Response:
    return json_response(
        {"namespace": parse(CreateNamespaceRequest, raw).namespace, "properties": properties}
    )


def _properties_change(change: PropertiesChange, raw: bytes) -> Response:
    return json_response({"updated": change.updated, "removed": change.removed, "missing": change.missing})


@router.post("/namespaces")
@idempotent_mutation(_created_namespace)
def create_namespace(request: Request, raw: bytes = Depends(raw_body)) -> Response:
    body = parse(CreateNamespaceRequest, raw)
    properties = service(request).create_namespace(tuple(body.namespace), body.properties)
    return json_response({"namespace": body.namespace, "properties": properties})


@router.get("/namespaces/{namespace}")
def load_namespace(request: Request, namespace: str) -> Response:
    ns = namespace_from_path(namespace)
    return json_response({"namespace": list(ns), "properties": service(request).load_namespace(ns)})


@router.head("/namespaces/{namespace}")
def namespace_exists(request: Request, namespace: str) -> Response:
    service(request).load_namespace(namespace_from_path(namespace))
    return Response(status_code=204)


@router.delete("/namespaces/{namespace}")
@idempotent_mutation(no_content)
def drop_namespace(request: Request, namespace: str) -> Response:
    service(request).drop_namespace(namespace_from_path(namespace))
    return Response(status_code=204)


@router.post("/namespaces/{namespace}/properties")
@idempotent_mutation(_properties_change)
def update_properties(request: Request, namespace: str, raw: bytes = Depends(raw_body)) -> Response:
    body = parse(UpdateNamespacePropertiesRequest, raw)
    change = service(request).update_namespace(namespace_from_path(namespace), body.removals, body.updates)
    return _properties_change(change, raw)
