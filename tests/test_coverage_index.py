"""The catalog's coverage index: spans from snapshot summaries, merged in the commit's transaction."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from isbre.catalog.coverage import SPANS_PROPERTY, Coverage, gaps, merge
from isbre.sinks.catalogs import CoverageSource
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import BadRequestError

from tests.http_client import http
from tests.server import IsbreServer
from tests.test_events import sse_records

DATA = pa.table({"n": pa.array([1, 2, 3], pa.int64())})


def _spans(*entries: tuple[int, int, int]) -> dict[str, str]:
    return {
        SPANS_PROPERTY: json.dumps(
            [{"source-id": "s", "topic": "t", "partition": p, "start": a, "end": b} for p, a, b in entries]
        )
    }


def _coverage(server: IsbreServer, namespace: str, table: str, **params: object) -> dict:
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{table}/coverage"
    response = http.get(url, params=params)
    response.raise_for_status()
    return response.json()


def test_merge_and_gaps() -> None:
    assert merge([(5, 7), (0, 2), (2, 3), (6, 9), (4, 4)]) == [(0, 3), (5, 9)]
    assert gaps([(0, 3), (5, 9), (10, 11)]) == [(3, 5), (9, 10)]


def test_spans_in_commits_are_indexed_union_merged_with_gaps(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    table = rest_catalog.create_table(f"{namespace}.t", DATA.schema)
    table.append(DATA, snapshot_properties=_spans((0, 0, 10), (1, 0, 5)))
    table.append(DATA, snapshot_properties=_spans((0, 20, 30)))
    table.append(DATA, snapshot_properties=_spans((0, 10, 12), (0, 25, 40)))
    body = _coverage(server, namespace, "t")
    assert body["table-uuid"] == str(table.refresh().metadata.table_uuid)
    assert body["coverage"] == [
        {"source-id": "s", "topic": "t", "partition": 0, "ranges": [[0, 12], [20, 40]], "gaps": [[12, 20]]},
        {"source-id": "s", "topic": "t", "partition": 1, "ranges": [[0, 5]], "gaps": []},
    ]
    assert [e["partition"] for e in _coverage(server, namespace, "t", partition=1)["coverage"]] == [1]
    # The index agrees with what the snapshot summaries say, which is how a foreign catalog is read.
    derived = CoverageSource(rest_catalog, f"{namespace}.t").coverage(table)
    assert derived.to_json() == body["coverage"]
    # Which commit made a snapshot: the commit_seq the event stream shows for it.
    snapshot_id = table.metadata.current_snapshot_id
    found = _coverage(server, namespace, "t", **{"snapshot-id": snapshot_id})
    records = sse_records(server, until=server.high_water(), after=0, table=f"{namespace}.t")
    by_snapshot = {r["snapshot_id"]: r["commit_seq"] for r in records if "snapshot_id" in r}
    assert found["commit-seq"] == by_snapshot[snapshot_id]
    assert _coverage(server, namespace, "t", **{"snapshot-id": 1})["commit-seq"] is None


@pytest.mark.parametrize(
    "declared",
    [
        "not json",
        json.dumps({"source-id": "s"}),
        json.dumps([{"source-id": "s", "topic": "t", "partition": 0, "start": 5, "end": 1}]),
        json.dumps([{"source-id": "s", "topic": "t", "partition": -1, "start": 0, "end": 1}]),
        json.dumps([{"source-id": "s\u0000", "topic": "t", "partition": 0, "start": 0, "end": 1}]),
        json.dumps([{"topic": "t", "partition": 0, "start": 0, "end": 1}]),
    ],
)
def test_malformed_spans_are_refused_and_change_nothing(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str, declared: str
) -> None:
    table = rest_catalog.create_table(f"{namespace}.t", DATA.schema)
    before = server.high_water()
    with pytest.raises(BadRequestError, match=SPANS_PROPERTY.replace(".", r"\.") + "|span"):
        table.append(DATA, snapshot_properties={SPANS_PROPERTY: declared})
    assert server.high_water() == before
    assert table.refresh().current_snapshot() is None
    assert _coverage(server, namespace, "t")["coverage"] == []


def test_drop_forgets_coverage_and_register_rebuilds_it(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    table = rest_catalog.create_table(f"{namespace}.t", DATA.schema)
    table.append(DATA, snapshot_properties=_spans((0, 0, 3)))
    table.append(DATA, snapshot_properties=_spans((0, 3, 6)))
    location = table.refresh().metadata_location
    rest_catalog.drop_table(f"{namespace}.t")
    rest_catalog.register_table(f"{namespace}.again", location)
    assert Coverage.from_json(_coverage(server, namespace, "again")["coverage"]).to_json() == [
        {"source-id": "s", "topic": "t", "partition": 0, "ranges": [[0, 6]], "gaps": []}
    ]
    response = http.get(f"{server.url}/v1/isbre/namespaces/{namespace}/tables/t/coverage")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "NoSuchTableException"
