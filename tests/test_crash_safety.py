"""kill -9 in the middle of concurrent commits: everything acknowledged is still there."""

from __future__ import annotations

import threading
from pathlib import Path

import psutil
import pytest
from isbre.catalog.file_uris import local_path
from isbre.catalog.lmdb_store import LmdbStore
from isbre.catalog.stores import open_store

from tests.http_client import http
from tests.load import commit_until_stopped
from tests.postgres import new_database
from tests.server import InProcessServer, IsbreServer
from tests.waiting import eventually

SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}
WRITERS = 8


@pytest.mark.parametrize("run", range(2))
def test_kill_9_loses_no_acknowledged_commit(tmp_path: Path, run: int) -> None:
    server = IsbreServer(tmp_path / "warehouse").start()
    base = f"{server.url}/v1/isbre"
    http.post(f"{base}/namespaces", json={"namespace": ["crash"]}).raise_for_status()
    tables = [f"t{w}" for w in range(WRITERS // 2)]
    for table in tables:
        http.post(
            f"{base}/namespaces/crash/tables", json={"name": table, "schema": SCHEMA}
        ).raise_for_status()

    acknowledged: list[list[str]] = [[] for _ in range(WRITERS)]
    stop = threading.Event()
    # Two writers per table, so commits also race on the same pointer.
    threads = [
        threading.Thread(
            target=commit_until_stopped,
            args=(
                server.url,
                "crash",
                tables[w % len(tables)],
                f"{tables[w % len(tables)]}-w{w}",
                acknowledged[w],
                stop,
            ),
        )
        for w in range(WRITERS)
    ]
    for thread in threads:
        thread.start()
    # Kill once enough commits are acknowledged, however fast this machine makes them.
    wanted = 60 + 40 * run
    eventually(
        lambda: sum(map(len, acknowledged)) >= wanted,
        f"{wanted} acknowledged commits",
        timeout=120,
        every=0.01,
    )
    server.kill()
    stop.set()
    for thread in threads:
        thread.join()
    assert sum(map(len, acknowledged)) > 50, "too few commits landed before the kill to test anything"

    restarted = IsbreServer(server.warehouse).start()
    try:
        for table in tables:
            response = http.get(f"{base.replace(server.url, restarted.url)}/namespaces/crash/tables/{table}")
            assert response.status_code == 200, response.text
            properties = response.json()["metadata"]["properties"]
            missing = [key for keys in acknowledged for key in keys if key.startswith(f"{table}-")]
            missing = [key for key in missing if key not in properties]
            assert missing == [], f"acknowledged commits lost on {table}: {missing[:5]}"
    finally:
        restarted.stop()

    store = LmdbStore(server.warehouse / "isbre.lmdb")
    try:
        records = list(store.scan_log(0))
        with store.read() as view:
            high_water = view.commit_seq()
    finally:
        store.close()
    seqs = [r.commit_seq for r in records]
    assert seqs == list(range(1, len(seqs) + 1))
    assert high_water == seqs[-1]
    committed = [r for r in records if r.kind == "table.commit"]
    assert len(committed) >= sum(map(len, acknowledged))
    for record in committed:
        path = local_path(record.metadata_location or "")
        assert path is not None and path.is_file(), f"record {record.commit_seq} names a missing file"


@pytest.mark.parametrize("kind", ["lmdb", "postgresql"])
def test_a_machine_crash_before_a_group_of_metadata_files_is_synced_loses_no_acknowledged_commit(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """Killed after its transactions committed and before the files they name were synced, the server
    then loses what a machine crash can take from unsynced files (the test deletes some and tears
    the others); started again, it writes each one back from the bytes its store kept, but not
    the file of a table dropped meanwhile."""
    never = {"ISBRE_METADATA_SYNC_SECONDS": "3600"}  # no group is synced before the kill
    database = new_database(request) if kind == "postgresql" else None
    server = IsbreServer(tmp_path / "warehouse", env=never, workers=2, store=database).start()
    base = f"{server.url}/v1/isbre/namespaces"
    http.post(base, json={"namespace": ["crash"]}).raise_for_status()
    acknowledged: dict[str, list[str]] = {}
    for table in ("a", "b", "gone"):
        http.post(f"{base}/crash/tables", json={"name": table, "schema": SCHEMA}).raise_for_status()
        acknowledged[table] = []
        for i in range(5):
            body = {"updates": [{"action": "set-properties", "updates": {f"k{i}": "1"}}]}
            http.post(f"{base}/crash/tables/{table}", json=body).raise_for_status()
            acknowledged[table].append(f"k{i}")
    gone_files = sorted((server.warehouse / "crash").glob("gone-*/metadata/*.metadata.json"))
    http.delete(f"{base}/crash/tables/gone", params={"purgeRequested": "true"}).raise_for_status()
    # Every process at once, children first, as a machine crash ends them: a worker told of its
    # server's end would shut down in order and sync the files itself.
    server_process = psutil.Process(server.pid)
    processes = [*server_process.children(recursive=True), server_process]
    for process in processes:
        process.kill()
    psutil.wait_procs(processes, timeout=30)

    store = open_store(server.store_location)
    try:
        with store.read() as view:
            kept = view.pending_files(1000)
    finally:
        store.close()
    assert len(kept) >= 18, f"the commits' files were synced before the kill: {len(kept)} kept"
    for n, pending in enumerate(kept):
        path = local_path(pending.location)
        assert path is not None
        if n % 2 or not path.exists():
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(pending.data[: len(pending.data) // 2])

    restarted = IsbreServer(server.warehouse, workers=2, store=database).start()
    try:
        for table in ("a", "b"):
            response = http.get(f"{restarted.url}/v1/isbre/namespaces/crash/tables/{table}")
            assert response.status_code == 200, response.text
            assert set(acknowledged[table]) <= set(response.json()["metadata"]["properties"])
        gone = http.get(f"{restarted.url}/v1/isbre/namespaces/crash/tables/gone")
        assert gone.status_code == 404
    finally:
        restarted.stop()
    assert gone_files and not any(path.exists() for path in gone_files)
    store = open_store(server.store_location)
    try:
        with store.read() as view:
            assert view.pending_files(1000) == [], "files kept after a start that synced them"
        records = list(store.scan_log(0))
    finally:
        store.close()
    kept_bytes = {pending.location: pending.data for pending in kept}
    restored = 0
    for record in records:
        if record.kind in ("table.create", "table.commit") and record.name != "gone":
            path = local_path(record.metadata_location or "")
            assert path is not None and path.is_file(), f"record {record.commit_seq} names a missing file"
            assert path.read_bytes() == kept_bytes[record.metadata_location or ""]
            restored += 1
    assert restored == 12


def test_a_torn_metadata_file_is_the_servers_failure_not_the_clients(tmp_path: Path) -> None:
    """A metadata file damaged outside isbre (no kept bytes to restore it from) answers 500 naming
    the file, not a 400 that blames the request."""
    server = InProcessServer(tmp_path / "warehouse").start()
    try:
        base = f"{server.url}/v1/namespaces"
        http.post(base, json={"namespace": ["ns"]}).raise_for_status()
        created = http.post(f"{base}/ns/tables", json={"name": "t", "schema": SCHEMA})
        location = created.json()["metadata-location"]
    finally:
        server.stop()
    path = local_path(location)
    assert path is not None
    path.write_bytes(path.read_bytes()[:100])
    restarted = InProcessServer(tmp_path / "warehouse").start()
    try:
        response = http.get(f"{restarted.url}/v1/namespaces/ns/tables/t")
        assert response.status_code == 500, response.text
        error = response.json()["error"]
        assert error["code"] == 500 and location in error["message"]
    finally:
        restarted.stop()
