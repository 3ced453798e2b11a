"""Relays of the commit log to a real nats-server (JetStream) and a real webhook receiver: every
commit once and in order across kill -9 and a broker restart, signed webhooks, scoped relays."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from isbre.catalog.commit_log import CommitLog
from isbre.rest.auth import sha256_hex
from isbre.rest.settings import load_settings
from standardwebhooks import Webhook, WebhookVerificationError

from tests.http_client import http
from tests.relay_targets import NatsBroker, WebhookReceiver
from tests.server import ID_SCHEMA, IsbreServer, secured_server

KEY = b"relay-test-signing-key-0123456789"
SECRET = "whsec_" + base64.b64encode(KEY).decode()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[NatsBroker]:
    broker = NatsBroker(tmp_path).start()
    yield broker
    broker.stop()


def _wait(condition: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"{what}: still not after {timeout} s"
        time.sleep(0.05)
    return found


def _relays(server: IsbreServer, headers: dict[str, str] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = http.get(f"{server.url}/health", headers=headers).json()["components"]["relays"]
    return found


def _caught_up(server: IsbreServer, headers: dict[str, str] | None = None) -> bool:
    relays = _relays(server, headers)["relays"]
    return all(relay["lag"] == 0 for relay in relays.values())


def _logged(server: IsbreServer) -> list[int]:
    """Every commit_seq the server's log holds, read from its store."""
    log = CommitLog.follow(server.store_location)
    try:
        return [record.commit_seq for record in log.records(0)]
    finally:
        log.close()


def _commit_until(server: IsbreServer, stop: threading.Event, tables: list[str]) -> None:
    """Commit to the tables in turn until told to stop; a commit refused or cut off is fine (the
    log says what happened)."""
    n = 0
    while not stop.is_set():
        table = tables[n % len(tables)]
        body = {"requirements": [], "updates": [{"action": "set-properties", "updates": {"n": str(n)}}]}
        try:
            http.post(f"{server.url}/v1/namespaces/lake/tables/{table}", json=body, timeout=30)
        except Exception:
            time.sleep(0.05)
        n += 1


def _verify(headers: dict[str, str], body: bytes) -> None:
    """A delivery's signature, by the Standard Webhooks library and by the specification's formula."""
    lowered = {key.lower(): value for key, value in headers.items()}
    Webhook(SECRET).verify(body, lowered)
    signed = f"{lowered['webhook-id']}.{lowered['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(KEY, signed, hashlib.sha256).digest()).decode()
    assert f"v1,{expected}" in lowered["webhook-signature"].split(" ")
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body + b" ", lowered)


def test_every_commit_reaches_jetstream_and_a_webhook_once_in_order_across_kill_9(
    tmp_path: Path, broker: NatsBroker
) -> None:
    receiver = WebhookReceiver(failures=10**9).start()
    relays = [
        {"kind": "nats", "name": "bus", "url": broker.url},
        {"kind": "webhook", "name": "hook", "url": receiver.url, "secret": SECRET, "max_retry_seconds": 0.5},
    ]
    env = {"ISBRE_RELAYS": json.dumps(relays)}
    warehouse = tmp_path / "wh"
    server = IsbreServer(warehouse, env=env).start()
    http.post(f"{server.url}/v1/namespaces", json={"namespace": ["lake"]})
    tables = ["t1", "t2"]
    for table in tables:
        http.post(f"{server.url}/v1/namespaces/lake/tables", json={"name": table, "schema": ID_SCHEMA})
    # A receiver that refuses: the relay waits, retries, and says so; nothing moves past it.
    hook = _wait(lambda: (r := _relays(server))["relays"]["hook"]["failing"] and r, "the webhook failing")
    assert hook["status"] == "degraded" and hook["relays"]["hook"]["status"] == "degraded"
    assert hook["relays"]["hook"]["position"] == 0 and hook["relays"]["bus"]["status"] == "ok"
    receiver.failures = receiver.refused + 3  # three more refusals, then it takes them
    random_moments = random.Random(os.getpid())
    for round_ in range(4):
        stop = threading.Event()
        writer = threading.Thread(target=_commit_until, args=(server, stop, tables))
        writer.start()
        time.sleep(random_moments.uniform(0.3, 1.5))
        if round_ == 1:  # the broker goes away while commits go on, and comes back
            broker.stop()
            time.sleep(random_moments.uniform(0.5, 1.5))
            broker.start()
            time.sleep(random_moments.uniform(0.2, 1.0))
        # Both at once: the relay process dies between a publish and the note of its position.
        relay_process = _relays(server)["process"]
        if relay_process is not None:
            os.kill(relay_process, signal.SIGKILL)
        server.kill()
        stop.set()
        writer.join()
        server = IsbreServer(warehouse, env=env).start()
    http.post(f"{server.url}/v1/namespaces/lake/tables/t1", json={"requirements": [], "updates": []})
    _wait(lambda: _caught_up(server), "every relay caught up")
    expected = _logged(server)
    assert len(expected) > 20

    messages = broker.messages()
    assert [event["commitseq"] for _, _, event in messages] == expected  # once each, in order
    for subject, headers, event in messages:
        assert headers["Nats-Msg-Id"] == event["id"]
        assert event["specversion"] == "1.0" and event["type"] == f"isbre.{event['data']['kind']}"
        assert event["data"]["commit_seq"] == event["commitseq"]
        names = [*event["data"]["namespace"], *([event["data"]["name"]] if "name" in event["data"] else [])]
        assert subject == "isbre.commits." + ".".join(names)
    ids = {event["id"] for _, _, event in messages}
    assert len(ids) == len(messages) and len({event["source"] for _, _, event in messages}) == 1

    delivered = receiver.events()
    first = list(dict.fromkeys(event["commitseq"] for event in delivered))
    assert first == expected  # every commit, in order; a resent one comes again with its own id
    assert {event["id"] for event in delivered} == ids
    for headers, body in receiver.deliveries:
        _verify(headers, body)
        lowered = {key.lower(): value for key, value in headers.items()}
        assert lowered["webhook-id"] == json.loads(body)["id"]
        assert lowered["content-type"] == "application/cloudevents+json"
    metrics = http.get(f"{server.url}/metrics").text
    assert f'isbre_relay_position{{relay="bus"}} {expected[-1]}' in metrics
    assert 'isbre_relay_lag{relay="hook"} 0' in metrics
    server.stop()
    receiver.stop()


def test_a_message_the_stream_refuses_holds_back_every_later_one_until_it_lands(
    tmp_path: Path, broker: NatsBroker
) -> None:
    """The relay has several messages in flight at once; when JetStream refuses one (here: larger than
    the stream takes), none after it lands before it does, and it is tried until it lands."""
    broker.limit_messages(4096)
    relays = [{"kind": "nats", "name": "bus", "url": broker.url, "max_retry_seconds": 0.5}]
    server = IsbreServer(tmp_path / "wh", env={"ISBRE_RELAYS": json.dumps(relays)}).start()
    try:
        http.post(f"{server.url}/v1/namespaces", json={"namespace": ["lake"]})

        def commit(value: str) -> int:
            # A namespace's change carries the properties set (a table commit's record does not).
            body = {"updates": {"v": value}}
            http.post(f"{server.url}/v1/namespaces/lake/properties", json=body).raise_for_status()
            seq: int = http.get(f"{server.url}/v1/events/cursor").json()["commit_seq"]
            return seq

        commit("small")
        _wait(lambda: _caught_up(server), "the first commits relayed")
        refused = commit("x" * 8192)
        for n in range(20):
            commit(str(n))
        _wait(lambda: _relays(server)["relays"]["bus"]["failing"], "the refused message failing")
        held = [event["commitseq"] for _, _, event in broker.messages()]
        assert held == [seq for seq in _logged(server) if seq < refused]
        broker.limit_messages(-1)
        _wait(lambda: _caught_up(server), "every commit relayed once the stream takes it")
        assert [event["commitseq"] for _, _, event in broker.messages()] == _logged(server)
    finally:
        server.stop()


PRINCIPALS = [
    {"name": "admin", "token_sha256": sha256_hex("admin-token"), "roles": ["admin"]},
    {
        "name": "sales-reader",
        "token_sha256": sha256_hex("sales-token"),
        "roles": ["reader"],
        "namespaces": ["sales"],
    },
]
ADMIN = {"Authorization": "Bearer admin-token"}


def test_a_relay_publishes_only_what_its_scope_and_filters_let_through(
    tmp_path: Path, broker: NatsBroker
) -> None:
    relays = [
        {
            "kind": "nats",
            "url": broker.url,
            "subject": "scoped",
            "stream": "SCOPED",
            "principal": "sales-reader",
        },
        {
            "kind": "nats",
            "url": broker.url,
            "subject": "hr",
            "stream": "HR",
            "namespaces": ["hr"],
            "kinds": ["table.create", "table.drop"],
        },
    ]
    # Two workers: the supervisor relays, and a worker's /health and /metrics report it.
    server = secured_server(tmp_path / "wh", PRINCIPALS, workers=2, ISBRE_RELAYS=json.dumps(relays))
    base = f"{server.url}/v1"
    for namespace in (["sales"], ["sales", "eu"], ["hr"], ["salesforce"]):
        assert http.post(f"{base}/namespaces", json={"namespace": namespace}, headers=ADMIN).is_success
    for path, table in [("sales", "a"), ("sales%1Feu", "b.c"), ("hr", "people"), ("salesforce", "x")]:
        created = http.post(
            f"{base}/namespaces/{path}/tables", json={"name": table, "schema": ID_SCHEMA}, headers=ADMIN
        )
        assert created.is_success, created.text
    # Out of hr into sales: the record names hr too, so the sales relay must not publish it.
    rename = {
        "source": {"namespace": ["hr"], "name": "people"},
        "destination": {"namespace": ["sales"], "name": "p"},
    }
    assert http.post(f"{base}/tables/rename", json=rename, headers=ADMIN).is_success
    assert http.delete(f"{base}/namespaces/sales/tables/p", headers=ADMIN).is_success
    _wait(lambda: _caught_up(server, ADMIN), "both relays caught up")

    log = CommitLog.follow(server.store_location)
    records = list(log.records(0))
    log.close()

    def under(record: Any, top: str) -> bool:
        names = [record.namespace, *([record.previous["namespace"]] if record.previous else [])]
        return all(namespace[0] == top for namespace in names)

    scoped = [event for _, _, event in broker.messages("SCOPED")]
    assert [e["commitseq"] for e in scoped] == [r.commit_seq for r in records if under(r, "sales")]
    assert {e["type"] for e in scoped} >= {"isbre.namespace.create", "isbre.table.create", "isbre.table.drop"}
    subjects = {subject for subject, _, _ in broker.messages("SCOPED")}
    assert {"scoped.sales", "scoped.sales.eu", "scoped.sales.a", "scoped.sales.eu.b%2Ec"} <= subjects
    hr = [event for _, _, event in broker.messages("HR")]
    wanted = [r.commit_seq for r in records if under(r, "hr") and r.kind in ("table.create", "table.drop")]
    assert [e["commitseq"] for e in hr] == wanted and len(wanted) == 1

    health = _relays(server, ADMIN)
    assert health["status"] == "ok" and health["relaying"] and health["process"] is not None
    assert [relay["position"] for relay in health["relays"].values()] == [records[-1].commit_seq] * 2
    # Anyone may see that relays are well; only an admin sees where they send.
    public = http.get(f"{server.url}/health").json()["components"]["relays"]
    assert public == {"status": "ok"}
    metrics = http.get(f"{server.url}/metrics").text
    assert metrics.count("isbre_relay_lag{relay=") == 2
    server.stop()


def test_relays_come_from_the_toml_file_and_bad_ones_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "isbre.toml"
    config.write_text(
        f"""
[[relays]]
kind = "nats"
url = "nats://127.0.0.1:4222"
subject = "isbre.commits"
stream = "ISBRE"

[[relays]]
kind = "webhook"
url = "https://example.org/hook"
secret = "{SECRET}"
kinds = ["table.commit"]
"""
    )
    settings = load_settings(config)
    assert [relay.kind for relay in settings.relays] == ["nats", "webhook"]
    assert settings.relays[0].key() != settings.relays[1].key()
    for bad, message in [
        ('kind = "webhook"\nurl = "https://example.org/h"\nsecret = "plain"', "whsec_"),
        ('kind = "nats"\nsubject = "a.*"', "not a NATS subject"),
        ('kind = "nats"\nkinds = ["table.create", "table.upsert"]', "table.upsert"),
        ('kind = "nats"\nprincipal = "nobody"', "no principal 'nobody'"),
        ('kind = "kafka"', "kind"),
    ]:
        config.write_text(f"[[relays]]\n{bad}\n")
        with pytest.raises(ValueError, match=message):
            load_settings(config)
