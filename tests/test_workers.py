"""`isbre serve --workers 2`: several server processes on one port and one store."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from multiprocessing.connection import Client
from multiprocessing.context import AuthenticationError
from pathlib import Path

import httpx
import lmdb
import psutil
import pyarrow as pa
import pytest
from isbre.catalog.shared_writer import SOCKET
from isbre.rest.auth import sha256_hex
from isbre.rest.serve import SERVER_LOCK
from isbre.rest.shared_counters import FOLDER, running_workers
from pyiceberg.catalog.rest import RestCatalog

from tests.http_client import http
from tests.lineage_receiver import Receiver
from tests.server import COMMIT_TIMEOUT, ID_SCHEMA, IsbreServer, on_threads, secured_server
from tests.test_metrics import exposition_is_well_formed
from tests.waiting import eventually


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    running = IsbreServer(tmp_path_factory.mktemp("workers") / "warehouse", workers=2).start()
    http.post(f"{running.url}/v1/isbre/namespaces", json={"namespace": ["w"]}).raise_for_status()
    yield running
    running.stop()


def create(server: IsbreServer, namespace: str, name: str) -> None:
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables"
    http.post(url, json={"name": name, "schema": ID_SCHEMA}, timeout=COMMIT_TIMEOUT).raise_for_status()


def answering_processes(
    server: IsbreServer, connections: int = 40, headers: dict[str, str] | None = None
) -> set[int]:
    """The worker processes that answer fresh connections (`headers`: an admin's, with auth on)."""
    found = set()
    for _ in range(connections):
        with httpx.Client(headers=headers) as client:  # a new connection each time: the kernel spreads them
            found.add(client.get(f"{server.url}/health").json()["process"])
    return found


def commit_many(
    server: IsbreServer,
    tables: list[str],
    writers: int,
    commits: int,
    acknowledged: list[tuple[str, str, int]],
) -> None:
    """`writers` threads, half on connections to each worker, each setting its own key of its table
    to 0..commits-1 until the server goes away."""
    clients = connections_to_each_worker(server, each=(writers + 1) // 2)

    def work(w: int) -> None:
        table, key, client = tables[w % len(tables)], f"k{w}", clients[w]
        for value in range(commits):
            body = {"updates": [{"action": "set-properties", "updates": {key: str(value)}}]}
            try:
                response = client.post(f"{server.url}/v1/isbre/namespaces/w/tables/{table}", json=body)
            except httpx.TransportError:
                return
            if response.status_code == 200:
                acknowledged.append((table, key, value))

    on_threads(work, range(writers))
    for client in clients:
        client.close()


def assert_present(server: IsbreServer, acknowledged: list[tuple[str, str, int]]) -> None:
    newest: dict[tuple[str, str], int] = {}
    for table, key, value in acknowledged:
        newest[(table, key)] = max(value, newest.get((table, key), -1))
    for (table, key), value in newest.items():
        properties = http.get(f"{server.url}/v1/isbre/namespaces/w/tables/{table}").json()["metadata"]
        assert int(properties["properties"][key]) >= value, (table, key)


def commit_seqs(server: IsbreServer, after: int) -> list[int]:
    """Every commit_seq after `after`, from the log (the pull endpoint pages through it)."""
    seqs, body = [], {"page-size": 1000}
    while True:
        page = http.post(f"{server.url}/v1/isbre/events", json=body).json()
        seqs += [int(e["event-id"]) for e in page["events"]]
        if not page["events"]:
            return [s for s in seqs if s > after]
        body = {"page-size": 1000, "continuation-token": page["continuation-token"]}


def commits_answered(server: IsbreServer) -> float:
    """Table commits answered 200, as one /metrics scrape counts them."""
    wanted = (
        'isbre_http_requests_total{method="POST",route="/namespaces/{namespace}/tables/{table}",status="200"}'
    )
    lines = http.get(f"{server.url}/metrics").text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith(wanted))


def test_commits_through_both_workers_to_one_and_many_tables_are_gapless(two: IsbreServer) -> None:
    tables = [f"t{uuid.uuid4().hex[:6]}_{i}" for i in range(4)]
    for table in tables:
        create(two, "w", table)
    before, answered_before = two.high_water(), commits_answered(two)
    time.sleep(0.3)  # a scrape sums the other worker's counts as published a quarter second ago
    assert commits_answered(two) == answered_before
    acknowledged: list[tuple[str, str, int]] = []
    commit_many(two, tables[:1], writers=6, commits=20, acknowledged=acknowledged)  # one table
    commit_many(two, tables, writers=8, commits=20, acknowledged=acknowledged)  # many tables
    assert len(acknowledged) == 6 * 20 + 8 * 20
    assert_present(two, acknowledged)
    assert commit_seqs(two, before) == list(range(before + 1, before + 1 + len(acknowledged)))
    # One scrape counts the commits every worker answered (other workers' shares: a quarter second old).
    eventually(
        lambda: commits_answered(two) - answered_before == len(acknowledged),
        f"one scrape counting the {len(acknowledged)} commits both workers answered",
        timeout=5,
    )


def connections_to_each_worker(server: IsbreServer, each: int = 4) -> list[httpx.Client]:
    """Kept-alive connections, `each` to every worker (a connection stays with the worker that
    accepted it)."""
    by_process: dict[int, list[httpx.Client]] = {}
    for _ in range(200):
        client = httpx.Client(timeout=30)
        process = client.get(f"{server.url}/health").json()["process"]
        if len(by_process.setdefault(process, [])) < each:
            by_process[process].append(client)
        else:
            client.close()
        if len(by_process) == 2 and all(len(c) == each for c in by_process.values()):
            return [client for clients in by_process.values() for client in clients]
    raise AssertionError(f"could not reach both workers: {sorted(by_process)}")


def writer_gauges(server: IsbreServer) -> tuple[int, int, int]:
    """(mutations waiting, mutations in the transaction under way, transactions that held commits of
    both workers), over every process of the server, as one scrape sums them."""
    plain = exposition_is_well_formed(http.get(f"{server.url}/metrics").text)
    names = ("isbre_writer_queue_depth", "isbre_writer_committing", "isbre_commit_shared_batches_total")
    queued, committing, shared = (int(float(plain[name])) for name in names)
    return queued, committing, shared


def test_the_commits_of_both_workers_share_one_store_transaction(tmp_path: Path) -> None:
    """The supervisor runs the workers' pointer swaps on one writer: while a test holds the store's
    write lock, a first commit waits in a transaction, and one commit from each worker waits for
    the next; released, that next transaction holds both. Seen through /metrics, which sums every
    process's gauges a quarter second late at most: each step waits for what it needs to see."""
    # Each commit syncs its own metadata file: no worker's own writer has anything to do meanwhile.
    server = IsbreServer(tmp_path / "warehouse", workers=2, env={"ISBRE_METADATA_SYNC_SECONDS": "0"}).start()
    clients = connections_to_each_worker(server, each=2)
    try:
        http.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["w"]}).raise_for_status()
        for table in ("first", "a", "b"):
            create(server, "w", table)
        _, _, shared_before = writer_gauges(server)
        answers: list[int] = []

        def commit(client: httpx.Client, table: str) -> threading.Thread:
            body = {"updates": [{"action": "set-properties", "updates": {"k": table}}]}
            url = f"{server.url}/v1/isbre/namespaces/w/tables/{table}"
            thread = threading.Thread(target=lambda: answers.append(client.post(url, json=body).status_code))
            thread.start()
            return thread

        environment = lmdb.open(str(server.warehouse / "isbre.lmdb"), max_dbs=64, subdir=True)
        holding = environment.begin(write=True)
        try:
            threads = [commit(clients[0], "first")]
            eventually(lambda: writer_gauges(server)[:2] == (0, 1), "the first commit's transaction waiting")
            # clients[0:2] reach one worker, clients[2:4] the other.
            threads += [commit(clients[1], "a"), commit(clients[2], "b")]
            eventually(lambda: writer_gauges(server)[:2] == (2, 1), "one commit of each worker queued")
        finally:
            holding.abort()
            environment.close()
        for thread in threads:
            thread.join(timeout=COMMIT_TIMEOUT)
        assert answers == [200, 200, 200]
        eventually(
            lambda: writer_gauges(server)[2] == shared_before + 1,
            "one transaction counted as holding both workers' commits",
            timeout=5,
        )
    finally:
        for client in clients:
            client.close()
        server.stop()


def test_only_the_servers_workers_may_hand_the_committer_a_transaction(two: IsbreServer) -> None:
    """The committer runs what it is sent: its socket is the server's user's alone, and it serves a
    connection only once it proves it holds the key the supervisor gave its workers."""
    socket_path = two.warehouse / SOCKET
    assert stat.S_IMODE(socket_path.stat().st_mode) & 0o077 == 0
    before = two.high_water()
    with pytest.raises(AuthenticationError):
        Client(str(socket_path), family="AF_UNIX", authkey=b"not the server's key")
    create(two, "w", f"after_{uuid.uuid4().hex[:6]}")  # the workers' own connections still serve
    assert two.high_water() == before + 1


def test_the_server_says_it_is_up_once_every_worker_answers(tmp_path: Path) -> None:
    """uvicorn says "running" when the port is bound, before any worker has started; isbre's own
    line, and /ready, wait for every worker."""
    server = IsbreServer(tmp_path / "warehouse", workers=2)
    server.ready_path = "/live"  # answered by the first worker up, as uvicorn's line is
    server.start()
    try:
        eventually(lambda: "isbre up:" in server.log(), "the server saying it is up", every=0.02)
        assert http.get(f"{server.url}/ready").json() == {"status": "ok"}
        assert len(connections_to_each_worker(server, each=1)) == 2  # both answer
        up = [line for line in server.log().splitlines() if "isbre up:" in line]
        warehouse = (tmp_path / "warehouse").resolve()
        said = (
            f"isbre up: {server.url} answers (2 workers); console {server.url}/ui/; "
            f"warehouse isbre at {warehouse}; store {warehouse / 'isbre.lmdb'}"
        )
        assert len(up) == 1 and up[0].endswith(said), up
    finally:
        server.stop()


def test_ready_counts_the_workers_that_run(tmp_path: Path) -> None:
    folder = tmp_path / FOLDER
    folder.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for pid in (os.getpid(), gone.pid):
        (folder / f"{pid}.json").write_text("{}")
    (folder / "not-a-pid.json").write_text("{}")
    assert running_workers(tmp_path) == [folder / f"{os.getpid()}.json"]
    assert sorted(p.name for p in folder.iterdir()) == [f"{os.getpid()}.json"]  # the others removed


def test_one_idempotency_key_sent_to_both_workers_commits_once(two: IsbreServer) -> None:
    table = f"idem_{uuid.uuid4().hex[:6]}"
    create(two, "w", table)
    before = two.high_water()
    key = str(uuid.uuid4())
    body = {"updates": [{"action": "set-properties", "updates": {"once": "yes"}}]}
    url = f"{two.url}/v1/isbre/namespaces/w/tables/{table}"
    clients = connections_to_each_worker(two)
    answers: list[httpx.Response] = []
    go = threading.Barrier(len(clients))

    def send(client: httpx.Client) -> None:
        go.wait()
        answers.append(client.post(url, json=body, headers={"Idempotency-Key": key}))

    on_threads(send, clients)
    for client in clients:
        client.close()
    assert {a.status_code for a in answers} == {200}
    assert len({a.json()["metadata-location"] for a in answers}) == 1
    assert two.high_water() == before + 1


def test_a_subscriber_sees_every_workers_commits_in_order(two: IsbreServer) -> None:
    table = f"sse_{uuid.uuid4().hex[:6]}"
    create(two, "w", table)
    start = two.high_water()
    seen: list[int] = []
    ready = threading.Event()

    def follow() -> None:
        with http.stream("GET", f"{two.url}/v1/events", params={"after": start}, timeout=60) as stream:
            ready.set()
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    seen.append(json.loads(line[5:])["commit_seq"])
                    if len(seen) == 80:
                        return

    follower = threading.Thread(target=follow)
    follower.start()
    ready.wait(10)
    commit_many(two, [table], writers=4, commits=20, acknowledged=[])
    follower.join(60)
    assert seen == list(range(start + 1, start + 81))


def test_one_fan_out_process_serves_the_streams_of_every_worker(two: IsbreServer) -> None:
    clients = connections_to_each_worker(two, each=1)

    def one_fanout() -> list[dict] | None:
        health = [client.get(f"{two.url}/health").json() for client in clients]
        fanouts = {h["components"]["events"]["process"] for h in health}
        return health if len(fanouts) == 1 and None not in fanouts else None

    health = eventually(one_fanout, "every worker naming one fan-out process", timeout=10, every=0.2)
    fanouts = {h["components"]["events"]["process"] for h in health}
    workers = {h["process"] for h in health}
    assert len(fanouts) == 1 and None not in fanouts and not fanouts & workers, (fanouts, workers)
    for client in clients:
        client.close()


def descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *descendants(int(child))]
    return found


def test_a_crafted_counter_file_cannot_forge_metrics_lines(two: IsbreServer) -> None:
    """Each worker sums the others' counter files into /metrics: what a file says is data."""
    folder = two.warehouse / "isbre-workers"
    http.get(f"{two.url}/metrics").raise_for_status()
    real = json.loads(next(folder.glob("*.json")).read_text())
    crafted = dict(
        real,
        requests=[['GET",route="x"} 1\nisbre_commit_seq 999999\n#', "/v1/config\nforged 1", 200, 1]],
        reports={"scan-report\nisbre_store_up 0": 5},
        rebases={'committed"} 1\nisbre_commit_seq 999999\n#': 3, "gave-up": 2},
    )
    path = folder / f"{os.getpid()}.json"  # a process that is alive: its file is summed
    path.write_text(json.dumps(crafted))
    try:
        for _ in range(6):  # the scrape reaches one worker or the other
            text = http.get(f"{two.url}/metrics").text
            plain = exposition_is_well_formed(text)
            assert plain["isbre_commit_seq"] != "999999" and plain["isbre_store_up"] == "1"
            assert 'isbre_metrics_reports_total{type="other"} 5' in text
            assert 'isbre_commit_rebases_total{outcome="gave-up"} 2' in text  # an outcome it knows
    finally:
        path.unlink()


def test_rebased_appends_are_counted_by_whichever_worker_made_them(two: IsbreServer) -> None:
    catalog = RestCatalog("isbre", uri=two.url)
    catalog.create_namespace("rebased")
    table = catalog.create_table("rebased.t", pa.schema([pa.field("n", pa.int64())]))
    stale = [catalog.load_table("rebased.t") for _ in range(4)]
    batch = pa.table({"n": [1]})
    table.append(batch)
    for view in stale:  # each made on the empty table: all four rebased, by one worker or the other
        view.append(batch)

    def counted() -> bool:
        return 'isbre_commit_rebases_total{outcome="committed"} 4' in http.get(f"{two.url}/metrics").text

    for _ in range(4):  # the scrape reaches one worker or the other: each sums both
        eventually(counted, "both workers' rebased commits in one scrape")


def test_the_failed_login_limit_holds_across_workers(tmp_path: Path) -> None:
    principals = [
        {"name": "etl", "roles": ["writer"], "client_id": "etl", "secret_sha256": sha256_hex("right")},
        {"name": "root", "roles": ["admin"], "token_sha256": sha256_hex("root")},
    ]
    server = secured_server(tmp_path / "warehouse", principals, workers=2, ISBRE_AUTH__MAX_FAILED_LOGINS="5")
    try:
        answers = []
        for _ in range(10):
            with httpx.Client() as client:  # a new connection each time: both workers answer some
                form = {"grant_type": "client_credentials", "client_id": "etl", "client_secret": "wrong"}
                answers.append(client.post(f"{server.url}/v1/oauth/tokens", data=form).status_code)
        assert answers == [401] * 5 + [429] * 5, answers
        assert len(answering_processes(server, headers={"Authorization": "Bearer root"})) == 2
    finally:
        server.stop()


def test_kill_9_of_one_worker_under_load(tmp_path: Path) -> None:
    server = IsbreServer(tmp_path / "warehouse", workers=2).start()
    try:
        http.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["w"]}).raise_for_status()
        tables = [f"t{i}" for i in range(4)]
        for table in tables:
            create(server, "w", table)
        victim = http.get(f"{server.url}/health").json()["process"]
        acknowledged: list[tuple[str, str, int]] = []
        load = threading.Thread(target=commit_many, args=(server, tables, 8, 60, acknowledged))
        load.start()
        while len(acknowledged) < 50:
            time.sleep(0.01)
        os.kill(victim, signal.SIGKILL)
        load.join()
        eventually(
            lambda: victim not in (processes := answering_processes(server, 20)) and len(processes) >= 2,
            "the dead worker replaced by a new one",
            every=0.5,
        )
        assert_present(server, acknowledged)
        seqs = commit_seqs(server, 0)
        assert seqs == list(range(1, len(seqs) + 1))
    finally:
        server.stop()


def under_load(tmp_path: Path) -> tuple[IsbreServer, list[tuple[str, str, int]], threading.Thread]:
    """A 2-worker server with 8 writers committing to 4 tables, 80 commits acknowledged so far."""
    server = IsbreServer(tmp_path / "warehouse", workers=2).start()
    http.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["w"]}).raise_for_status()
    tables = [f"t{i}" for i in range(4)]
    for table in tables:
        create(server, "w", table)
    acknowledged: list[tuple[str, str, int]] = []
    load = threading.Thread(target=commit_many, args=(server, tables, 8, 1000, acknowledged))
    load.start()
    while len(acknowledged) < 80:
        time.sleep(0.01)
    return server, acknowledged, load


def assert_present_after_restart(server: IsbreServer, acknowledged: list[tuple[str, str, int]]) -> None:
    restarted = IsbreServer(server.warehouse, workers=2).start()
    try:
        assert_present(restarted, acknowledged)
    finally:
        restarted.stop()


def test_kill_9_of_the_whole_server_under_load(tmp_path: Path) -> None:
    server, acknowledged, load = under_load(tmp_path)
    assert server.process is not None
    everyone = [server.process.pid, *descendants(server.process.pid)]
    for pid in everyone:
        # One that is gone already died of its parent's death (the parent-death signal): as wanted.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    server.process.wait()
    load.join()
    assert_present_after_restart(server, acknowledged)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_kill_9_of_the_supervisor_alone_under_load(tmp_path: Path) -> None:
    """The supervisor commits the workers' table commits: killed alone, its workers lose their
    committer with commits in flight (they ask the store what landed, then end, as their parent
    ended); whatever any of them acknowledged is there after a restart."""
    server, acknowledged, load = under_load(tmp_path)
    assert server.process is not None
    workers = descendants(server.process.pid)
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    load.join()
    eventually(lambda: not any(map(running, workers)), "every worker ended", timeout=60)
    assert acknowledged
    assert_present_after_restart(server, acknowledged)


def test_one_lineage_worker_delivers_the_runs_of_every_worker(tmp_path: Path) -> None:
    receiver = Receiver().start()
    server = IsbreServer(tmp_path / "warehouse", workers=2, env={"ISBRE_LINEAGE_URL": receiver.url}).start()
    try:
        http.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["w"]}).raise_for_status()
        for table in ("a", "b"):
            create(server, "w", table)
        acknowledged: list[tuple[str, str, int]] = []
        commit_many(server, ["a", "b"], writers=4, commits=5, acknowledged=acknowledged)
        runs = 2 + len(acknowledged)  # the creates and the commits, START and COMPLETE each
        eventually(lambda: len(receiver.snapshot()) >= 2 * runs, f"{2 * runs} lineage events", timeout=60)
        events = receiver.snapshot()
        assert len(events) == 2 * runs  # once each: one lineage worker, not one per worker process
        assert len({e["run"]["runId"] for e in events}) == runs
        statuses = {
            client.get(f"{server.url}/v1/lineage/status").json()["process"]
            for client in connections_to_each_worker(server, each=1)
        }
        assert len(statuses) == 1 and None not in statuses  # both workers report the same worker

        # SIGTERM with lineage on and a stream open: every worker shuts down cleanly.
        with http.stream("GET", f"{server.url}/v1/events", params={"after": 0}, timeout=30) as stream:
            next(stream.iter_lines())
            assert server.process is not None
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=30) == 0
        log = server.log()
        for sign in ("Traceback", "Application shutdown failed", "AttributeError"):
            assert sign not in log, log[-3000:]
    finally:
        server.stop()
        receiver.stop()


def test_a_signal_to_the_whole_process_group_stops_it_quietly(tmp_path: Path) -> None:
    """Ctrl-C in a terminal, or `timeout`, signals every process of the group at once: the helpers
    (fan-out, lineage) are in groups of their own and stopped by the server, in order."""
    receiver = Receiver().start()
    server = IsbreServer(tmp_path / "warehouse", workers=2, env={"ISBRE_LINEAGE_URL": receiver.url}).start()
    try:
        assert server.process is not None
        with http.stream("GET", f"{server.url}/v1/events", params={"after": 0}, timeout=30) as stream:
            next(stream.iter_lines())
            os.killpg(server.process.pid, signal.SIGINT)
            assert server.process.wait(timeout=30) == 0
        log = server.log()
        for sign in ("Traceback", "ERROR", "exited", "has gone"):
            assert sign not in log, log[-3000:]
    finally:
        server.stop()
        receiver.stop()


def test_sigterm_drains_every_worker_and_loses_nothing(tmp_path: Path) -> None:
    server, acknowledged, load = under_load(tmp_path)
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=30) in (0, -signal.SIGTERM)
    load.join()
    assert_present_after_restart(server, acknowledged)


def test_a_worker_never_answers_from_a_stale_pointer(two: IsbreServer) -> None:
    table = f"fresh_{uuid.uuid4().hex[:6]}"
    create(two, "w", table)
    first, second = connections_to_each_worker(two, each=1)
    url = f"{two.url}/v1/isbre/namespaces/w/tables/{table}"
    for value in range(20):  # commit on one worker, load on the other, and back
        writer, reader = (first, second) if value % 2 else (second, first)
        body = {"updates": [{"action": "set-properties", "updates": {"v": str(value)}}]}
        committed = writer.post(url, json=body).json()["metadata-location"]
        loaded = reader.get(url).json()
        assert loaded["metadata-location"] == committed
        assert loaded["metadata"]["properties"]["v"] == str(value)
    first.close()
    second.close()


def test_one_worker_growing_the_map_does_not_break_the_other(tmp_path: Path) -> None:
    server = IsbreServer(tmp_path / "warehouse", workers=2, env={"ISBRE_MAP_SIZE_MB": "1"}).start()
    try:
        http.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["w"]}).raise_for_status()
        tables = [f"t{i}" for i in range(4)]
        for table in tables:
            create(server, "w", table)
        clients = connections_to_each_worker(server, each=2)

        def fill(w: int) -> None:  # 4 x 40 namespaces with 20 KB of properties: several MiB
            for i in range(40):
                body = {"namespace": [f"n{w}_{i}"], "properties": {"pad": "x" * 20_000}}
                clients[w].post(f"{server.url}/v1/isbre/namespaces", json=body).raise_for_status()

        on_threads(fill, range(4))
        for client in clients:
            client.close()
        assert "growing it" in server.log()
        listed = http.get(f"{server.url}/v1/isbre/namespaces").json()["namespaces"]
        assert len(listed) == 1 + 160
    finally:
        server.stop()


def _holds(process: psutil.Process, path: str) -> bool:
    try:
        return path in {f.path for f in process.open_files()}
    except psutil.NoSuchProcess:  # ended since it was listed (a short-lived child, such as ldconfig)
        return False


def test_every_process_of_a_server_ends_when_its_supervisor_is_killed(tmp_path: Path) -> None:
    receiver = Receiver().start()
    server = IsbreServer(tmp_path / "warehouse", workers=2, env={"ISBRE_LINEAGE_URL": receiver.url}).start()
    try:
        assert server.process is not None
        supervisor = psutil.Process(server.process.pid)
        helpers = supervisor.children(recursive=True)  # workers, the events fan-out, the lineage worker
        assert len(helpers) >= 4, [p.cmdline() for p in helpers]
        # Only the supervisor holds the state directory's lock: it is free the moment it ends.
        lock = os.path.realpath(server.warehouse / SERVER_LOCK)
        assert [p.pid for p in helpers if _holds(p, lock)] == []
        assert lock in {f.path for f in supervisor.open_files()}
        supervisor.kill()  # kill -9 of the supervisor alone
        server.process.wait(timeout=10)
        _, alive = psutil.wait_procs(helpers, timeout=20)
        assert alive == [], ([p.cmdline() for p in alive], server.log()[-3000:])
    finally:
        server.kill()
        receiver.stop()


def test_workers_slower_to_start_than_uvicorn_s_liveness_check_are_waited_for(tmp_path: Path) -> None:
    """On a busy machine a worker may take longer to answer its supervisor than uvicorn's liveness
    check waits (5 s): it is waited for while it starts, not killed as hung and started again."""
    slow = tmp_path / "slow"
    slow.mkdir()
    # Each worker starts 8 s late, as on a machine at full load: one that multiprocessing spawns,
    # or forks from its forkserver (a fork of the server, `python -m`, or a new `python -c`).
    (slow / "sitecustomize.py").write_text(
        "import os, sys, time\n"
        "if '--multiprocessing-fork' in sys.argv:\n    time.sleep(8)\n"
        "elif sys.argv[:1] in (['-c'], ['-m']):\n"
        "    os.register_at_fork(after_in_child=lambda: time.sleep(8))\n"
    )
    server = IsbreServer(tmp_path / "warehouse", workers=2, env={"PYTHONPATH": str(slow)}).start()
    try:
        http.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["patient"]}).raise_for_status()
        create(server, "patient", "t")
        assert "died" not in server.log(), server.log()
    finally:
        server.stop()
