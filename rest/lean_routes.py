"""The hot routes, served without FastAPI's per-request machinery.

loadTable, tableExists, commitTable and commitTransaction are most of what a catalog is asked.
FastAPI finds a request's route by trying its routes in turn and solves the route's parameters
generically, which costs more than a cached loadTable's own work (docs/benchmarks.md). For each
of these routes a Starlette route, tried first, answers the requests that carry no query string
(PyIceberg's and DuckDB's, the common shape) by calling the FastAPI route's own endpoint with what
FastAPI would have passed it: the request, the path parameters, the answer of the route's own
authorization rule and of its other dependencies, and the query parameters' defaults. A request
with a query string is left to the FastAPI route, which validates it.

So each route keeps one definition: its endpoint with its decorators (idempotency), its rule and
its path are the FastAPI route's. A route whose parameters are of another kind cannot be served
this way, and the app refuses to start rather than serve it differently.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match, Route
from starlette.types import Scope

TABLE = "/v1/{prefix}/namespaces/{namespace}/tables/{table}"
HOT_ROUTES = frozenset(
    {("GET", TABLE), ("HEAD", TABLE), ("POST", TABLE), ("POST", "/v1/{prefix}/transactions/commit")}
)


@dataclass(frozen=True)
class _Solved:
    """One dependency of an endpoint: the parameter it fills, and how to call it."""

    name: str
    call: Callable[..., Awaitable[Any]]
    request_param: str | None
    path_params: tuple[str, ...]


class LeanRoute(Route):
    """`api_route`'s `method`, for requests without a query string."""

    def __init__(self, path: str, method: str, api_route: APIRoute) -> None:
        self.api_route = api_route
        serve = _server(api_route.dependant, f"{method} {path}")
        super().__init__(path, serve, methods=[method], name=api_route.name)
        self.methods = {method}  # Starlette adds HEAD to a GET; a HEAD here is tableExists

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope.get("query_string"):
            return Match.NONE, {}
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:  # what the request is counted under (rest/metrics.py) is the route's
            child_scope["route"] = self.api_route
        return match, child_scope


def lean_routes(mounted: Iterable[tuple[APIRouter, str]], hot: frozenset[tuple[str, str]]) -> list[LeanRoute]:
    """A LeanRoute for each (method, path template) of `hot`, from the routers `mounted` (router,
    path prefix); RuntimeError when one is not there or cannot be served lean."""
    found = []
    for router, prefix in mounted:
        for route in router.routes:
            if not isinstance(route, APIRoute):
                continue
            for method in sorted(route.methods or ()):
                if (method, prefix + route.path_format) not in hot:
                    continue
                if router.dependencies:  # FastAPI adds them to each of its routes' own
                    where = f"{method} {prefix}{route.path}"
                    raise RuntimeError(f"{where}: its router's dependencies are not served lean")
                found.append(LeanRoute(prefix + route.path, method, route))
    missing = hot - {(method, route.path_format) for route in found for method in route.methods or ()}
    if missing:
        raise RuntimeError(f"hot routes not served by the app: {sorted(missing)}")
    return found


def _server(dependant: Dependant, where: str) -> Callable[[Request], Awaitable[Response]]:
    endpoint = dependant.call
    if endpoint is None:
        raise RuntimeError(f"{where}: no endpoint")
    _refuse_other_kinds(dependant, where)
    solved = [_solve(sub, where) for sub in dependant.dependencies]
    path_params = tuple(field.name for field in dependant.path_params)
    for field in dependant.path_params:
        if field.field_info.annotation is not str:
            raise RuntimeError(f"{where}: path parameter {field.name} is not a str")
    defaults: dict[str, Any] = {}
    for field in dependant.query_params:
        if field.field_info.is_required():
            raise RuntimeError(f"{where}: query parameter {field.name} has no default")
        defaults[field.name] = field.field_info.get_default(call_default_factory=True)
    request_param = dependant.request_param_name
    threaded = not inspect.iscoroutinefunction(endpoint)

    async def serve(request: Request) -> Response:
        path = request.path_params
        values = dict(defaults)
        for dependency in solved:
            arguments = {name: path[name] for name in dependency.path_params}
            if dependency.request_param is not None:
                arguments[dependency.request_param] = request
            values[dependency.name] = await dependency.call(**arguments)
        for name in path_params:
            values[name] = path[name]
        if request_param is not None:
            values[request_param] = request
        answer = await run_in_threadpool(endpoint, **values) if threaded else await endpoint(**values)
        if not isinstance(answer, Response):
            raise TypeError(f"{where}: the endpoint must return a Response, not {type(answer).__name__}")
        return answer

    return serve


def _solve(sub: Dependant, where: str) -> _Solved:
    """A dependency called with the request and path parameters only, as the rules of
    rest/access.py and `raw_body` are."""
    if sub.name is None or sub.call is None or not inspect.iscoroutinefunction(sub.call):
        raise RuntimeError(f"{where}: dependency {sub.name} is not an async function of a parameter")
    if sub.dependencies:
        raise RuntimeError(f"{where}: dependency {sub.name} has dependencies of its own")
    _refuse_other_kinds(sub, where)
    if sub.query_params:
        raise RuntimeError(f"{where}: dependency {sub.name} takes query parameters")
    return _Solved(sub.name, sub.call, sub.request_param_name, tuple(field.name for field in sub.path_params))


def _refuse_other_kinds(dependant: Dependant, where: str) -> None:
    others = {
        "header": dependant.header_params,
        "cookie": dependant.cookie_params,
        "body": dependant.body_params,
        "websocket": dependant.websocket_param_name,
        "connection": dependant.http_connection_param_name,
        "response": dependant.response_param_name,
        "background tasks": dependant.background_tasks_param_name,
        "security scopes": dependant.security_scopes_param_name,
    }
    taken = [kind for kind, present in others.items() if present]
    if taken:
        raise RuntimeError(f"{where}: parameters of kinds not served lean: {', '.join(taken)}")
