"""Racing creates of one table over the raw protocol: one wins, the others are 409s and leave no
files behind. Writers racing on one table through PyIceberg: tests/test_catalog_behaviours.py."""

from __future__ import annotations

from tests.http_client import http
from tests.server import ID_SCHEMA, IsbreServer, on_threads


def test_racing_creates_of_one_table_give_one_table_and_409s(server: IsbreServer, namespace: str) -> None:
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables"
    answers: list[int] = []

    def create() -> None:
        answers.append(http.post(url, json={"name": "t", "schema": ID_SCHEMA}, timeout=30).status_code)

    on_threads(lambda _: create(), range(8))
    assert sorted(answers) == [200] + [409] * 7
    winner = http.get(f"{url}/t").json()["metadata-location"]
    # The losers removed the metadata files they wrote.
    assert [p.as_uri() for p in server.warehouse.joinpath(namespace).rglob("*.metadata.json")] == [winner]
