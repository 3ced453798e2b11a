"""Namespace routes of the Iceberg REST API."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from isbre.catalog.identifiers import check_namespace
from isbre.rest.access import Admin, ManagesNamespace, Reader, ReadsNamespace
from isbre.rest.idempotency import NO_CONTENT, idempotent_mutation
from isbre.rest.models import CreateNamespaceRequest, UpdateNamespacePropertiesRequest
from isbre.rest.wire import (
    Context,
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
    access: Reader,
    parent: str | None = None,
    page_token: str | None = Query(None, alias="pageToken"),
    page_size: int | None = Query(None, alias="pageSize"),
) -> Response:
    parent_ns = namespace_from_path(parent) if parent else ()
    if parent_ns and not access.visible(parent_ns):
        access.namespace(parent_ns)  # refused: says which namespace
    items, token = page(
        request,
        page_token,
        page_size,
        lambda after, limit: service(request).namespaces.listing(parent_ns, after, limit),
        key=list,
        position=_namespace_position,
    )
    body: dict = {"namespaces": [list(ns) for ns in items if access.visible(ns)]}
    if token:
        body["next-page-token"] = token
    return json_response(body)


def _namespace_position(after: Any) -> tuple[str, ...]:
    if not isinstance(after, list) or not after or not all(isinstance(level, str) for level in after):
        raise ValueError("Invalid pageToken: not a position in a namespace listing")
    return check_namespace(after)


def _created_namespace(request: Request, raw: bytes, properties: dict[str, str]) -> Response:
    return json_response(
        {"namespace": parse(CreateNamespaceRequest, raw).namespace, "properties": properties}
    )


def _properties_change(request: Request, raw: bytes, change: dict[str, list[str]]) -> Response:
    return json_response(change)


@router.post("/namespaces")
@idempotent_mutation(_created_namespace)
def create_namespace(
    request: Request, access: Admin, context: Context, raw: bytes = Depends(raw_body)
) -> Response:
    body = parse(CreateNamespaceRequest, raw)
    catalog = service(request)
    namespace = access.namespace(tuple(body.namespace))
    places = access.places(catalog)
    properties = catalog.namespaces.create(namespace, body.properties, context.within(places))
    return json_response({"namespace": body.namespace, "properties": properties})


@router.get("/namespaces/{namespace:name}")
def load_namespace(request: Request, target: ReadsNamespace) -> Response:
    properties = service(request).namespaces.load(target.namespace)
    return json_response({"namespace": list(target.namespace), "properties": properties})


@router.head("/namespaces/{namespace:name}")
def namespace_exists(request: Request, target: ReadsNamespace) -> Response:
    service(request).namespaces.load(target.namespace)
    return Response(status_code=204)


@router.delete("/namespaces/{namespace:name}")
@idempotent_mutation(NO_CONTENT)
def drop_namespace(request: Request, target: ManagesNamespace, context: Context) -> Response:
    service(request).namespaces.drop(target.namespace, context=context)
    return Response(status_code=204)


@router.post("/namespaces/{namespace:name}/properties")
@idempotent_mutation(_properties_change)
def update_properties(
    request: Request, target: ManagesNamespace, context: Context, raw: bytes = Depends(raw_body)
) -> Response:
    body = parse(UpdateNamespacePropertiesRequest, raw)
    catalog = service(request)
    places = target.access.places(catalog)
    change = catalog.namespaces.update_properties(
        target.namespace, body.removals, body.updates, context.within(places)
    )
    return json_response(dataclasses.asdict(change))
