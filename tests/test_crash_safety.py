"""kill -9 in the middle of concurrent commits: everything acknowledged is still there."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from isbre.catalog.file_uris import local_path
from isbre.catalog.lmdb_store import LmdbStore

from tests.http_client import http
from tests.load import commit_until_stopped
from tests.server import IsbreServer
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
