"""Idempotency-Key: a retried mutation is answered again instead of running again.

What a mutation committed is kept, compactly, in the same store transaction as
the change itself (what the request's mutation context runs inside the transaction), so a commit whose
answer was lost on the way is never committed twice. Only requests that changed
something keep their key: a refusal changed nothing, and a retry runs it afresh.
Keys are indexed by time, so expiring them reads only the expired ones.
Requests with one key wait for each other in one process; across processes,
the first to commit wins and the others answer with its outcome.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Response
from isbre.catalog.records import now_us
from isbre.catalog.writer import Batch
from isbre.rest.errors import error_response
from isbre.rest.wire import load_result, mutation_context, service
from pyiceberg.exceptions import NoSuchTableError, NoSuchViewError

HEADER = "idempotency-key"
_STRIPES = [threading.Lock() for _ in range(64)]


class _AlreadyFinalized(Exception):
    """Another process finalized this key first: roll back and replay its answer."""


@dataclass(frozen=True)
class Outcome:
    """How a route's result is kept (`keep`: small and JSON-able) and answered again (`render`)."""

    keep: Callable[[Any], Any]
    render: Callable[[Request, bytes, Any], Response]


def _first(result: Any) -> Any:
    return result[0] if isinstance(result, list) else result


def _rendering(files: str, missing: type[Exception]) -> Callable[[Request, bytes, str], Response]:
    """Answers again with the metadata file a commit produced (`files`: the service's cache of them)."""

    def render(request: Request, raw: bytes, location: str) -> Response:
        try:
            loaded = getattr(service(request), files).get(location)
        except Exception as exc:
            raise missing(f"What this key committed is gone (dropped and purged since): {location}") from exc
        return load_result(location, loaded.json)

    return render


NO_CONTENT = Outcome(lambda result: None, lambda request, raw, kept: Response(status_code=204))
TABLE = Outcome(lambda result: _first(result).metadata_location, _rendering("table_files", NoSuchTableError))
VIEW = Outcome(lambda result: result.metadata_location, _rendering("view_files", NoSuchViewError))


def _fingerprint(request: Request, raw: bytes) -> str:
    query = request.url.query
    return hashlib.sha256(f"{request.method} {request.url.path}?{query}\n".encode() + raw).hexdigest()


def _replay(
    request: Request, raw: bytes, stored: dict[str, Any], fingerprint: str, outcome: Outcome
) -> Response:
    if stored["fingerprint"] != fingerprint:
        message = "This Idempotency-Key was already used for a different request"
        return error_response(422, "UnprocessableEntityException", message)
    return outcome.render(request, raw, stored["outcome"])


def idempotent_mutation(outcome: Outcome) -> Callable[[Callable[..., Response]], Callable[..., Response]]:
    """Make a mutating route honour Idempotency-Key."""

    def decorate(endpoint: Callable[..., Response]) -> Callable[..., Response]:
        @functools.wraps(endpoint)
        def route(**kwargs: Any) -> Response:
            return idempotent(kwargs["request"], kwargs.get("raw", b""), lambda: endpoint(**kwargs), outcome)

        return route

    return decorate


def idempotent(request: Request, raw: bytes, call: Callable[[], Response], outcome: Outcome) -> Response:
    """Answer `call()`, once per Idempotency-Key."""
    key = request.headers.get(HEADER)
    if key is None:
        return call()
    try:
        key = str(uuid.UUID(key))
    except ValueError:
        message = f"Invalid Idempotency-Key {key!r}: expected a UUID"
        return error_response(400, "BadRequestException", message)
    fingerprint = _fingerprint(request, raw)
    catalog = service(request)
    with _STRIPES[hash(key) % len(_STRIPES)]:
        if (stored := catalog.idempotent_response(key)) is not None:
            return _replay(request, raw, stored, fingerprint, outcome)

        def keep_with_change(batch: Batch, result: Any) -> None:
            if batch.view.idempotent_response(key) is not None:
                raise _AlreadyFinalized
            record = {"fingerprint": fingerprint, "outcome": outcome.keep(result), "ts": now_us()}
            batch.view.put_idempotent_response(key, record)

        context = mutation_context(request)
        context.inside = keep_with_change
        try:
            return call()
        except _AlreadyFinalized:
            stored = catalog.idempotent_response(key)
            assert stored is not None  # the key that aborted this request is there
            return _replay(request, raw, stored, fingerprint, outcome)
        except Exception:
            # A twin in another process (a worker, a replica) may have committed first, so that
            # this attempt failed on what the twin did (the name is taken): the twin's outcome
            # is the key's answer.
            stored = catalog.idempotent_response(key)
            if stored is None:
                raise
            return _replay(request, raw, stored, fingerprint, outcome)
        finally:
            context.inside = None
