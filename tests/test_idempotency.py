"""Idempotency-Key: a retried mutation commits once and gets the same answer."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from unittest.mock import ANY

import httpx
import pytest
from isbre.catalog import CatalogService
from isbre.catalog.commit_log import TRIM_CHUNK
from isbre.catalog.lmdb_store import LmdbStore
from isbre.catalog.pointer_swap import Stale
from isbre.catalog.records import now_us
from isbre.catalog.request_context import Idempotency, KeyAnsweredError, RequestContext
from isbre.catalog.stores import open_store
from isbre.catalog.warehouses import open_catalog
from isbre.catalog.writer import Batch
from isbre.rest.runtime import KeyLocks

from tests.http_client import http
from tests.server import COMMIT_TIMEOUT, IsbreServer
from tests.server import ID_SCHEMA as SCHEMA

# Run against a server on each store.
SERVER_STORES = ("lmdb", "postgresql")
# A test reads the server's store while it runs: LMDB allows one environment per process.
SERVER_PROCESS = True


def key() -> str:
    return str(uuid.uuid4())


def test_config_advertises_the_lifetime(server: IsbreServer) -> None:
    assert http.get(f"{server.url}/v1/config").json()["idempotency-key-lifetime"] == "PT30M"


def test_a_retried_commit_commits_once_and_answers_the_same(server: IsbreServer, namespace: str) -> None:
    base = f"{server.url}/v1/isbre/namespaces/{namespace}/tables"
    http.post(base, json={"name": "t", "schema": SCHEMA}).raise_for_status()
    commit = {
        "updates": [
            {
                "action": "add-schema",
                "schema": SCHEMA
                | {
                    "schema-id": 1,
                    "fields": SCHEMA["fields"]
                    + [{"id": 2, "name": "extra", "type": "string", "required": False}],
                },
            },
            {"action": "set-current-schema", "schema-id": -1},
        ]
    }
    headers = {"Idempotency-Key": key()}
    before = server.high_water()
    first = http.post(f"{base}/t", json=commit, headers=headers)
    assert first.status_code == 200, first.text
    # The client never saw that answer (say the connection dropped) and sends the same request again.
    again = http.post(f"{base}/t", json=commit, headers=headers)
    assert again.status_code == 200
    assert again.content == first.content
    assert server.high_water() == before + 1, "the retry committed a second time"
    # Without the key, a request is a request: one that changes the table again commits again
    # (re-adding the very same schema would not: the reference builder reuses its id, a no-op).
    other = json.loads(json.dumps(commit))
    other["updates"][0]["schema"]["fields"][-1]["name"] = "another"
    assert http.post(f"{base}/t", json=other).status_code == 200
    assert server.high_water() == before + 2


def test_a_key_reused_for_another_request_is_422(server: IsbreServer, namespace: str) -> None:
    headers = {"Idempotency-Key": key()}
    url = f"{server.url}/v1/isbre/namespaces"
    assert http.post(url, json={"namespace": [namespace, "a"]}, headers=headers).status_code == 200
    other = http.post(url, json={"namespace": [namespace, "b"]}, headers=headers)
    assert other.status_code == 422
    assert other.json()["error"]["type"] == "UnprocessableEntityException"
    assert http.head(f"{url}/{namespace}%1Fb").status_code == 404


def test_only_requests_that_changed_something_keep_their_key(server: IsbreServer, namespace: str) -> None:
    url = f"{server.url}/v1/isbre/namespaces"
    created, refused = {"Idempotency-Key": key()}, {"Idempotency-Key": key()}
    body = {"namespace": [namespace, "once"]}
    assert http.post(url, json=body, headers=created, timeout=COMMIT_TIMEOUT).status_code == 200
    assert http.post(url, json=body, headers=refused, timeout=COMMIT_TIMEOUT).status_code == 409
    http.delete(f"{url}/{namespace}%1Fonce", timeout=COMMIT_TIMEOUT).raise_for_status()
    # The refusal changed nothing and was not kept: its key runs the request now that it can succeed.
    assert http.post(url, json=body, headers=refused).status_code == 200
    http.delete(f"{url}/{namespace}%1Fonce").raise_for_status()
    # The key of the request that created the namespace replays its answer and creates nothing.
    assert http.post(url, json=body, headers=created).status_code == 200
    assert http.head(f"{url}/{namespace}%1Fonce").status_code == 404, "a replay must not create again"


def test_the_fingerprint_covers_the_query(server: IsbreServer, namespace: str) -> None:
    tables = f"{server.url}/v1/isbre/namespaces/{namespace}/tables"
    http.post(tables, json={"name": "q", "schema": SCHEMA}).raise_for_status()
    headers = {"Idempotency-Key": key()}
    assert http.delete(f"{tables}/q", headers=headers).status_code == 204
    purge = http.delete(f"{tables}/q", params={"purgeRequested": "true"}, headers=headers)
    assert purge.status_code == 422, purge.text


def test_a_stored_outcome_is_compact(server: IsbreServer, namespace: str) -> None:
    tables = f"{server.url}/v1/isbre/namespaces/{namespace}/tables"
    properties = {f"p{i}": "v" * 500 for i in range(40)}  # a 20 KB answer
    headers = {"Idempotency-Key": key()}
    answer = http.post(
        tables, json={"name": "big", "schema": SCHEMA, "properties": properties}, headers=headers
    )
    assert answer.status_code == 200 and len(answer.content) > 20_000
    replay = http.post(
        tables, json={"name": "big", "schema": SCHEMA, "properties": properties}, headers=headers
    )
    assert replay.content == answer.content
    store = open_store(server.store_location)
    try:
        with store.read() as view:
            stored = view.idempotent_response(headers["Idempotency-Key"])
    finally:
        store.close()
    assert stored is not None and len(json.dumps(stored)) < 1024, stored


def test_concurrent_requests_with_one_key_commit_once(server: IsbreServer, namespace: str) -> None:
    base = f"{server.url}/v1/isbre/namespaces/{namespace}/tables"
    http.post(base, json={"name": "c", "schema": SCHEMA}).raise_for_status()
    headers = {"Idempotency-Key": key()}
    commit = {"updates": [{"action": "set-properties", "updates": {"once": "1"}}]}
    before = server.high_water()
    answers: list[httpx.Response] = []

    def send() -> None:
        answers.append(http.post(f"{base}/c", json=commit, headers=headers, timeout=30))

    threads = [threading.Thread(target=send) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {a.status_code for a in answers} == {200}
    assert len({a.content for a in answers}) == 1
    assert server.high_water() == before + 1


def test_an_invalid_key_is_400(server: IsbreServer) -> None:
    response = http.post(
        f"{server.url}/v1/isbre/namespaces", json={"namespace": ["x"]}, headers={"Idempotency-Key": "nope"}
    )
    assert response.status_code == 400
    assert http.head(f"{server.url}/v1/isbre/namespaces/x").status_code == 404


def test_requests_with_other_keys_never_wait_on_each_other() -> None:
    """A key held (its request running) holds no other key; a key no request holds is forgotten."""
    locks = KeyLocks()
    inside = threading.Event()

    def other_key() -> None:
        with locks.holding("b"):
            inside.set()

    with locks.holding("a"):
        other = threading.Thread(target=other_key)
        other.start()
        assert inside.wait(10), "a request with another key waited for this one"
        other.join(10)
        assert len(locks) == 1
    assert len(locks) == 0


def test_expired_keys_are_trimmed(tmp_path: Path) -> None:
    service = open_catalog(tmp_path / "wh")
    try:
        with service.core.store.write() as view:
            for i in range(5):
                view.put_idempotent_response(f"k{i}", {"fingerprint": "f", "status": 204, "ts": i})
            view.put_idempotent_response("fresh", {"fingerprint": "f", "status": 204, "ts": now_us()})
        assert service.core.commit_log.trim_idempotency(keep_us=10**9) == 5
        assert service.core.idempotent_response("k0") is None
        assert service.core.idempotent_response("fresh") is not None
    finally:
        service.close()


def test_trimming_100000_keys_takes_bounded_steps(tmp_path: Path) -> None:
    """Each step of a trim removes at most TRIM_CHUNK keys, reading only expired ones, so that it
    holds the writer briefly (how briefly is measured by `make bench`); the steps remove them all."""
    store = LmdbStore(tmp_path / "s", map_size=1 << 30)
    with store.write() as view:
        for i in range(100_000):
            view.put_idempotent_response(str(uuid.UUID(int=i)), {"fingerprint": "f", "status": 204, "ts": i})
        view.put_idempotent_response("fresh", {"fingerprint": "f", "status": 204, "ts": now_us()})
    steps = []
    while not steps or steps[-1] == TRIM_CHUNK:
        with store.write() as view:
            steps.append(view.trim_idempotency(now_us() - 10**9, TRIM_CHUNK))
    assert sum(steps) == 100_000 and max(steps) <= TRIM_CHUNK
    with store.read() as view:
        assert view.idempotent_response("fresh") is not None
    store.close()


def test_the_key_is_kept_by_the_attempt_that_commits(service: CatalogService) -> None:
    """A commit staged again after another process moved the table keeps its Idempotency-Key's
    answer when the attempt that commits does (else a second worker could commit it twice); a
    change for the same key after that is refused, and one without the key keeps nothing."""
    attempts: list[int] = []
    keyed = RequestContext("alice", idempotency=Idempotency("k", "f"))

    def mutation(batch: Batch) -> int:
        attempts.append(len(attempts))
        if len(attempts) == 1:
            raise Stale  # lost the pointer swap: rolled back, staged again
        return attempts[-1]

    with pytest.raises(Stale):
        service.core.mutate(mutation, context=keyed, answer=lambda result: result)
    assert service.core.idempotent_response("k") is None  # the rolled-back attempt kept nothing
    assert service.core.mutate(mutation, context=keyed, answer=lambda result: result) == 1
    assert service.core.idempotent_response("k") == {"fingerprint": "f", "outcome": 1, "ts": ANY}
    with pytest.raises(KeyAnsweredError):
        service.core.mutate(lambda batch: 2, context=keyed, answer=lambda result: result)
    assert service.core.idempotent_response("k")["outcome"] == 1
    service.core.mutate(lambda batch: None, context=keyed.unkeyed())
