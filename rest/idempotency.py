"""Idempotency-Key: a retried mutation is answered again instead of running again.

What a mutation committed is kept, compactly, in the same store transaction as the change
itself: the route passes the key in the request's context (catalog/request_context.py) and the
catalog keeps the operation's answer under it, so a commit whose answer was lost on the way is
never committed twice. Only requests that changed something keep their key: a refusal changed
nothing, and a retry runs it afresh. Keys are indexed by time, so expiring them reads only the
expired ones. Requests with one key wait for each other in one process; across processes, the
first to commit wins and the others answer with its outcome.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import Request, Response
from isbre.catalog.request_context import Idempotency, RequestContext
from isbre.rest.errors import error_response
from isbre.rest.runtime import runtime
from isbre.rest.wire import load_result, service
from pyiceberg.exceptions import NoSuchTableError, NoSuchViewError

HEADER = "idempotency-key"
# How a route answers again from what its operation kept under the key.
Render = Callable[[Request, bytes, Any], Response]


def _rendering(files: str, missing: type[Exception]) -> Render:
    """Answers again with the metadata file a commit produced (`files`: the service's cache of them)."""

    def render(request: Request, raw: bytes, location: str) -> Response:
        try:
            loaded = getattr(service(request).core, files).get(location)
        except Exception as exc:
            raise missing(f"What this key committed is gone (dropped and purged since): {location}") from exc
        return load_result(location, loaded.json)

    return render


def _no_content(request: Request, raw: bytes, kept: Any) -> Response:
    return Response(status_code=204)


NO_CONTENT: Render = _no_content
TABLE = _rendering("table_files", NoSuchTableError)
VIEW = _rendering("view_files", NoSuchViewError)


def _fingerprint(request: Request, raw: bytes) -> str:
    query = request.url.query
    return hashlib.sha256(f"{request.method} {request.url.path}?{query}\n".encode() + raw).hexdigest()


def _replay(
    request: Request, raw: bytes, stored: dict[str, Any], fingerprint: str, render: Render
) -> Response:
    if stored["fingerprint"] != fingerprint:
        message = "This Idempotency-Key was already used for a different request"
        return error_response(422, "UnprocessableEntityException", message)
    return render(request, raw, stored["outcome"])


def idempotent_mutation(render: Render) -> Callable[[Callable[..., Response]], Callable[..., Response]]:
    """Make a mutating route honour Idempotency-Key: the route's `context` (rest/wire.py `Context`)
    carries the key to the operation, which keeps its answer under it."""

    def decorate(endpoint: Callable[..., Response]) -> Callable[..., Response]:
        @functools.wraps(endpoint)
        def route(**kwargs: Any) -> Response:
            def call(context: RequestContext) -> Response:
                return endpoint(**{**kwargs, "context": context})

            return idempotent(kwargs["request"], kwargs.get("raw", b""), kwargs["context"], call, render)

        return route

    return decorate


def idempotent(
    request: Request,
    raw: bytes,
    context: RequestContext,
    call: Callable[[RequestContext], Response],
    render: Render,
) -> Response:
    """Answer `call(context)`, once per Idempotency-Key (`context` then carries the key)."""
    key = request.headers.get(HEADER)
    if key is None:
        return call(context)
    try:
        key = str(uuid.UUID(key))
    except ValueError:
        message = f"Invalid Idempotency-Key {key!r}: expected a UUID"
        return error_response(400, "BadRequestException", message)
    fingerprint = _fingerprint(request, raw)
    catalog = service(request)
    with runtime(request).key_locks.holding(key):
        if (stored := catalog.core.idempotent_response(key)) is not None:
            return _replay(request, raw, stored, fingerprint, render)
        try:
            return call(context.keyed(Idempotency(key, fingerprint)))
        except Exception:
            # Answered meanwhile (KeyAnsweredError), or a twin in another process (a worker, a
            # replica) committed first, so that this attempt failed on what the twin did (the
            # name is taken): the twin's outcome is the key's answer.
            stored = catalog.core.idempotent_response(key)
            if stored is None:
                raise
            return _replay(request, raw, stored, fingerprint, render)
