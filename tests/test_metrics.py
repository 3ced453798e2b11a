"""GET /metrics is public: nothing a client sends can forge a line of it or grow it without bound."""

from __future__ import annotations

import re

import httpx

from tests.http_client import http
from tests.server import ID_SCHEMA, IsbreServer

SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\\n])*",?)*\})? '
    r"(-?[0-9.]+(e[+-]?[0-9]+)?|[+-]Inf|NaN)$"
)


def exposition_is_well_formed(text: str) -> dict[str, str]:
    """Every line a comment or one sample; returns the unlabelled samples by name."""
    plain = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        assert SAMPLE.match(line), f"not a sample line: {line!r}"
        name, _, value = line.partition(" ")
        if "{" not in name:
            assert name not in plain, f"{name} twice"
            plain[name] = value
    return plain


def report(server: IsbreServer, namespace: str, report_type: str) -> httpx.Response:
    return http.post(
        f"{server.url}/v1/isbre/namespaces/{namespace}/tables/t/metrics",
        json={"report-type": report_type, "table-name": "t"},
        timeout=60,
    )


def test_a_report_type_cannot_forge_a_metrics_line(server: IsbreServer, namespace: str) -> None:
    http.post(f"{server.url}/v1/isbre/namespaces/{namespace}/tables", json={"name": "t", "schema": ID_SCHEMA})
    for forged in ('scan"} 1\nisbre_commit_seq 999999\n#', "x\nisbre_commit_seq 999999", "a\\"):
        assert report(server, namespace, forged).status_code == 204
    assert report(server, namespace, "scan-report").status_code == 204
    text = http.get(f"{server.url}/metrics").text
    plain = exposition_is_well_formed(text)
    assert plain["isbre_commit_seq"] == str(server.high_water())
    assert 'isbre_metrics_reports_total{type="scan-report"}' in text
    assert 'isbre_metrics_reports_total{type="other"}' in text
    assert "999999" not in text


def test_reports_of_many_huge_types_do_not_grow_the_metrics(server: IsbreServer, namespace: str) -> None:
    before = len(http.get(f"{server.url}/metrics").content)
    for n in range(20):
        assert report(server, namespace, f"{n}" + "x" * (10 << 20)).status_code == 204
    after = http.get(f"{server.url}/metrics")
    exposition_is_well_formed(after.text)
    assert len(after.content) < before + 2048


def test_a_request_method_cannot_forge_or_grow_the_metrics(server: IsbreServer) -> None:
    unusual = ["PROPFIND", "MKCOL", "TRACE", "LOCK", "UNLOCK", "SEARCH", "PURGE", "REPORT", "MKCALENDAR"]
    with httpx.Client() as client:
        for method in unusual:
            client.request(method, f"{server.url}/v1/config")
    text = http.get(f"{server.url}/metrics").text
    exposition_is_well_formed(text)
    assert [line for line in text.splitlines() if any(method in line for method in unusual)] == []
    assert 'method="other"' in text
