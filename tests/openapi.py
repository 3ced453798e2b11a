"""Validation of live exchanges against the Iceberg REST OpenAPI file in tests/specs."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml
from openapi_core import OpenAPI
from openapi_core.testing import MockRequest, MockResponse

SPEC = Path(__file__).resolve().parent / "specs" / "iceberg-rest-catalog-open-api.yaml"


@cache
def spec() -> OpenAPI:
    """The spec as written, but for one schema: `PrimitiveTypeValue` is a `oneOf` of types that
    overlap (every string is a StringTypeValue, a DateTypeValue, a UUIDTypeValue...; every integer
    an IntegerTypeValue and a LongTypeValue), so no value could ever match exactly one of them.
    Read as the `anyOf` it means, a partition value, a bound or a literal in a filter validates.
    And a content file's `partition` may hold JSON `null`: a null partition value is what Java's
    `ContentFileParser` writes (through `SingleValueParser`) and reads for a file of a null
    partition, which no `PrimitiveTypeValue` can say."""
    document = _string_keys(yaml.safe_load(SPEC.read_text()))
    schemas = document["components"]["schemas"]
    schemas["PrimitiveTypeValue"]["anyOf"] = schemas["PrimitiveTypeValue"].pop("oneOf")
    schemas["ContentFile"]["properties"]["partition"]["items"] = {
        "anyOf": [{"$ref": "#/components/schemas/PrimitiveTypeValue"}, {"type": "null"}]
    }
    return OpenAPI.from_dict(document)


def _string_keys(node: Any) -> Any:
    """YAML reads a response code (`200:`) as a number; OpenAPI keys are strings."""
    if isinstance(node, dict):
        return {str(key): _string_keys(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_string_keys(value) for value in node]
    return node


def check(response: httpx.Response) -> httpx.Response:
    """Raise if `response` (or the request that produced it) breaks the spec's schemas."""
    request = response.request
    url = urlsplit(str(request.url))
    query: dict[str, str] = dict(httpx.QueryParams(url.query))
    mock_request = MockRequest(
        host_url=f"{url.scheme}://{url.netloc}",
        method=request.method.lower(),
        path=url.path,
        args=query,
        headers=dict(request.headers),
        data=request.content or None,
        content_type=request.headers.get("content-type", "application/json"),
    )
    mock_response = MockResponse(
        data=response.content,
        status_code=response.status_code,
        headers=dict(response.headers),
        content_type=response.headers.get("content-type", "application/json"),
    )
    spec().validate_response(mock_request, mock_response)
    return response
