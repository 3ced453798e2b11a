"""Every route the app serves, for every role and for namespace-scoped principals, inside and outside
their scope: allowed or refused with 403, decided before anything else is looked at.

The routes are read off the application itself, so a route added without a case here fails
`test_every_route_has_a_case`, and a route added without an authorization rule fails to start.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from isbre.rest.app import create_app, served_routes
from isbre.rest.auth import sha256_hex
from isbre.rest.settings import AuthSettings, Settings

from tests.http_client import http
from tests.openapi import check
from tests.server import ID_SCHEMA, IsbreServer, secured_server

RANK = {"public": -1, "reader": 0, "writer": 1, "admin": 2}


@dataclass(frozen=True)
class Who:
    name: str
    role: str
    scope: str | None  # the one namespace it may use, or None for all

    @property
    def token(self) -> str:
        return f"token-of-{self.name}"

    def principal(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "name": self.name,
            "roles": [self.role],
            "token_sha256": sha256_hex(self.token),
        }
        if self.scope:
            found["namespaces"] = [self.scope]
        return found


PEOPLE = [
    Who("root", "admin", None),
    Who("etl", "writer", None),
    Who("bi", "reader", None),
    Who("sales-admin", "admin", "sales"),
    Who("sales-etl", "writer", "sales"),
    Who("sales-bi", "reader", "sales"),
]
ROOT = PEOPLE[0]
_unique = itertools.count()


@dataclass(frozen=True)
class Call:
    method: str
    path: str  # under the server's root
    body: Any = None
    query: dict[str, Any] | None = None


@dataclass(frozen=True)
class Case:
    role: str  # the least role that may make the call
    make: Callable[[str], Call]  # the call, aimed at objects of one namespace
    scoped: bool = True  # whether a namespace scope limits it


def commit_body(ns: str, name: str) -> dict[str, Any]:
    # A requirement that cannot hold: an allowed caller gets 409 and nothing changes.
    return {
        "identifier": {"namespace": [ns], "name": name},
        "requirements": [{"type": "assert-table-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}],
        "updates": [],
    }


def view_body(ns: str, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "schema": ID_SCHEMA,
        "view-version": {
            "version-id": 1,
            "timestamp-ms": 1,
            "schema-id": 0,
            "summary": {"engine-name": "test"},
            "representations": [{"type": "sql", "sql": "select 1", "dialect": "spark"}],
            "default-namespace": [ns],
        },
    }


P = "/v1/isbre"
CASES: dict[tuple[str, str], Case] = {
    ("GET", "/v1/config"): Case("reader", lambda ns: Call("GET", "/v1/config"), scoped=False),
    ("POST", "/v1/oauth/tokens"): Case(
        "public", lambda ns: Call("POST", "/v1/oauth/tokens", {"grant_type": "client_credentials"}), False
    ),
    ("GET", "/live"): Case("public", lambda ns: Call("GET", "/live"), scoped=False),
    ("GET", "/ready"): Case("public", lambda ns: Call("GET", "/ready"), scoped=False),
    ("GET", "/health"): Case("public", lambda ns: Call("GET", "/health"), scoped=False),
    ("GET", "/metrics"): Case("public", lambda ns: Call("GET", "/metrics"), scoped=False),
    ("GET", "/v1/lineage/status"): Case("reader", lambda ns: Call("GET", "/v1/lineage/status"), False),
    ("GET", "/v1/warehouses"): Case("reader", lambda ns: Call("GET", "/v1/warehouses"), scoped=False),
    # The console's page and scripts: no data in them (what they fetch is authorized as above).
    ("GET", "/ui"): Case("public", lambda ns: Call("GET", "/ui"), scoped=False),
    ("GET", "/ui/"): Case("public", lambda ns: Call("GET", "/ui/"), scoped=False),
    ("GET", "/ui/{name}"): Case("public", lambda ns: Call("GET", "/ui/app.js"), scoped=False),
    ("GET", f"{P}/namespaces"): Case(
        "reader", lambda ns: Call("GET", f"{P}/namespaces", query={"parent": ns})
    ),
    ("POST", f"{P}/namespaces"): Case(
        "admin", lambda ns: Call("POST", f"{P}/namespaces", {"namespace": [ns, f"n{next(_unique)}"]})
    ),
    ("GET", f"{P}/namespaces/{{namespace}}"): Case("reader", lambda ns: Call("GET", f"{P}/namespaces/{ns}")),
    ("HEAD", f"{P}/namespaces/{{namespace}}"): Case(
        "reader", lambda ns: Call("HEAD", f"{P}/namespaces/{ns}")
    ),
    ("DELETE", f"{P}/namespaces/{{namespace}}"): Case(
        "admin",
        lambda ns: Call("DELETE", f"{P}/namespaces/{ns}"),  # not empty: 409 when allowed
    ),
    ("POST", f"{P}/namespaces/{{namespace}}/properties"): Case(
        "admin", lambda ns: Call("POST", f"{P}/namespaces/{ns}/properties", {"updates": {"k": "v"}})
    ),
    ("GET", f"{P}/namespaces/{{namespace}}/tables"): Case(
        "reader", lambda ns: Call("GET", f"{P}/namespaces/{ns}/tables")
    ),
    ("POST", f"{P}/namespaces/{{namespace}}/tables"): Case(
        "writer",
        lambda ns: Call(
            "POST", f"{P}/namespaces/{ns}/tables", {"name": f"t{next(_unique)}", "schema": ID_SCHEMA}
        ),
    ),
    ("GET", f"{P}/namespaces/{{namespace}}/tables/{{table}}"): Case(
        "reader", lambda ns: Call("GET", f"{P}/namespaces/{ns}/tables/t")
    ),
    ("HEAD", f"{P}/namespaces/{{namespace}}/tables/{{table}}"): Case(
        "reader", lambda ns: Call("HEAD", f"{P}/namespaces/{ns}/tables/t")
    ),
    ("GET", f"{P}/namespaces/{{namespace}}/tables/{{table}}/coverage"): Case(
        "reader", lambda ns: Call("GET", f"{P}/namespaces/{ns}/tables/t/coverage")
    ),
    ("POST", f"{P}/namespaces/{{namespace}}/tables/{{table}}"): Case(
        "writer", lambda ns: Call("POST", f"{P}/namespaces/{ns}/tables/t", commit_body(ns, "t"))
    ),
    ("DELETE", f"{P}/namespaces/{{namespace}}/tables/{{table}}"): Case(
        "admin",
        lambda ns: Call("DELETE", f"{P}/namespaces/{ns}/tables/ghost", query={"purgeRequested": "true"}),
    ),
    ("POST", f"{P}/namespaces/{{namespace}}/register"): Case(
        "writer",
        lambda ns: Call(
            "POST", f"{P}/namespaces/{ns}/register", {"name": "r", "metadata-location": f"/nowhere/{ns}.json"}
        ),
    ),
    ("GET", f"{P}/namespaces/{{namespace}}/tables/{{table}}/maintenance"): Case(
        "reader", lambda ns: Call("GET", f"{P}/namespaces/{ns}/tables/t/maintenance")
    ),
    ("POST", f"{P}/namespaces/{{namespace}}/tables/{{table}}/maintenance"): Case(
        "admin",
        lambda ns: Call(
            "POST", f"{P}/namespaces/{ns}/tables/ghost/maintenance", {"jobs": ["expire-snapshots"]}
        ),
    ),
    ("POST", f"{P}/tables/rename"): Case(
        "writer",
        lambda ns: Call(
            "POST",
            f"{P}/tables/rename",
            {
                "source": {"namespace": [ns], "name": "ghost"},
                "destination": {"namespace": [ns], "name": "g2"},
            },
        ),
    ),
    ("POST", f"{P}/namespaces/{{namespace}}/tables/{{table}}/metrics"): Case(
        "reader",
        lambda ns: Call(
            "POST", f"{P}/namespaces/{ns}/tables/t/metrics", {"report-type": "scan-report", "table-name": "t"}
        ),
    ),
    ("GET", f"{P}/namespaces/{{namespace}}/tables/{{table}}/credentials"): Case(
        "reader", lambda ns: Call("GET", f"{P}/namespaces/{ns}/tables/t/credentials")
    ),
    ("POST", f"{P}/namespaces/{{namespace}}/tables/{{table}}/sign"): Case(
        "reader",
        lambda ns: Call(
            "POST",
            f"{P}/namespaces/{ns}/tables/t/sign",
            {"method": "GET", "region": "us-east-1", "uri": "http://127.0.0.1:1/b/k", "headers": {}},
        ),
    ),
    ("POST", f"{P}/namespaces/{{namespace}}/tables/{{table}}/plan"): Case(
        "reader", lambda ns: Call("POST", f"{P}/namespaces/{ns}/tables/t/plan", {})
    ),
    # A plan id and a plan task of the caller's own making: refused out of scope before they are read.
    ("GET", f"{P}/namespaces/{{namespace}}/tables/{{table}}/plan/{{plan_id}}"): Case(
        "reader", lambda ns: Call("GET", f"{P}/namespaces/{ns}/tables/t/plan/unknown")
    ),
    ("DELETE", f"{P}/namespaces/{{namespace}}/tables/{{table}}/plan/{{plan_id}}"): Case(
        "reader", lambda ns: Call("DELETE", f"{P}/namespaces/{ns}/tables/t/plan/unknown")
    ),
    ("POST", f"{P}/namespaces/{{namespace}}/tables/{{table}}/tasks"): Case(
        "reader", lambda ns: Call("POST", f"{P}/namespaces/{ns}/tables/t/tasks", {"plan-task": "unknown"})
    ),
    ("GET", f"{P}/namespaces/{{namespace}}/tables/{{table}}/consumers"): Case(
        "reader", lambda ns: Call("GET", f"{P}/namespaces/{ns}/tables/t/consumers")
    ),
    ("GET", f"{P}/namespaces/{{namespace}}/tables/{{table}}/consumers/{{consumer}}"): Case(
        "reader", lambda ns: Call("GET", f"{P}/namespaces/{ns}/tables/t/consumers/c")
    ),
    ("PUT", f"{P}/namespaces/{{namespace}}/tables/{{table}}/consumers/{{consumer}}"): Case(
        "reader",
        # Expects a cursor that is not there: an allowed caller gets 409 and nothing moves.
        lambda ns: Call(
            "PUT", f"{P}/namespaces/{ns}/tables/t/consumers/c", {"commit-seq": 0, "expected-commit-seq": 7}
        ),
    ),
    ("DELETE", f"{P}/namespaces/{{namespace}}/tables/{{table}}/consumers/{{consumer}}"): Case(
        "writer", lambda ns: Call("DELETE", f"{P}/namespaces/{ns}/tables/t/consumers/ghost")
    ),
    ("POST", f"{P}/transactions/commit"): Case(
        "writer",
        lambda ns: Call("POST", f"{P}/transactions/commit", {"table-changes": [commit_body(ns, "t")]}),
    ),
    ("GET", f"{P}/namespaces/{{namespace}}/views"): Case(
        "reader", lambda ns: Call("GET", f"{P}/namespaces/{ns}/views")
    ),
    ("POST", f"{P}/namespaces/{{namespace}}/views"): Case(
        "writer", lambda ns: Call("POST", f"{P}/namespaces/{ns}/views", view_body(ns, f"v{next(_unique)}"))
    ),
    ("GET", f"{P}/namespaces/{{namespace}}/views/{{view}}"): Case(
        "reader", lambda ns: Call("GET", f"{P}/namespaces/{ns}/views/v")
    ),
    ("HEAD", f"{P}/namespaces/{{namespace}}/views/{{view}}"): Case(
        "reader", lambda ns: Call("HEAD", f"{P}/namespaces/{ns}/views/v")
    ),
    ("POST", f"{P}/namespaces/{{namespace}}/views/{{view}}"): Case(
        "writer",
        lambda ns: Call(
            "POST",
            f"{P}/namespaces/{ns}/views/v",
            {
                "requirements": [
                    {"type": "assert-view-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}
                ],
                "updates": [{"action": "set-properties", "updates": {"k": "v"}}],
            },
        ),
    ),
    ("DELETE", f"{P}/namespaces/{{namespace}}/views/{{view}}"): Case(
        "admin", lambda ns: Call("DELETE", f"{P}/namespaces/{ns}/views/ghost")
    ),
    ("POST", f"{P}/views/rename"): Case(
        "writer",
        lambda ns: Call(
            "POST",
            f"{P}/views/rename",
            {
                "source": {"namespace": [ns], "name": "ghost"},
                "destination": {"namespace": [ns], "name": "g2"},
            },
        ),
    ),
    ("POST", f"{P}/namespaces/{{namespace}}/register-view"): Case(
        "writer",
        lambda ns: Call(
            "POST",
            f"{P}/namespaces/{ns}/register-view",
            {"name": "r", "metadata-location": f"/nowhere/{ns}.json"},
        ),
    ),
    ("GET", f"{P}/events"): Case("reader", lambda ns: Call("GET", f"{P}/events", query={"after": 0}), False),
    ("GET", f"{P}/events/cursor"): Case("reader", lambda ns: Call("GET", f"{P}/events/cursor"), False),
    ("GET", f"{P}/events/recent"): Case("reader", lambda ns: Call("GET", f"{P}/events/recent"), False),
    ("POST", f"{P}/events"): Case("reader", lambda ns: Call("POST", f"{P}/events", {"page-size": 1}), False),
}

# Requests that an earlier, path-and-body-parsing gatekeeper let through: each must be refused.
TRICKS: list[tuple[Who, Call]] = [
    # A table called "metrics": committing to it is a write, whatever its name.
    (PEOPLE[2], Call("POST", f"{P}/namespaces/sales/tables/metrics", commit_body("sales", "metrics"))),
    (
        PEOPLE[2],
        Call(
            "POST",
            f"{P}/namespaces/sales/views/metrics",
            {"updates": [{"action": "set-properties", "updates": {}}]},
        ),
    ),
    (
        PEOPLE[2],
        Call(
            "POST",
            f"{P}/namespaces/sales/tables/metrics",
            {
                "requirements": [{"type": "assert-create"}],
                "updates": [{"action": "assign-uuid", "uuid": "0" * 8}],
            },
        ),
    ),
    # The transaction's changes under the field name's other spelling.
    (PEOPLE[4], Call("POST", f"{P}/transactions/commit", {"table_changes": [commit_body("other", "t")]})),
    # Namespaces named through percent-encoding and the unit separator.
    (PEOPLE[5], Call("GET", f"{P}/namespaces/%6Fther/tables/t")),
    (PEOPLE[5], Call("GET", f"{P}/namespaces/other%1Fdeep")),
    (PEOPLE[5], Call("GET", "/v1/namespaces/other/tables/t")),  # the unprefixed alias
    # A rename out of scope on either side.
    (
        PEOPLE[4],
        Call(
            "POST",
            f"{P}/tables/rename",
            {
                "source": {"namespace": ["other"], "name": "t"},
                "destination": {"namespace": ["sales"], "name": "x"},
            },
        ),
    ),
    (
        PEOPLE[4],
        Call(
            "POST",
            f"{P}/tables/rename",
            {
                "source": {"namespace": ["sales"], "name": "t"},
                "destination": {"namespace": ["other"], "name": "x"},
            },
        ),
    ),
]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    server = secured_server(tmp_path_factory.mktemp("authz") / "warehouse", [w.principal() for w in PEOPLE])
    for ns in ("sales", "other"):
        assert send(server, ROOT, Call("POST", f"{P}/namespaces", {"namespace": [ns]})).status_code == 200
        assert send(
            server, ROOT, Call("POST", f"{P}/namespaces/{ns}/tables", {"name": "t", "schema": ID_SCHEMA})
        )
        assert (
            send(server, ROOT, Call("POST", f"{P}/namespaces/{ns}/views", view_body(ns, "v"))).status_code
            == 200
        )
    yield server
    server.stop()


def send(server: IsbreServer, who: Who, call: Call) -> httpx.Response:
    headers = {"Authorization": f"Bearer {who.token}"}
    if call.path == "/v1/oauth/tokens":
        return http.post(f"{server.url}{call.path}", data=call.body, timeout=10)
    if call.path.endswith("/events") and call.method == "GET":
        with http.stream(
            "GET", f"{server.url}{call.path}", params=call.query, headers=headers, timeout=10
        ) as r:
            return r  # the status is all this needs; closing ends the stream
    return http.request(
        call.method,
        f"{server.url}{call.path}",
        json=call.body,
        params=call.query,
        headers=headers,
        timeout=10,
    )


def test_every_route_has_a_case() -> None:
    app = create_app(Settings(auth=AuthSettings(enabled=True, token_secret="x")))
    # Catalog routes serve every warehouse under its prefix; the cases call the default one.
    routes = {(method, path.replace("/v1/{prefix}", P)) for method, path, _ in served_routes(app)}
    assert routes - CASES.keys() == set(), "routes without an authorization case"
    assert CASES.keys() - routes == set(), "cases for routes that are not served"


@pytest.mark.parametrize("who", PEOPLE, ids=lambda who: who.name)
def test_each_route_allows_or_refuses_each_principal(secured: IsbreServer, who: Who) -> None:
    wrong = []
    for (method, path), case in CASES.items():
        targets = ("sales", "other") if case.scoped else ("sales",)
        for ns in targets:
            call = case.make(ns)
            allowed = RANK[who.role] >= RANK[case.role] and (not case.scoped or who.scope in (None, ns))
            response = send(secured, who, call)
            if "/plan" in path or path.endswith("/tasks"):
                check(response)  # the plan routes' refusals and answers, as the spec writes them
            status = response.status_code
            # The token endpoint's own 401 (no client credentials here) is its answer, not a refusal.
            refused = status == 403 or (status == 401 and case.role != "public")
            if allowed == refused or (not allowed and status != 403):
                wrong.append(f"{method} {path} on {ns}: {status}, expected {'allowed' if allowed else 403}")
    assert wrong == []


@pytest.mark.parametrize("trick", range(len(TRICKS)))
def test_requests_that_name_objects_indirectly_are_refused(secured: IsbreServer, trick: int) -> None:
    who, call = TRICKS[trick]
    before = secured.high_water(ROOT.token)
    response = send(secured, who, call)
    assert response.status_code == 403, response.text
    assert secured.high_water(ROOT.token) == before


def test_a_scoped_reader_lists_only_what_it_may_use(secured: IsbreServer) -> None:
    listed = send(secured, PEOPLE[5], Call("GET", f"{P}/namespaces")).json()["namespaces"]
    assert listed == [["sales"]]
    assert sorted(send(secured, PEOPLE[2], Call("GET", f"{P}/namespaces")).json()["namespaces"]) == [
        ["other"],
        ["sales"],
    ]


# Another namespace, spelled so that it might pass for the caller's own.
SPELLINGS = ["other", "OTHER", "sales%2F..%2Fother", "%2E%2E%2Fother", "other%1Fsales", "sales%2Fother"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_the_lean_routes_refuse_what_fastapi_s_routes_refuse(secured: IsbreServer, spelling: str) -> None:
    """The hot routes without a query string are served by rest/lean_routes.py, with one (ignored
    or defaulted) they are FastAPI's: a scoped caller is refused the same either way, for every
    spelling of a namespace outside its scope, and nothing is committed."""
    who = next(w for w in PEOPLE if w.name == "sales-etl")
    path = f"{P}/namespaces/{spelling}/tables/t"
    body = {"requirements": [{"type": "assert-table-uuid", "uuid": str(uuid.UUID(int=0))}], "updates": []}
    before = secured.high_water(ROOT.token)
    for method, payload in (("GET", None), ("HEAD", None), ("POST", body)):
        lean = send(secured, who, Call(method, path, payload))
        full = send(secured, who, Call(method, path, payload, {"snapshots": "all"}))
        assert lean.status_code == full.status_code == 403, (method, lean.status_code, full.status_code)
    assert secured.high_water(ROOT.token) == before
