"""Who may do what, decided on the identifiers and parsed bodies that the route itself acts on.

Authentication (rest/auth.py) only says who the caller is. Each route then
declares the least role it needs through one of the dependencies below, and
checks every namespace it acts on against the caller's scopes, on the same
values it passes to the catalog: the path's namespace as FastAPI parsed it, the
identifiers of the request model. Nothing re-reads the path, the query or the
body to decide. `check_every_route_has_a_rule` refuses to build an app with a
route that declares no rule.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from isbre.catalog import CatalogService, Identifier
from isbre.catalog.locations import LocationPolicy
from isbre.rest.auth import Caller
from isbre.rest.roles import RANK, Role
from isbre.rest.wire import caller_of, namespace_from_path

# Marks a dependency as a route's authorization rule; its value is the least role.
RULE = "__isbre_role__"


class ForbiddenError(Exception):
    """The caller is known, and may not do this (403)."""


@dataclass(frozen=True)
class Access:
    """What one request's caller may do; `caller` is None when authentication is off."""

    caller: Caller | None

    def require(self, role: Role) -> None:
        if not self.may(role):
            assert self.caller is not None
            raise ForbiddenError(f"{self.caller.name} may not do this: it needs the {role} role")

    def may(self, role: Role) -> bool:
        return self.caller is None or self.caller.rank >= RANK[role]

    def namespace(self, namespace: tuple[str, ...]) -> tuple[str, ...]:
        """`namespace`, if the caller may use it."""
        if self.caller is not None and not self.caller.may_use(namespace):
            raise ForbiddenError(f"{self.caller.name} may not use namespace {'.'.join(namespace)}")
        return namespace

    def identifiers(self, idents: Iterable[Identifier]) -> None:
        for ident in idents:
            self.namespace(ident.namespace)

    def visible(self, namespace: tuple[str, ...]) -> bool:
        """Whether a listing may show `namespace`: in scope, or on the way to a scope."""
        if self.caller is None or self.caller.may_use(namespace):
            return True
        return any(scope[: len(namespace)] == namespace for scope in self.caller.namespaces)

    def places(self, service: CatalogService) -> LocationPolicy | None:
        """Where a scoped caller may put or read table and view files: under its namespaces'
        locations. None when the caller is not scoped (the catalog's own policy applies)."""
        if self.caller is None or not self.caller.namespaces:
            return None
        places = service.core.places
        roots = [places.namespace_location(scope) for scope in self.caller.namespaces]
        return places.policy.narrowed(roots, f"{self.caller.name}'s namespaces", ForbiddenError)


def access(request: Request) -> Access:
    return Access(caller_of(request))


def _rule(role: Role | Literal["public"], dependency: Callable[..., Any]) -> Callable[..., Any]:
    setattr(dependency, RULE, role)
    return dependency


def permits(role: Role) -> Callable[[Request], Awaitable[Access]]:
    """A route's rule when what it acts on is named in its body, or is the whole catalog."""

    # async: a check this cheap must not cost a trip to the thread pool.
    async def dependency(request: Request) -> Access:
        allowed = access(request)
        allowed.require(role)
        return allowed

    return _rule(role, dependency)


@dataclass(frozen=True)
class InNamespace:
    """The namespace of the route's path, checked, and what else the caller may do."""

    namespace: tuple[str, ...]
    access: Access

    def ident(self, name: str) -> Identifier:
        return Identifier.of(self.namespace, name)


def in_namespace(role: Role) -> Callable[[Request, str], Awaitable[InNamespace]]:
    """A route's rule for `/namespaces/{namespace}/...`: the role, and the path's namespace in scope."""

    async def dependency(request: Request, namespace: str) -> InNamespace:
        allowed = access(request)
        allowed.require(role)
        return InNamespace(allowed.namespace(namespace_from_path(namespace)), allowed)

    return _rule(role, dependency)


async def _public() -> None:
    return None


PUBLIC = _rule("public", _public)
READER, WRITER, ADMIN = permits("reader"), permits("writer"), permits("admin")
# The rules as route parameters: `target: WritesNamespace` is the path's namespace, which a writer in
# scope may change; `access: Writer` lets a writer act on namespaces it then checks.
Reader = Annotated[Access, Depends(READER)]
Writer = Annotated[Access, Depends(WRITER)]
Admin = Annotated[Access, Depends(ADMIN)]
ReadsNamespace = Annotated[InNamespace, Depends(in_namespace("reader"))]
WritesNamespace = Annotated[InNamespace, Depends(in_namespace("writer"))]
ManagesNamespace = Annotated[InNamespace, Depends(in_namespace("admin"))]


def _rules(dependant: Dependant) -> list[str]:
    found = [getattr(dependant.call, RULE)] if hasattr(dependant.call, RULE) else []
    for child in dependant.dependencies:
        found += _rules(child)
    return found


def check_every_route_has_a_rule(routes: Iterable[tuple[str, str, APIRoute]]) -> None:
    for method, path, route in routes:
        if not _rules(route.dependant):
            raise RuntimeError(f"route {method} {path} declares no authorization rule")
