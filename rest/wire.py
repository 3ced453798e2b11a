"""What every route needs: the service, request bodies, namespace path segments, pages."""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, TypeVar
from urllib.parse import quote, unquote

import pydantic
from fastapi import Depends, Request, Response
from isbre.catalog import CatalogService, Identifier
from isbre.catalog.identifiers import check_name, check_namespace
from isbre.catalog.request_context import RequestContext
from isbre.rest.runtime import runtime
from isbre.rest.settings import Settings
from starlette.convertors import Convertor, register_url_convertor

if TYPE_CHECKING:
    from isbre.rest.auth import Caller

M = TypeVar("M", bound=pydantic.BaseModel)
T = TypeVar("T")

# The spec's default namespace separator in paths and `parent` (the unit separator, %1F).
NAMESPACE_SEPARATOR = "\x1f"
# A `/` inside a name comes percent-encoded (%2F); routing sees it as this character until the path
# parameter is converted (`NameSegment`). Names never hold control characters, and a path that
# spells this one itself is refused (`routed_path`).
ENCODED_SLASH = "\x1e"


class NameSegment(Convertor[str]):
    """Path parameters that are names (`{table:name}`): one segment, its encoded slashes restored."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return value.replace(ENCODED_SLASH, "/")

    def to_string(self, value: str) -> str:
        return quote(value, safe="")


register_url_convertor("name", NameSegment())


def routed_path(scope_path: str, raw_path: bytes | None) -> str | None:
    """The path to route on: the decoded path, but with each %2F inside a segment kept as
    ENCODED_SLASH so that a name holding `/` stays one segment. None when the path spells
    ENCODED_SLASH itself (refused)."""
    if raw_path is None or b"%" not in raw_path:
        return scope_path
    raw = raw_path.decode("latin-1")
    lowered = raw.lower()
    if "%1e" in lowered:
        return None
    if "%2f" not in lowered:
        return scope_path
    segments = (re.sub("%2[fF]", ENCODED_SLASH, segment) for segment in raw.split("/"))
    return "/".join(unquote(segment) for segment in segments)


def service(request: Request) -> CatalogService:
    """The catalog of the warehouse the route's `{prefix}` names (the default one for other routes)."""
    running = runtime(request)
    prefix = request.path_params.get("prefix")
    return running.service if prefix is None else running.services[prefix]


def _request_state(request: Request) -> dict[str, Any]:
    # The dict behind `request.state`, read directly: State raises (and formats a message) for
    # every name it lacks, and the caller is absent on every request with authentication off.
    state: dict[str, Any] = request.scope.setdefault("state", {})
    return state


def caller_of(request: Request) -> Caller | None:
    """The authenticated caller (rest/auth.py puts it in the request's state); None with
    authentication off."""
    caller: Caller | None = _request_state(request).get("caller")
    return caller


async def request_context(request: Request) -> RequestContext:
    """What the request brings to the catalog's operations, passed to them as one object: its caller
    (rest/auth.py) and its id (`X-Request-ID`, or a new one). The route adds the caller's places where
    it creates or moves something (`RequestContext.within`), and rest/idempotency.py the request's
    Idempotency-Key."""
    caller = caller_of(request)
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    return RequestContext(None if caller is None else caller.name, request_id=request_id)


# A route's `context` parameter.
Context = Annotated[RequestContext, Depends(request_context)]


def warehouse_tags(request: Request) -> tuple[str | None, ...]:
    """The `warehouse` values of the records of the route's warehouse; () when the server has only
    one (every record is its own)."""
    if len(runtime(request).services) == 1:
        return ()
    return service(request).core.record_tags


def settings(request: Request) -> Settings:
    return runtime(request).settings


class BodyTooLargeError(ValueError):
    pass


async def raw_body(request: Request) -> bytes:
    """The request body, as read by RequestGuard (rest/guard.py): JSON, and within max_body_mb."""
    return await request.body()


def parse(model: type[M], raw: bytes) -> M:
    if not raw:
        raise ValueError("Invalid request: a JSON body is required")
    try:
        return model.model_validate_json(raw)
    except RecursionError as exc:
        raise ValueError("Invalid request: the JSON body is nested too deeply") from exc
    except (TypeError, KeyError, AttributeError, StopIteration) as exc:
        # Some of PyIceberg's validators raise these, which pydantic does not turn into a
        # ValidationError; raised while reading the body, they are the body's fault.
        raise ValueError(f"Invalid request: {exc}") from exc


def json_response(value: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(value, separators=(",", ":")).encode(),
        status_code=status_code,
        media_type="application/json",
        headers=headers,
    )


def raw_json_response(body: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(body, media_type="application/json", headers=headers)


def load_result(
    metadata_location: str | None,
    metadata: bytes,
    config: dict[str, str] | None = None,
    credentials: list[dict[str, Any]] | None = None,
    remote_signing: dict[str, Any] | None = None,
) -> Response:
    """LoadTableResult / LoadViewResult around metadata JSON that is already serialized."""
    head = b"{"
    if metadata_location is not None:
        head += b'"metadata-location":' + json.dumps(metadata_location).encode() + b","
    tail = b',"config":' + json.dumps(config or {}).encode()
    if credentials:
        tail += b',"storage-credentials":' + json.dumps(credentials).encode()
    if remote_signing is not None:
        tail += b',"remote-signing-config":' + json.dumps(remote_signing).encode()
    return raw_json_response(
        b"".join((head, b'"metadata":', metadata, tail, b"}"))
    )  # one copy of a large body


def identifiers_page(
    request: Request,
    page_token: str | None,
    page_size: int | None,
    fetch: Callable[[Any, int | None], Sequence[Identifier]],
) -> Response:
    """ListTablesResponse / ListViewsResponse."""
    items, token = page(request, page_token, page_size, fetch, key=lambda ident: ident.name)
    body: dict[str, Any] = {"identifiers": [{"namespace": list(i.namespace), "name": i.name} for i in items]}
    if token:
        body["next-page-token"] = token
    return json_response(body)


def referenced_by(value: str | None) -> list[Identifier]:
    """The spec's `referenced-by`: the chain of views an entity is loaded through, each
    `{namespace}{separator}{view}`, comma-separated (a comma in a name is %2C). Checked, never used
    to decide access: isbre grants by namespace, whatever view a client reads through."""
    found = []
    for part in (value or "").split(","):
        if not part:
            continue
        levels = unquote(part).split(NAMESPACE_SEPARATOR)
        if len(levels) < 2:
            raise ValueError(f"Invalid referenced-by: {part[:100]!r} is not a namespace and a view name")
        found.append(Identifier.of(levels[:-1], levels[-1]))
    return found


def namespace_from_path(segment: str) -> tuple[str, ...]:
    return check_namespace(segment.split(NAMESPACE_SEPARATOR))


def _encode_token(last: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(last).encode()).decode()


def _decode_token(token: str) -> Any:
    try:
        return json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"Invalid pageToken: {token[:64]!r}") from exc


def name_position(after: Any) -> str:
    """A page token's position in a listing of tables or views: the last name shown."""
    if not isinstance(after, str):
        raise ValueError("Invalid pageToken: not a position in this listing")
    return check_name(after)


def page(
    request: Request,
    page_token: str | None,
    page_size: int | None,
    fetch: Callable[[Any, int | None], Sequence[T]],
    key: Callable[[T], Any],
    position: Callable[[Any], Any] = name_position,
) -> tuple[Sequence[T], str | None]:
    """One page of a listing: `fetch(after, limit)` returns items after the token's `position`."""
    if page_size is not None and page_size < 1:
        raise ValueError(f"Invalid pageSize: {page_size}; it must be at least 1")
    paginated = page_token is not None or page_size is not None
    if not paginated:
        return fetch(None, None), None
    size = min(page_size or settings(request).max_page_size, settings(request).max_page_size)
    after = position(_decode_token(page_token)) if page_token else None
    items = fetch(after, size + 1)
    if len(items) > size:
        return items[:size], _encode_token(key(items[size - 1]))
    return items, None
