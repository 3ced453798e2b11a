"""Several `isbre serve` processes over one PostgreSQL store: replicas that share one catalog, one
commit_seq and one event stream. Each replica has its own state directory and port, as it would
have its own host; they share the warehouse directory, as hosts would share object storage."""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import psycopg
import pyarrow as pa
import pytest
from isbre.catalog.lmdb_store import LmdbStore
from isbre.catalog.postgres.store import PostgresStore
from isbre.catalog.warehouses import open_catalog
from isbre.events.client import subscribe
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitFailedException

from tests import zygote
from tests.http_client import http
from tests.lineage_receiver import Receiver
from tests.postgres import PostgresServer, new_database
from tests.relay_targets import NatsBroker
from tests.server import ID_SCHEMA, IsbreServer, on_threads, sse_records, start_threads
from tests.sink_helpers import compacted, rows, span, write_once
from tests.waiting import eventually

_names = itertools.count()
IDS = pa.schema([pa.field("id", pa.int64())])


def ids(values: Iterable[int]) -> pa.Table:
    return pa.table({"id": pa.array(list(values), pa.int64())})


def replica(warehouse: Path, store: str, **env: str) -> IsbreServer:
    return IsbreServer(warehouse, store=store, env=env).start()


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[list[IsbreServer]]:
    """Two replicas of one catalog."""
    store = new_database(request)
    warehouse = tmp_path_factory.mktemp("replicas") / "warehouse"
    running = [replica(warehouse, store), replica(warehouse, store)]
    yield running
    for each in running:
        each.stop()


def create_namespace(server: IsbreServer, client: httpx.Client | None = None) -> tuple[str, int]:
    name = f"ns{next(_names)}"
    answer = (client or httpx).post(
        f"{server.url}/v1/isbre/namespaces", json={"namespace": [name]}, timeout=30
    )
    return name, answer.status_code


def namespaces_of(server: IsbreServer) -> set[str]:
    found: set[str] = set()
    body: dict[str, str] = {}
    while True:
        page = http.get(f"{server.url}/v1/isbre/namespaces", params=body, timeout=30).json()
        found |= {ns[0] for ns in page["namespaces"]}
        if not page.get("next-page-token"):
            return found
        body = {"pageToken": page["next-page-token"]}


def test_pyiceberg_writes_through_one_replica_and_reads_through_the_other(pair: list[IsbreServer]) -> None:
    a, b = (RestCatalog("isbre", uri=s.url) for s in pair)
    namespace = f"rw{next(_names)}"
    a.create_namespace(namespace)
    table = a.create_table(f"{namespace}.t", IDS)
    table.append(ids(range(100)))
    read = b.load_table(f"{namespace}.t")
    assert read.metadata_location == a.load_table(f"{namespace}.t").metadata_location
    assert sorted(read.scan().to_arrow()["id"].to_pylist()) == list(range(100))
    assert (namespace,) in b.list_namespaces()


def test_concurrent_commits_to_one_table_through_both_replicas(
    pair: list[IsbreServer], caplog: pytest.LogCaptureFixture
) -> None:
    catalogs = [RestCatalog("isbre", uri=s.url) for s in pair]
    namespace = f"cc{next(_names)}"
    catalogs[0].create_namespace(namespace)
    ident = f"{namespace}.t"
    # Rebasing off: the writers below are to meet each other's 409s.
    catalogs[0].create_table(ident, IDS, properties={"isbre.commit.rebase-appends": "false"})

    # A commit through B based on what A has since replaced: 409, as on one server.
    stale = [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": None}]
    catalogs[0].load_table(ident).append(ids([-1]))
    answer = http.post(
        f"{pair[1].url}/v1/isbre/namespaces/{namespace}/tables/t",
        json={"requirements": stale, "updates": [{"action": "set-properties", "updates": {"k": "v"}}]},
    )
    assert answer.status_code == 409 and answer.json()["error"]["type"] == "CommitFailedException"

    # Six writers at once, three per replica, retrying their 409s (PyIceberg does, then this loop):
    # nothing is lost.
    def write(writer: int) -> None:
        catalog = catalogs[writer % 2]
        for n in range(4):
            while True:
                try:
                    catalog.load_table(ident).append(ids([writer * 100 + n]))
                    break
                except CommitFailedException:
                    pass

    with caplog.at_level(logging.WARNING, logger="pyiceberg.table"):
        on_threads(write, range(6))
    found = sorted(catalogs[1].load_table(ident).scan().to_arrow()["id"].to_pylist())
    assert found == sorted([-1, *(w * 100 + n for w in range(6) for n in range(4))])
    retried = [r for r in caplog.records if "concurrent update" in r.getMessage()]
    assert retried, "six writers on one table never conflicted: the test did not test retries"


def test_stale_appends_through_both_replicas_are_rebased(pair: list[IsbreServer]) -> None:
    """Six writers at once, three per replica, PyIceberg's retries off: each append is one request,
    and every one lands, made again on the head by whichever replica finds it stale (and again
    when the other replica's commit takes the swap from it)."""
    catalogs = [RestCatalog("isbre", uri=s.url) for s in pair]
    namespace = f"rb{next(_names)}"
    catalogs[0].create_namespace(namespace)
    ident = f"{namespace}.t"
    catalogs[0].create_table(ident, IDS, properties={"commit.retry.num-retries": "0"})
    tables = [catalogs[writer % 2].load_table(ident) for writer in range(6)]

    def write(writer: int) -> None:
        for n in range(4):
            tables[writer].append(ids([writer * 100 + n]))

    on_threads(write, range(6))
    table = catalogs[1].load_table(ident)
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == sorted(
        w * 100 + n for w in range(6) for n in range(4)
    )
    assert len(table.snapshots()) == 24
    assert any(
        s.summary and "isbre.rebased-from-parent" in s.summary.additional_properties
        for s in table.snapshots()
    )


def test_a_replica_commits_on_what_the_other_replica_made_since(pair: list[IsbreServer]) -> None:
    """A replica stages a commit on the table as it last saw it; when the other replica has moved
    the table since, the commit is judged on the table as it is now, not as remembered."""
    namespace, _ = create_namespace(pair[0])
    body = {"name": "t", "schema": ID_SCHEMA}
    http.post(f"{pair[0].url}/v1/isbre/namespaces/{namespace}/tables", json=body).raise_for_status()
    through_a, through_b = (f"{s.url}/v1/isbre/namespaces/{namespace}/tables/t" for s in pair)

    def commit(url: str, schema_id: int | None, value: str) -> httpx.Response:
        asserted = (
            []
            if schema_id is None
            else [{"type": "assert-current-schema-id", "current-schema-id": schema_id}]
        )
        updates = [{"action": "set-properties", "updates": {"through": value}}]
        return http.post(url, json={"requirements": asserted, "updates": updates}, timeout=30)

    assert commit(through_a, 0, "a").status_code == 200  # A now remembers schema 0
    wider = {
        **ID_SCHEMA,
        "schema-id": 1,
        "fields": [*ID_SCHEMA["fields"], {"id": 2, "name": "v", "type": "string", "required": False}],
    }
    updates = [
        {"action": "add-schema", "schema": wider, "last-column-id": 2},
        {"action": "set-current-schema", "schema-id": -1},
    ]
    http.post(through_b, json={"updates": updates}, timeout=30).raise_for_status()

    answer = commit(through_a, 1, "a again")  # holds only on what B made
    assert answer.status_code == 200, answer.text
    metadata = answer.json()["metadata"]
    assert metadata["current-schema-id"] == 1 and metadata["properties"]["through"] == "a again"
    answer = commit(through_a, 0, "stale")  # holds only on what A saw before
    assert answer.status_code == 409 and answer.json()["error"]["type"] == "CommitFailedException"

    http.delete(through_b, timeout=30).raise_for_status()
    answer = commit(through_a, None, "gone")
    assert answer.status_code == 404 and answer.json()["error"]["type"] == "NoSuchTableException"


def test_commit_seq_is_gapless_across_both_replicas_under_load(pair: list[IsbreServer]) -> None:
    before = pair[0].high_water()
    acknowledged: list[str] = []

    def write(writer: int) -> None:
        with httpx.Client() as client:
            for _ in range(25):
                name, status = create_namespace(pair[writer % 2], client)
                assert status == 200
                acknowledged.append(name)

    on_threads(write, range(8))
    after = pair[1].high_water()
    assert after == before + 200 == pair[0].high_water()
    records = sse_records(pair[1], until=after, after=before)
    assert [r["commit_seq"] for r in records] == list(range(before + 1, after + 1))
    assert {r["namespace"][0] for r in records} == set(acknowledged)


def test_a_stream_on_one_replica_sees_the_other_s_commits_in_order(pair: list[IsbreServer]) -> None:
    b = pair[1]
    start = b.high_water()
    seen: list[tuple[int, str]] = []

    def follow() -> None:
        for event in subscribe(b.url, after=start):
            seen.append((event.commit_seq, event.record["namespace"][0]))
            if len(seen) == 40:
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    made = [create_namespace(pair[i % 3 == 0])[0] for i in range(40)]  # mostly through A
    follower.join(30)
    assert [seq for seq, _ in seen] == list(range(start + 1, start + 41))
    assert [name for _, name in seen] == made


def test_idempotency_holds_across_replicas(pair: list[IsbreServer]) -> None:
    """One key sent at once through both replicas: one commit, and every answer the same 200 (a
    twin that loses the race must replay the winner's outcome, not fail on what the winner did)."""
    for _ in range(5):
        key = str(uuid.uuid4())
        body = {"namespace": [f"idem{next(_names)}"]}
        answers: list[httpx.Response] = []

        def send(i: int, body: dict = body, key: str = key, answers: list = answers) -> None:
            url = f"{pair[i % 2].url}/v1/isbre/namespaces"
            answers.append(http.post(url, json=body, headers={"Idempotency-Key": key}, timeout=30))

        before = pair[0].high_water()
        on_threads(send, range(8))
        assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]
        assert pair[1].high_water() == before + 1


def test_health_reports_the_database(pair: list[IsbreServer]) -> None:
    store = http.get(f"{pair[0].url}/health").json()["components"]["store"]
    assert store["status"] == "ok" and store["kind"] == "postgresql"
    assert store["commit_seq"] == pair[1].high_water()
    assert store["url"].startswith("postgresql+psycopg://isbre@127.0.0.1:")
    connections = store["connections"]  # fields, not SQLAlchemy's status string
    assert set(connections) == {"size", "in_use", "idle", "overflow"}
    assert connections["size"] == 10 and all(isinstance(v, int) and v >= 0 for v in connections.values())


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/isbre/namespaces/{ns}/tables/t"),
        ("HEAD", "/v1/isbre/namespaces/{ns}/tables/t"),
        ("GET", "/v1/events"),
    ],
)
def test_a_request_waiting_on_the_database_holds_up_no_other(
    pair: list[IsbreServer], method: str, path: str
) -> None:
    """A loadTable (answered from the metadata cache), a table-exists check and an event stream's
    opening read the database; while it keeps them waiting, the server answers everything else."""
    server = pair[0]
    ns, _ = create_namespace(server)
    RestCatalog("r", uri=server.url).create_table(f"{ns}.t", IDS)
    url = server.url + path.format(ns=ns)
    assert http.get(url.replace("/v1/events", "/v1/events/cursor"), timeout=30).status_code == 200
    answers: list[int] = []

    def wait_on_the_lock() -> None:
        params = {"after": 0} if "events" in url else None
        with httpx.stream(method, url, params=params, timeout=60) as answer:
            answers.append(answer.status_code)

    with psycopg.connect(server.store) as holder:  # the lock lasts until its transaction ends
        holder.execute("LOCK TABLE isbre_pointers, isbre_meta IN ACCESS EXCLUSIVE MODE")
        waiting = start_threads(lambda _: wait_on_the_lock(), [None])
        with psycopg.connect(server.store, autocommit=True) as watcher:
            waiting_here = (
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
                " WHERE NOT l.granted AND d.datname = current_database()"
            )
            eventually(lambda: watcher.execute(waiting_here).fetchone()[0], "the request waits on the lock")
        assert not answers, "the request did not wait on the database"
        # Answered while the lock is still held: a request held up behind it would not be.
        config = http.get(f"{server.url}/v1/config", timeout=20)
        holder.rollback()
    for thread in waiting:
        thread.join()
    assert config.status_code == 200
    assert answers == [204 if method == "HEAD" else 200]


def maintenance_count(server: IsbreServer, metric: str) -> int:
    metrics = http.get(f"{server.url}/metrics", timeout=30).text.splitlines()
    (line,) = [line for line in metrics if line.startswith(f"{metric} ")]
    return int(line.split()[1])


def removed_snapshots(server: IsbreServer) -> int:
    return maintenance_count(server, "isbre_maintenance_snapshots_removed_total")


def test_one_replica_maintains_and_each_snapshot_is_expired_once(pair: list[IsbreServer]) -> None:
    """Commits through both replicas make expiry due; the one replica holding the maintenance
    lease expires each snapshot, once, and the other does nothing."""
    before = [removed_snapshots(server) for server in pair]
    a, b = (RestCatalog("isbre", uri=s.url) for s in pair)
    namespace = f"mt{next(_names)}"
    a.create_namespace(namespace)
    eager = {
        "isbre.maintenance.enabled": "true",
        "history.expire.max-snapshot-age-ms": "1",
        "history.expire.min-snapshots-to-keep": "2",
    }
    a.create_table(f"{namespace}.t", IDS, properties=eager)
    for i in range(6):
        (a if i % 2 else b).load_table(f"{namespace}.t").append(ids([i]))
    table = a.load_table(f"{namespace}.t")
    eventually(lambda: len(table.refresh().metadata.snapshots) == 2, "expiry down to 2 snapshots", timeout=30)
    holding = [http.get(f"{s.url}/health").json()["components"]["maintenance"]["maintaining"] for s in pair]
    assert sorted(holding) == [False, True], holding

    def removed_since() -> list[int]:
        return [removed_snapshots(server) - was for server, was in zip(pair, before, strict=True)]

    # The job is counted once it has ended, after it deleted what the expired snapshots named.
    eventually(lambda: sum(removed_since()) >= 4, "the expiry counted", timeout=30)
    removed = removed_since()
    assert removed[holding.index(False)] == 0
    assert removed[holding.index(True)] == 4  # each of the six snapshots but the newest two, once
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == list(range(6))


def test_one_replica_compacts_in_a_job_process_on_the_shared_store(pair: list[IsbreServer]) -> None:
    """The lease holder's job process opens the PostgreSQL store and commits the compaction; the
    other replica compacts nothing."""
    rewritten = "isbre_maintenance_files_rewritten_total"
    before = [maintenance_count(server, rewritten) for server in pair]
    a, b = (RestCatalog("isbre", uri=s.url) for s in pair)
    namespace = f"mt{next(_names)}"
    a.create_namespace(namespace)
    compacting = {
        "isbre.maintenance.enabled": "true",
        "isbre.maintenance.compact.enabled": "true",
        "isbre.maintenance.compact.min-input-files": "4",
    }
    a.create_table(f"{namespace}.t", IDS, properties=compacting)
    for i in range(4):
        (a if i % 2 else b).load_table(f"{namespace}.t").append(ids([i]))
    table = a.load_table(f"{namespace}.t")

    eventually(lambda: compacted(table), "a replace snapshot", timeout=60)
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == list(range(4))
    assert len(table.inspect.files()) == 1

    def counted() -> list[int]:
        return [maintenance_count(server, rewritten) - was for server, was in zip(pair, before, strict=True)]

    eventually(lambda: sorted(counted()) == [0, 4], "the four files counted by one replica", timeout=30)


def lineage_runs(receiver: Receiver) -> set[str]:
    return {e["run"]["runId"] for e in receiver.snapshot() if e["eventType"] == "COMPLETE"}


def lineage_status(server: IsbreServer) -> dict:
    return http.get(f"{server.url}/v1/lineage/status", timeout=10).json()


def relaying(server: IsbreServer) -> dict:
    relays: dict = http.get(f"{server.url}/health", timeout=10).json()["components"]["relays"]
    return relays


def test_kill_9_of_a_replica_under_load(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Every acknowledged commit stays; the lineage and relays leases move to the survivor, which
    delivers the runs the dead one had not, and relays every commit to JetStream once."""
    receiver = Receiver().start()
    broker = NatsBroker(tmp_path).start()
    store = new_database(request)
    relays = [{"kind": "nats", "name": "bus", "url": broker.url}]
    env = {"ISBRE_LINEAGE_URL": receiver.url, "ISBRE_RELAYS": json.dumps(relays)}
    first = replica(tmp_path / "warehouse", store, **env)
    eventually(
        lambda: lineage_status(first)["delivering"], "the first replica never took the lease", timeout=30
    )
    eventually(
        lambda: relaying(first)["relaying"], "the first replica never took the relays lease", timeout=30
    )
    second = replica(tmp_path / "warehouse", store, **env)
    try:
        assert not lineage_status(second)["delivering"]
        assert not relaying(second)["relaying"]
        base = [f"{s.url}/v1/isbre" for s in (first, second)]
        http.post(f"{base[0]}/namespaces", json={"namespace": ["db"]}).raise_for_status()
        acknowledged: list[str] = []
        stop = threading.Event()

        def write(writer: int) -> None:
            with httpx.Client(timeout=10) as client:
                for n in itertools.count():
                    if stop.is_set():
                        return
                    name = f"t{writer}_{n}"
                    try:
                        answer = client.post(
                            f"{base[writer % 2]}/namespaces/db/tables",
                            json={"name": name, "schema": ID_SCHEMA},
                        )
                    except httpx.TransportError:
                        continue  # the replica died under this request: not acknowledged
                    if answer.status_code == 200:
                        acknowledged.append(name)

        def through(replica: int) -> int:
            return sum(int(name[1:].split("_")[0]) % 2 == replica for name in acknowledged)

        writers = start_threads(write, range(6))
        eventually(lambda: min(through(0), through(1)) >= 10, "each replica acknowledged 10 creates")
        first.kill()
        before = through(1)
        eventually(lambda: through(1) >= before + 10, "the survivor acknowledged 10 more")
        stop.set()
        for thread in writers:
            thread.join()

        listed = http.get(f"{base[1]}/namespaces/db/tables", params={"pageSize": 1000}).json()
        present = {ident["name"] for ident in listed["identifiers"]}
        assert set(acknowledged) <= present
        eventually(
            lambda: lineage_status(second)["delivering"], "the lease did not move to the survivor", timeout=30
        )
        records = sse_records(second, until=second.high_water(), after=0)
        assert [r["commit_seq"] for r in records] == list(range(1, len(records) + 1))
        expected = {r["run_id"] for r in records if r["kind"].startswith("table.")}

        def missing() -> set[str]:
            return expected - lineage_runs(receiver)

        eventually(lambda: not missing(), "runs were lost when the replica died", timeout=60)
        eventually(lambda: relaying(second)["relays"]["bus"]["lag"] == 0, "the survivor relayed", timeout=60)
        published = [event["commitseq"] for _, _, event in broker.messages()]
        assert published == [r["commit_seq"] for r in records]
    finally:
        second.stop()
        receiver.stop()
        broker.stop()


def first_stream_answer(server: IsbreServer) -> int:
    """The status of a new event stream, once its first frame came (a 503 has none to wait for)."""
    with http.stream("GET", f"{server.url}/v1/events", params={"after": 0}, timeout=10) as stream:
        if stream.status_code == 200:
            assert next(stream.iter_lines()).startswith("retry:")
        return stream.status_code


def test_postgres_stopped_under_load_gives_503s_and_service_resumes(tmp_path: Path) -> None:
    database = PostgresServer.start()  # its own: stopping it must not disturb other tests
    try:
        pair = [replica(tmp_path / "warehouse", database.url) for _ in range(2)]
        statuses: list[int] = []
        acknowledged: list[str] = []
        stop = threading.Event()

        def write(writer: int) -> None:
            with httpx.Client(timeout=30) as client:
                while not stop.is_set():
                    name, status = create_namespace(pair[writer % 2], client)
                    statuses.append(status)
                    if status == 200:
                        acknowledged.append(name)
                    elif status == 503:
                        time.sleep(0.05)

        writers = start_threads(write, range(4))
        eventually(lambda: statuses.count(200) >= 10, "10 namespaces created before the pause")
        database.pause()
        down = eventually(
            lambda: (answer := http.get(f"{pair[0].url}/health", timeout=30)).status_code == 503 and answer,
            "the health check says the store is down",
        )
        assert down.json()["components"]["store"]["status"] == "down"
        assert http.get(f"{pair[1].url}/ready", timeout=30).status_code == 503
        scrape = http.get(f"{pair[1].url}/metrics", timeout=30)  # still scraped: it says the store is down
        assert scrape.status_code == 200 and "isbre_store_up 0" in scrape.text
        eventually(lambda: 503 in statuses, "a write refused with 503 while the store is down")
        database.resume()
        # The first stream each replica opens after the restart is served or refused, never left
        # without an answer (the events fan-out process meets the dead connection first).
        for each in pair:
            assert first_stream_answer(each) in (200, 503)
        during = len(statuses)
        eventually(lambda: statuses[during:].count(200) > 20, "service did not resume by itself", timeout=30)
        stop.set()
        for thread in writers:
            thread.join()

        assert 503 in statuses and 500 not in statuses, sorted(set(statuses))
        assert set(statuses) <= {200, 503}, sorted(set(statuses))
        assert set(acknowledged) <= namespaces_of(pair[0])
        assert http.get(f"{pair[1].url}/health", timeout=30).status_code == 200
        assert "isbre_store_up 1" in http.get(f"{pair[1].url}/metrics", timeout=30).text
        for each in pair:
            each.stop()
    finally:
        database.stop()


def test_a_table_commit_refused_while_the_database_is_down_is_503_not_unknown(tmp_path: Path) -> None:
    """A commit that could not begin its transaction certainly did not land: `503`, which a client
    retries, not the `500 CommitStateUnknownException` kept for a transaction lost as it ended."""
    database = PostgresServer.start()  # its own: stopping it must not disturb other tests
    try:
        server = replica(tmp_path / "warehouse", database.url)
        catalog = RestCatalog("isbre", uri=server.url)
        catalog.create_namespace("down")
        table = catalog.create_table("down.t", schema=pa.schema([pa.field("n", pa.int64())]))
        endpoint = f"{server.url}/v1/isbre/namespaces/down/tables/t"
        database.pause()
        answers = [
            http.post(
                endpoint,
                json={"updates": [{"action": "set-properties", "updates": {"k": str(i)}}]},
                timeout=60,
            )
            for i in range(4)
        ]
        assert [a.status_code for a in answers] == [503] * 4, [a.text for a in answers]
        assert {a.json()["error"]["type"] for a in answers} == {"ServiceUnavailableException"}
        database.resume()
        assert "k" not in eventually(lambda: catalog.load_table("down.t").properties, "the table loads again")
        assert catalog.load_table("down.t").metadata_location == table.metadata_location
        server.stop()
    finally:
        database.stop()


def test_store_copy_keeps_history_tables_and_cursors(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    warehouse = tmp_path / "warehouse"
    embedded = IsbreServer(warehouse).start()
    catalog = RestCatalog("isbre", uri=embedded.url)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", IDS)
    table.append(ids(range(10)))
    cursor = embedded.high_water()  # a subscriber's position, taken before the copy
    for n in range(3):
        table.append(ids([100 + n]))
    write_once(catalog, "db.s", rows(0, 50), span(0, 50))  # sink coverage
    write_once(catalog, "db.s", rows(80, 90), span(80, 90))
    history = sse_records(embedded, until=embedded.high_water(), after=cursor)
    location = catalog.load_table("db.t").metadata_location
    sink_table = catalog.load_table("db.s").metadata.table_uuid
    embedded.stop()
    # A consumer's cursor, and a log trimmed below it: the copy keeps both as they are.
    service = open_catalog(warehouse)
    service.core.commit_log.set_consumer_cursor("audit", cursor)
    assert service.core.commit_log.trim_log(keep_records=1, keep_us=0) > 0
    service.close()
    lmdb = LmdbStore(warehouse / "isbre.lmdb")
    with lmdb.read() as view:
        before = (view.cursors(), view.log_floor(), view.commit_seq(), view.coverage(str(sink_table)).ranges)
    lmdb.close()

    store = new_database(request)
    copy = [sys.executable, "-m", "isbre.rest.cli", "store", "copy", "--from", str(warehouse / "isbre.lmdb")]
    env = {**os.environ, "ISBRE_STORE": store}
    done = zygote.run(copy, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"commit_seq {history[-1]['commit_seq']}" in done.stdout

    again = zygote.run(copy, env=env, capture_output=True, text=True)
    assert again.returncode != 0 and "already holds a catalog" in again.stderr

    copied_store = PostgresStore(store, migrate=False)
    with copied_store.read() as view:
        after = (view.cursors(), view.log_floor(), view.commit_seq(), view.coverage(str(sink_table)).ranges)
    copied_store.close()
    assert after == before and before[1] > 1 and before[3]

    moved = replica(warehouse, store)
    try:
        copied = RestCatalog("isbre", uri=moved.url).load_table("db.t")
        assert copied.metadata_location == location
        assert sorted(copied.scan().to_arrow()["id"].to_pylist()) == [*range(10), 100, 101, 102]
        assert sse_records(moved, until=history[-1]["commit_seq"], after=cursor) == history
        _, status = create_namespace(moved)
        assert status == 200 and moved.high_water() == history[-1]["commit_seq"] + 1
    finally:
        moved.stop()


def test_store_migrate_by_hand(request: pytest.FixtureRequest) -> None:
    env = {**os.environ, "ISBRE_STORE": new_database(request)}
    migrate = [sys.executable, "-m", "isbre.rest.cli", "store", "migrate"]
    first = zygote.run(migrate, env=env, capture_output=True, text=True)
    assert first.returncode == 0 and "schema none -> 1" in first.stdout, first.stderr
    again = zygote.run(migrate, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "schema 1, up to date" in again.stdout
    lmdb = zygote.run([*migrate, "--store", "/tmp/some.lmdb"], capture_output=True, text=True)
    assert lmdb.returncode == 2 and "no schema to migrate" in lmdb.stderr
