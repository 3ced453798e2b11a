"""Raw Iceberg REST protocol checks with httpx: caching headers, conflicts, bad input."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog

from tests.http_client import http
from tests.server import IsbreServer, start_threads
from tests.waiting import eventually

# The REST suite runs against one server process and against two workers on one store.
SERVER_WORKERS = (1, 2)
SERVER_STORES = ("lmdb", "postgresql")

SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}


def create(server: IsbreServer, namespace: str, name: str, **extra: object) -> httpx.Response:
    return http.post(
        f"{server.url}/v1/isbre/namespaces/{namespace}/tables", json={"name": name, "schema": SCHEMA, **extra}
    )


def test_config_advertises_prefix_and_endpoints(server: IsbreServer) -> None:
    body = http.get(f"{server.url}/v1/config").json()
    assert body["overrides"]["prefix"] == "isbre"
    assert "POST /v1/{prefix}/transactions/commit" in body["endpoints"]
    assert "GET /v1/{prefix}/namespaces/{namespace}/views/{view}" in body["endpoints"]
    assert http.get(f"{server.url}/v1/config", params={"warehouse": "isbre"}).status_code == 200
    unknown = http.get(f"{server.url}/v1/config", params={"warehouse": "elsewhere"})
    assert unknown.status_code == 400


def test_unknown_prefix_is_404(server: IsbreServer) -> None:
    response = http.get(f"{server.url}/v1/other/namespaces")
    assert response.status_code == 404
    assert response.json()["error"] == {
        "message": "Unknown catalog prefix 'other'; this server serves 'isbre'",
        "type": "NotFoundException",
        "code": 404,
    }


def test_unprefixed_paths_are_aliases(server: IsbreServer) -> None:
    for name in ("namespaces", "isbre"):
        created = http.post(f"{server.url}/v1/namespaces", json={"namespace": [name]})
        assert created.status_code == 200, created.text
        assert http.get(f"{server.url}/v1/namespaces/{name}").json()["namespace"] == [name]
        assert http.get(f"{server.url}/v1/isbre/namespaces/{name}").json()["namespace"] == [name]
        assert create(server, name, "t").status_code == 200
        assert http.get(f"{server.url}/v1/namespaces/{name}/tables/t").status_code == 200


def test_load_table_etag_and_not_modified(server: IsbreServer, namespace: str) -> None:
    assert create(server, namespace, "cached").status_code == 200
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/cached"
    first = http.get(url)
    etag = first.headers["etag"]
    assert http.get(url, headers={"If-None-Match": etag}).status_code == 304

    commit = {"updates": [{"action": "set-properties", "updates": {"k": "v"}}]}
    assert http.post(url, json=commit).status_code == 200
    after = http.get(url, headers={"If-None-Match": etag})
    assert after.status_code == 200
    assert after.headers["etag"] != etag
    assert after.json()["metadata"]["properties"]["k"] == "v"


def test_snapshots_refs_returns_only_referenced(
    rest_catalog: RestCatalog, server: IsbreServer, namespace: str
) -> None:
    table = rest_catalog.create_table(f"{namespace}.snaps", schema=pa.schema([pa.field("x", pa.int64())]))
    for i in range(3):
        table.append(pa.table({"x": pa.array([i], pa.int64())}))
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/snaps"
    assert len(http.get(url, params={"snapshots": "all"}).json()["metadata"]["snapshots"]) == 3
    refs = http.get(url, params={"snapshots": "refs"}).json()["metadata"]["snapshots"]
    assert [s["snapshot-id"] for s in refs] == [table.current_snapshot().snapshot_id]
    assert http.get(url, params={"snapshots": "some"}).status_code == 400


def test_stale_requirement_is_409_commit_failed(server: IsbreServer, namespace: str) -> None:
    create(server, namespace, "guarded").raise_for_status()
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/guarded"
    commit = {
        "requirements": [{"type": "assert-current-schema-id", "current-schema-id": 7}],
        "updates": [{"action": "set-properties", "updates": {"k": "v"}}],
    }
    response = http.post(url, json=commit)
    assert response.status_code == 409
    assert response.json()["error"]["type"] == "CommitFailedException"
    assert "k" not in http.get(url).json()["metadata"]["properties"]


@pytest.mark.parametrize(
    "commit",
    [
        {"updates": [{"action": "no-such-action"}]},
        {"updates": [{"action": "set-current-schema", "schema-id": 42}]},
        {
            "updates": [
                {"action": "set-properties", "updates": {"a": "1"}},
                {"action": "set-default-spec", "spec-id": 9},
            ]
        },
        {"requirements": [{"type": "assert-create"}, {"type": "bogus"}], "updates": []},
        {"identifier": {"namespace": ["elsewhere"], "name": "other"}, "updates": []},
        "not an object",
    ],
)
def test_bad_commit_is_400_and_changes_nothing(server: IsbreServer, namespace: str, commit: object) -> None:
    create(server, namespace, "strict").raise_for_status()
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/strict"
    before = http.get(url).json()
    response = http.post(url, json=commit)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "BadRequestException"
    assert http.get(url).json() == before


def test_malformed_json_is_400(server: IsbreServer, namespace: str) -> None:
    response = http.post(
        f"{server.url}/v1/isbre/namespaces/{namespace}/tables",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "BadRequestException"


@pytest.mark.parametrize("name", ["", "..", "x\ty", "n" * 300])
def test_bad_table_name_is_400_and_leaves_nothing(server: IsbreServer, namespace: str, name: str) -> None:
    response = create(server, namespace, name)
    assert response.status_code == 400, response.text
    listing = http.get(f"{server.url}/v1/isbre/namespaces/{namespace}/tables").json()
    assert listing["identifiers"] == []
    assert not list(server.warehouse.joinpath(namespace).glob("*"))


def test_missing_objects_are_404_with_their_type(server: IsbreServer, namespace: str) -> None:
    base = f"{server.url}/v1/isbre/namespaces"
    cases = [
        (http.get(f"{base}/nope"), "NoSuchNamespaceException"),
        (http.get(f"{base}/{namespace}/tables/nope"), "NoSuchTableException"),
        (http.get(f"{base}/nope/tables"), "NoSuchNamespaceException"),
        (http.delete(f"{base}/{namespace}/tables/nope"), "NoSuchTableException"),
        (http.get(f"{base}/{namespace}/views/nope"), "NoSuchViewException"),
        (create(server, "nope", "t"), "NoSuchNamespaceException"),
    ]
    for response, error_type in cases:
        assert response.status_code == 404, response.text
        assert response.json()["error"]["type"] == error_type
    assert http.head(f"{base}/{namespace}/tables/nope").status_code == 404


def settled(measure: Callable[[], float]) -> float:
    """`measure()` after the other workers' counts have been published again."""
    time.sleep(0.3)
    return measure()


def test_metrics_reports_are_accepted(server: IsbreServer, namespace: str) -> None:
    create(server, namespace, "measured").raise_for_status()
    report = {
        "report-type": "scan-report",
        "table-name": f"{namespace}.measured",
        "snapshot-id": 1,
        "filter": True,
        "schema-id": 0,
        "projected-field-ids": [1],
        "projected-field-names": ["id"],
        "metrics": {},
    }
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/measured/metrics"
    assert http.post(url, json=report).status_code == 204
    assert http.post(url, json=report).status_code == 204

    def counted() -> list[str]:
        return [line for line in http.get(f"{server.url}/metrics").text.splitlines() if "scan-report" in line]

    # With several workers, a scrape sums the others' counts as they published them a moment ago.
    wanted = ['isbre_metrics_reports_total{type="scan-report"} 2']
    eventually(lambda: counted() == wanted, "both reports counted", timeout=3)
    assert http.post(url, json={"report-type": "scan-report"}).status_code == 400


def test_metrics_exposes_writer_counters(server: IsbreServer, namespace: str) -> None:
    def sample(name: str) -> float:
        text = http.get(f"{server.url}/metrics").text
        (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
        return float(line.split()[1])

    # With several workers, a scrape may report another worker's earlier mutations late: start
    # from a count that has stopped moving.
    before = sample("isbre_commit_mutations_total")
    while (again := settled(lambda: sample("isbre_commit_mutations_total"))) != before:
        before = again
    seq_before = sample("isbre_commit_seq")
    create(server, namespace, "counted").raise_for_status()
    # At least this commit (the retention task may commit a trim of its own meanwhile).
    eventually(lambda: sample("isbre_commit_mutations_total") >= before + 1, "the commit counted", 3)
    assert sample("isbre_commit_seq") >= seq_before + 1
    assert sample("isbre_commit_batches_total") >= 1


@pytest.mark.parametrize("location", ["file:///nonexistent/00000-x.metadata.json", "/etc/hostname"])
def test_register_unreadable_metadata_is_400(server: IsbreServer, namespace: str, location: str) -> None:
    response = http.post(
        f"{server.url}/v1/isbre/namespaces/{namespace}/register",
        json={"name": "r", "metadata-location": location},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "BadRequestException"
    assert http.head(f"{server.url}/v1/isbre/namespaces/{namespace}/tables/r").status_code == 404


def test_unknown_route_and_method_use_the_error_model(server: IsbreServer) -> None:
    missing = http.get(f"{server.url}/v1/isbre/no/such/route")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "NotFoundException"
    wrong = http.put(f"{server.url}/v1/isbre/namespaces")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == 405


def test_a_body_that_pyiceberg_cannot_parse_is_400(server: IsbreServer, namespace: str) -> None:
    """Found by schemathesis: PyIceberg's validators can raise TypeError, which pydantic lets through."""
    field = {
        "id": 1,
        "name": "m",
        "required": False,
        "initial-default": True,
        "type": {
            "type": "map",
            "key-id": 2,
            "key": "string",
            "value-id": 3,
            "value": "long",
            "value-required": False,
        },
    }
    schema = {"type": "struct", "schema-id": 0, "fields": [field]}
    response = http.post(
        f"{server.url}/v1/isbre/namespaces/{namespace}/tables", json={"name": "bad_default", "schema": schema}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "BadRequestException"


def test_metrics_count_requests_latency_and_queue(server: IsbreServer, namespace: str) -> None:
    http.get(f"{server.url}/v1/isbre/namespaces/{namespace}/tables/absent")
    absent = (
        'isbre_http_requests_total{method="GET",route="/namespaces/{namespace}/tables/{table}",status="404"}'
    )

    def scraped() -> list[str] | None:
        # With two workers, a scrape adds up the other worker's counts as it last published them.
        lines = http.get(f"{server.url}/metrics").text.splitlines()
        return lines if any(line.startswith(absent) for line in lines) else None

    lines = eventually(scraped, "the 404 was not counted")
    assert any(
        line.startswith('isbre_http_requests_total{method="POST",route="/namespaces",status="200"}')
        for line in lines
    )
    (count,) = [
        float(line.split()[1]) for line in lines if line.startswith("isbre_commit_latency_seconds_count")
    ]
    (inf,) = [
        float(line.split()[1]) for line in lines if 'isbre_commit_latency_seconds_bucket{le="+Inf"}' in line
    ]
    assert count >= 1 and inf == count
    assert "isbre_writer_queue_depth 0" in lines


ROUNDS = 5


def test_metrics_histogram_of_group_commit_batch_sizes(server: IsbreServer, namespace: str) -> None:
    """`isbre_commit_batch_size`: one observation per write transaction, of the mutations it held;
    concurrent commits share transactions, so some batch holds more than one."""
    tables = [f"batched_{n}" for n in range(8)]
    for table in tables:
        body = {"name": table, "schema": {"type": "struct", "fields": []}}
        http.post(f"{server.url}/v1/isbre/namespaces/{namespace}/tables", json=body).raise_for_status()

    def commit(table: str) -> None:
        with httpx.Client() as client:
            for n in range(25):
                body = {"updates": [{"action": "set-properties", "updates": {"n": str(n)}}]}
                url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{table}"
                client.post(url, json=body).raise_for_status()

    def sample(lines: list[str], prefix: str) -> float:
        (value,) = [float(line.split()[-1]) for line in lines if line.startswith(prefix + " ")]
        return value

    # Whether two commits meet in one transaction depends on how the writers' requests interleave,
    # which the test does not own: on an idle machine a round of 200 may meet none. Rounds go on
    # until one has (each adds 200 more chances), at most ROUNDS.
    for _ in range(ROUNDS):
        for thread in start_threads(commit, tables):
            thread.join()
        lines = http.get(f"{server.url}/metrics").text.splitlines()
        assert "# TYPE isbre_commit_batch_size histogram" in lines
        assert sample(lines, "isbre_commit_batch_size_count") == sample(lines, "isbre_commit_batches_total")
        assert sample(lines, "isbre_commit_batch_size_sum") == sample(lines, "isbre_commit_mutations_total")
        buckets = {
            line.split('le="')[1].split('"')[0]: float(line.split()[-1])
            for line in lines
            if line.startswith("isbre_commit_batch_size_bucket")
        }
        assert buckets["+Inf"] == sample(lines, "isbre_commit_batch_size_count")
        if buckets["1"] < buckets["+Inf"]:
            return
    raise AssertionError(f"no transaction held two of 8 writers' commits in {ROUNDS} rounds of 200")


def test_a_client_given_the_v1_path_as_its_uri_is_told_the_right_one(server: IsbreServer) -> None:
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.exceptions import RESTError

    answer = http.get(f"{server.url}/v1/v1/config")
    assert answer.status_code == 404
    assert answer.json()["error"]["message"].endswith(
        f"the catalog's URI is {server.url}, without /v1 (clients add it)"
    )
    with pytest.raises(RESTError, match="without /v1"):
        RestCatalog("isbre", uri=f"{server.url}/v1")
