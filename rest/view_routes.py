"""View routes of the Iceberg REST API."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request, Response
from isbre.catalog import ViewState
from isbre.rest.access import ManagesNamespace, ReadsNamespace, Writer, WritesNamespace
from isbre.rest.idempotency import NO_CONTENT, VIEW, idempotent_mutation
from isbre.rest.models import CommitViewRequest, CreateViewRequest, RegisterViewRequest, RenameTableRequest
from isbre.rest.wire import Context, identifiers_page, load_result, parse, raw_body, referenced_by, service

router = APIRouter()


def _result(state: ViewState) -> Response:
    return load_result(state.metadata_location, state.json)


@router.get("/namespaces/{namespace:name}/views")
def list_views(
    request: Request,
    target: ReadsNamespace,
    page_token: str | None = Query(None, alias="pageToken"),
    page_size: int | None = Query(None, alias="pageSize"),
) -> Response:
    ns = target.namespace
    return identifiers_page(
        request, page_token, page_size, lambda after, limit: service(request).views.listing(ns, after, limit)
    )


@router.post("/namespaces/{namespace:name}/views")
@idempotent_mutation(VIEW)
def create_view(
    request: Request, target: WritesNamespace, context: Context, raw: bytes = Depends(raw_body)
) -> Response:
    body = parse(CreateViewRequest, raw)
    catalog = service(request)
    state = catalog.views.create(
        target.ident(body.name),
        body.view_schema,
        body.view_version,
        location=body.location,
        properties=body.properties,
        context=context.within(target.access.places(catalog)),
    )
    return _result(state)


@router.get("/namespaces/{namespace:name}/views/{view:name}")
def load_view(
    request: Request,
    target: ReadsNamespace,
    view: str,
    through: str | None = Query(None, alias="referenced-by"),
) -> Response:
    referenced_by(through)
    return _result(service(request).views.load(target.ident(view)))


@router.head("/namespaces/{namespace:name}/views/{view:name}")
def view_exists(request: Request, target: ReadsNamespace, view: str) -> Response:
    service(request).views.load(target.ident(view))
    return Response(status_code=204)


@router.post("/namespaces/{namespace:name}/views/{view:name}")
@idempotent_mutation(VIEW)
def replace_view(
    request: Request,
    target: WritesNamespace,
    view: str,
    context: Context,
    raw: bytes = Depends(raw_body),
) -> Response:
    body = parse(CommitViewRequest, raw)
    ident = target.ident(view)
    if body.identifier is not None and body.identifier.to_identifier() != ident:
        raise ValueError(
            f"Identifier in the body ({body.identifier.to_identifier()}) does not match the path ({ident})"
        )
    catalog = service(request)
    places = target.access.places(catalog)
    replaced = catalog.views.replace(ident, body.requirements, body.updates, context.within(places))
    return _result(replaced)


@router.delete("/namespaces/{namespace:name}/views/{view:name}")
@idempotent_mutation(NO_CONTENT)
def drop_view(request: Request, target: ManagesNamespace, view: str, context: Context) -> Response:
    service(request).views.drop(target.ident(view), context=context)
    return Response(status_code=204)


@router.post("/views/rename")
@idempotent_mutation(NO_CONTENT)
def rename_view(
    request: Request, access: Writer, context: Context, raw: bytes = Depends(raw_body)
) -> Response:
    body = parse(RenameTableRequest, raw)
    source, destination = body.source.to_identifier(), body.destination.to_identifier()
    access.identifiers([source, destination])
    service(request).views.rename(source, destination, context=context)
    return Response(status_code=204)


@router.post("/namespaces/{namespace:name}/register-view")
@idempotent_mutation(VIEW)
def register_view(
    request: Request, target: WritesNamespace, context: Context, raw: bytes = Depends(raw_body)
) -> Response:
    body = parse(RegisterViewRequest, raw)
    catalog = service(request)
    places = target.access.places(catalog)
    registered = catalog.views.register(
        target.ident(body.name), body.metadata_location, context.within(places)
    )
    return _result(registered)
