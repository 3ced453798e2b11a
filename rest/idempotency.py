"""Idempotency-Key: a retried mutation is answered from the stored response instead of running again.

The finalized response is stored in the same LMDB transaction as the change it
answers (through the service's after-mutation hook), so a commit whose response
was lost on the way is never committed twice. Terminal 4xx answers are stored
too (they changed nothing, so a separate transaction is enough); 5xx answers are
not, as the spec says. Requests with one key wait for each other.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import threading
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import Request, Response

from catalog.records import now_us
from catalog.service import after_mutation
from catalog.writer import Batch
from rest.errors import classify, error_response, render_error
from rest.wire import service

HEADER = "idempotency-key"
_STRIPES = [threading.Lock() for _ in range(64)]


class _AlreadyFinalized(Exception):
    """Another process finalized this key first: roll back and replay its answer."""


def _record(fingerprint: str, response: Response) -> dict[str, Any]:
    return {
        "fingerprint": fingerprint,
        "status": response.status_code,
        "media_type": response.media_type,
        "body": base64.b64encode(bytes(response.body)).decode(),
        "ts": now_us(),
    }


def _replay(stored: dict[str, Any], fingerprint: str) -> Response:
    if stored["fingerprint"] != fingerprint:
        message = "This Idempotency-Key was already used for a different request"
        return error_response(422, "UnprocessableEntityException", message)
    return Response(
        base64.b64decode(stored["body"]), status_code=stored["status"], media_type=stored["media_type"]
    )


Committed = Callable[[Any, bytes], Response]


def no_content(result: Any, raw: bytes) -> Response:
    return Response(status_code=204)


def idempotent_mutation(committed: Committed) -> Callable[[Callable[..., Response]], Callable[..., Response]]:
    """Make a mutating route honour Idempotency-Key; `committed(result, raw body)` renders its
    answer from what the route's mutation returned."""

    def decorate(endpoint: Callable[..., Response]) -> Callable[..., Response]:
        @functools.wraps(endpoint)
        def route(**kwargs: Any) -> Response:
            return idempotent(
                kwargs["request"], kwargs.get("raw", b""), lambda: endpoint(**kwargs), committed
            )

        return route

    return decorate


def idempotent(request: Request, raw: bytes, call: Callable[[], Response], committed: Committed) -> Response:
    """Answer `call()`, once per Idempotency-Key.

    `committed` renders the same response from what the operation's mutation returned; it runs
    inside the write transaction, where the response is stored with the change.
    """
    key = request.headers.get(HEADER)
    if key is None:
        return call()
    try:
        key = str(uuid.UUID(key))
    except ValueError:
        message = f"Invalid Idempotency-Key {key!r}: expected a UUID"
        return error_response(400, "BadRequestException", message)
    fingerprint = hashlib.sha256(f"{request.method} {request.url.path}\n".encode() + raw).hexdigest()
    catalog = service(request)
    with _STRIPES[hash(key) % len(_STRIPES)]:
        if (stored := catalog.idempotent_response(key)) is not None:
            return _replay(stored, fingerprint)
        finalized: list[bool] = []

        def store_with_change(batch: Batch, result: Any) -> None:
            if batch.view.idempotent_response(key) is not None:
                raise _AlreadyFinalized
            batch.view.put_idempotent_response(key, _record(fingerprint, committed(result, raw)))
            finalized.append(True)

        try:
            with after_mutation(store_with_change):
                response = call()
        except _AlreadyFinalized:
            stored = catalog.idempotent_response(key)
            assert stored is not None  # the key that aborted this request is there
            return _replay(stored, fingerprint)
        except Exception as exc:
            if 400 <= classify(exc)[0] < 500:
                catalog.store_idempotent_response(key, _record(fingerprint, render_error(exc)))
            raise
        if not finalized:  # nothing was committed (a staged create, a metrics report)
            catalog.store_idempotent_response(key, _record(fingerprint, response))
        return response
