"""isbre extension: a table's named consumers and their commit cursors (docs/feeds.md).

Reading and moving a cursor takes a reader of the table's namespace (a consumer reads); removing
one a writer. Moving is a compare-and-set: the request names where it expects the cursor to be.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from isbre.rest.access import ReadsNamespace, WritesNamespace
from isbre.rest.models import ConsumerCursorRequest
from isbre.rest.wire import Context, parse, raw_body, service

router = APIRouter()
CONSUMERS = "/namespaces/{namespace:name}/tables/{table:name}/consumers"


@router.get(CONSUMERS)
def list_consumers(request: Request, target: ReadsNamespace, table: str) -> Response:
    found = service(request).consumers.listing(target.ident(table))
    return JSONResponse({"consumers": [consumer.to_json() for consumer in found]})


@router.get(CONSUMERS + "/{consumer}")
def load_consumer(request: Request, target: ReadsNamespace, table: str, consumer: str) -> Response:
    return JSONResponse(service(request).consumers.get(target.ident(table), consumer).to_json())


@router.put(CONSUMERS + "/{consumer}")
def move_consumer(
    request: Request,
    target: ReadsNamespace,
    table: str,
    consumer: str,
    context: Context,
    raw: bytes = Depends(raw_body),
) -> Response:
    body = parse(ConsumerCursorRequest, raw)
    moved = service(request).consumers.advance(
        target.ident(table), consumer, body.commit_seq, body.expected_commit_seq, context
    )
    return JSONResponse(moved.to_json())


@router.delete(CONSUMERS + "/{consumer}")
def delete_consumer(
    request: Request, target: WritesNamespace, table: str, consumer: str, context: Context
) -> Response:
    service(request).consumers.delete(target.ident(table), consumer, context)
    return Response(status_code=204)
