"""View routes of the Iceberg REST API."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request, Response

from catalog import Identifier, ViewState
from rest.idempotency import idempotent_mutation, no_content
from rest.models import CommitViewRequest, CreateViewRequest, RegisterViewRequest, RenameTableRequest
from rest.wire import identifiers_page, load_result, namespace_from_path, parse, raw_body, service

router = APIRouter()


def _ident(namespace: str, view: str) -> Identifier:
    return Identifier.of(namespace_from_path(namespace), view)


def _result(state: ViewState) -> Response:
    return load_result(state.metadata_location, state.json)


def _committed_view(state: ViewState, raw: bytes) -> Response:
    return _result(state)


@router.get("/namespaces/{namespace}/views")
def list_views(
    request: Request,
    namespace: str,
    page_token: str | None = Query(None, alias="pageToken"),
    page_size: int | None = Query(None, alias="pageSize"),
) -> Response:
    ns = namespace_from_path(namespace)
    return identifiers_page(
        request, page_token, page_size, lambda after, limit: service(request).list_views(ns, after, limit)
    )


@router.post("/namespaces/{namespace}/views")
@idempotent_mutation(_committed_view)
def create_view(request: Request, namespace: str, raw: bytes = Depends(raw_body)) -> Response:
    body = parse(CreateViewRequest, raw)
    state = service(request).create_view(
        Identifier.of(namespace_from_path(namespace), body.name),
        body.view_schema,
        body.view_version,
        location=body.location,
        properties=body.properties,
    )
    return _result(state)


@router.get("/namespaces/{namespace}/views/{view}")
def load_view(request: Request, namespace: str, view: str) -> Response:
    return _result(service(request).load_view(_ident(namespace, view)))


@router.head("/namespaces/{namespace}/views/{view}")
def view_exists(request: Request, namespace: str, view: str) -> Response:
    service(request).load_view(_ident(namespace, view))
    return Response(status_code=204)


@router.post("/namespaces/{namespace}/views/{view}")
@idempotent_mutation(_committed_view)
def replace_view(request: Request, namespace: str, view: str, raw: bytes = Depends(raw_body)) -> Response:
    body = parse(CommitViewRequest, raw)
    ident = _ident(namespace, view)
    if body.identifier is not None and body.identifier.to_identifier() != ident:
        raise ValueError(
            f"Identifier in the body ({body.identifier.to_identifier()}) does not match the path ({ident})"
        )
    return _result(service(request).replace_view(ident, body.requirements, body.updates))


@router.delete("/namespaces/{namespace}/views/{view}")
@idempotent_mutation(no_content)
def drop_view(request: Request, namespace: str, view: str) -> Response:
    service(request).drop_view(_ident(namespace, view))
    return Response(status_code=204)


@router.post("/views/rename")
@idempotent_mutation(no_content)
def rename_view(request: Request, raw: bytes = Depends(raw_body)) -> Response:
    body = parse(RenameTableRequest, raw)
    service(request).rename_view(body.source.to_identifier(), body.destination.to_identifier())
    return Response(status_code=204)


@router.post("/namespaces/{namespace}/register-view")
@idempotent_mutation(_committed_view)
def register_view(request: Request, namespace: str, raw: bytes = Depends(raw_body)) -> Response:
    body = parse(RegisterViewRequest, raw)
    ident = Identifier.of(namespace_from_path(namespace), body.name)
    return _result(service(request).register_view(ident, body.metadata_location))
