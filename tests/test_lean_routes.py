"""The hot routes' lean serving (rest/lean_routes.py): the FastAPI route's own endpoint and rule,
for requests without a query string; everything else is FastAPI's."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import APIRouter, Depends, Header, Request, Response
from isbre.rest.app import create_app, served_routes
from isbre.rest.lean_routes import HOT_ROUTES, LeanRoute, lean_routes
from isbre.rest.settings import Settings
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from tests.http_client import http
from tests.server import ID_SCHEMA, IsbreServer


def _scope(method: str, path: str, query: bytes = b"") -> Scope:
    return {"type": "http", "method": method, "path": path, "query_string": query, "root_path": ""}


def _served_by(
    app_routes: list[BaseRoute], method: str, path: str, query: bytes = b""
) -> tuple[BaseRoute, BaseRoute]:
    """The route the request is counted under and the route Starlette's router hands it to (the
    first full match)."""
    for route in app_routes:
        match, child = route.matches(_scope(method, path, query))
        if match is Match.FULL:
            return child.get("route", route), route
    raise AssertionError(f"nothing serves {method} {path}")


def test_each_hot_route_is_served_lean_by_its_own_endpoint_and_rule(tmp_path: Path) -> None:
    app = create_app(Settings(warehouse=str(tmp_path / "warehouse")))
    declared = {(method, path): route for method, path, route in served_routes(app)}
    lean = [route for route in app.router.routes if isinstance(route, LeanRoute)]
    assert {(method, route.api_route.path_format) for route in lean for method in route.methods} == {
        (method, path.removeprefix("/v1/{prefix}")) for method, path in HOT_ROUTES
    }
    for method, path in HOT_ROUTES:
        concrete = path.replace("{prefix}", "isbre").replace("{namespace}", "ns").replace("{table}", "t")
        counted_as, serving = _served_by(app.router.routes, method, concrete)
        assert isinstance(serving, LeanRoute), (method, path)
        # The same APIRoute object: its endpoint, its rule (rest/access.py), its decorators.
        assert serving.api_route is declared[(method, path)] is counted_as
        # With a query string, FastAPI's own route serves (and validates) the request.
        _, serving = _served_by(app.router.routes, method, concrete, b"snapshots=refs")
        assert not isinstance(serving, LeanRoute), (method, path)


def test_a_request_the_lean_route_serves_is_answered_as_fastapi_answers_it(
    server: IsbreServer, namespace: str
) -> None:
    tables = f"{server.url}/v1/isbre/namespaces/{namespace}/tables"
    http.post(tables, json={"name": "t", "schema": ID_SCHEMA}).raise_for_status()
    url = f"{tables}/t"
    lean, full = http.get(url), http.get(url, params={"snapshots": "all"})
    assert lean.status_code == full.status_code == 200
    assert lean.content == full.content and lean.headers["etag"] == full.headers["etag"]
    # FastAPI validates what only it serves; the lean route takes no query string to get wrong.
    refused = http.get(url, params={"snapshots": "some"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == 400
    missing = http.get(f"{tables}/absent")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NoSuchTableException"
    assert http.head(url).status_code == 204 and http.head(f"{url}x").status_code == 404


async def _rule(request: Request) -> str:
    return "allowed"


def _router_with(endpoint: object) -> APIRouter:
    router = APIRouter()
    router.add_api_route("/x", endpoint, methods=["GET"])  # type: ignore[arg-type]
    return router


def _with_header(request: Request, who: str = Depends(_rule), agent: str = Header("")) -> Response:
    return Response()


def _sync_rule(request: Request) -> str:
    return "allowed"


def _with_sync_dependency(request: Request, who: str = Depends(_sync_rule)) -> Response:
    return Response()


def _with_required_query(request: Request, limit: int, who: str = Depends(_rule)) -> Response:
    return Response()


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        (_with_header, "kinds not served lean: header"),
        (_with_sync_dependency, "not an async function"),
        (_with_required_query, "query parameter limit has no default"),
    ],
)
def test_a_route_with_parameters_of_another_kind_is_refused(endpoint: object, why: str) -> None:
    with pytest.raises(RuntimeError, match=why):
        lean_routes([(_router_with(endpoint), "")], frozenset({("GET", "/x")}))


def test_a_hot_route_the_app_lacks_is_refused() -> None:
    async def endpoint(request: Request, who: str = Depends(_rule)) -> Response:
        return Response()

    with pytest.raises(RuntimeError, match="not served by the app"):
        lean_routes([(_router_with(endpoint), "")], frozenset({("GET", "/x"), ("POST", "/x")}))
