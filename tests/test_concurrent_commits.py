"""Several writers on one table: conflicts the catalog does not resolve itself are 409s that a retry
resolves; no commit is lost."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitFailedException

from tests.http_client import http
from tests.server import ID_SCHEMA, IsbreServer, on_threads

SCHEMA = pa.schema([pa.field("writer", pa.int64()), pa.field("seq", pa.int64())])


def rows(writer: int, seq: int) -> pa.Table:
    return pa.table({"writer": pa.array([writer] * 10, pa.int64()), "seq": pa.array([seq] * 10, pa.int64())})


def test_second_appender_conflicts_then_retries(server: IsbreServer, namespace: str) -> None:
    alice = RestCatalog("alice", uri=server.url)
    bob = RestCatalog("bob", uri=server.url)
    # No client-side retries and no rebase on the server, so the server's 409 reaches the caller.
    alice.create_table(
        f"{namespace}.shared",
        schema=SCHEMA,
        properties={"commit.retry.num-retries": "0", "isbre.commit.rebase-appends": "false"},
    )
    alice_view = alice.load_table(f"{namespace}.shared")
    bob_view = bob.load_table(f"{namespace}.shared")

    alice_view.append(rows(1, 0))
    with pytest.raises(CommitFailedException):
        bob_view.append(rows(2, 0))
    bob_view.refresh()
    bob_view.append(rows(2, 0))

    final = alice.load_table(f"{namespace}.shared")
    assert final.scan().to_arrow().num_rows == 20
    assert len(final.snapshots()) == 2


def test_pyiceberg_retries_a_conflict_on_its_own(server: IsbreServer, namespace: str) -> None:
    alice = RestCatalog("alice", uri=server.url)
    bob = RestCatalog("bob", uri=server.url)
    alice.create_table(f"{namespace}.auto", schema=SCHEMA)
    alice_view = alice.load_table(f"{namespace}.auto")
    bob_view = bob.load_table(f"{namespace}.auto")
    alice_view.append(rows(1, 0))
    bob_view.append(rows(2, 0))  # 409 from the server, then PyIceberg refreshes and re-commits
    final = alice.load_table(f"{namespace}.auto")
    assert sorted(set(final.scan().to_arrow()["writer"].to_pylist())) == [1, 2]
    assert len(final.snapshots()) == 2


def append_with_retries(
    catalog: RestCatalog, name: str, writer: int, commits: int, conflicts: list[int]
) -> None:
    table = catalog.load_table(name)
    for seq in range(commits):
        while True:
            try:
                table.append(rows(writer, seq))
                break
            except CommitFailedException:
                conflicts[writer] += 1
                table.refresh()


def test_concurrent_appenders_lose_nothing(server: IsbreServer, namespace: str) -> None:
    name = f"{namespace}.busy"
    RestCatalog("setup", uri=server.url).create_table(name, schema=SCHEMA)
    writers, commits = 4, 5
    conflicts = [0] * writers
    threads = [
        threading.Thread(
            target=append_with_retries,
            args=(RestCatalog(f"w{w}", uri=server.url), name, w, commits, conflicts),
        )
        for w in range(writers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    table = RestCatalog("check", uri=server.url).load_table(name)
    data = table.scan().to_arrow()
    assert data.num_rows == writers * commits * 10
    landed = {(w, s) for w, s in zip(data["writer"].to_pylist(), data["seq"].to_pylist(), strict=True)}
    assert landed == {(w, s) for w in range(writers) for s in range(commits)}
    assert len(table.snapshots()) == writers * commits


def test_concurrent_property_commits_rebase_on_the_server(server: IsbreServer, namespace: str) -> None:
    """Commits without snapshot requirements never conflict: the server re-applies them on the new state."""
    name = f"{namespace}.props"
    RestCatalog("setup", uri=server.url).create_table(name, schema=SCHEMA)

    def set_many(writer: int) -> None:
        table = RestCatalog(f"p{writer}", uri=server.url).load_table(name)
        for i in range(10):
            with table.transaction() as tx:
                tx.set_properties(**{f"w{writer}-{i}": "x"})

    threads = [threading.Thread(target=set_many, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    properties = RestCatalog("check", uri=server.url).load_table(name).properties
    assert {f"w{w}-{i}" for w in range(8) for i in range(10)} <= set(properties)


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
