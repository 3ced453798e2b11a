"""Validation of live exchanges against the Iceberg REST OpenAPI file in tests/specs."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from openapi_core import OpenAPI
from openapi_core.testing import MockRequest, MockResponse

SPEC = Path(__file__).resolve().parent / "specs" / "iceberg-rest-catalog-open-api.yaml"


@cache
def spec() -> OpenAPI:
    return OpenAPI.from_path(SPEC)


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
