"""Nothing dies silently: the lineage worker comes back, a broken writer is never a hang, a full disk
is a clean refusal that leaves nothing behind and passes once there is room again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest
from isbre.catalog import CatalogService
from isbre.catalog.lmdb_store import LmdbStore
from isbre.catalog.store import StoreGrowthError, WriteView
from isbre.catalog.warehouses import open_catalog
from isbre.catalog.writer import Batch, Writer, WriterClosedError

from tests.disks import fill
from tests.http_client import http
from tests.lineage_receiver import Receiver
from tests.server import ID_SCHEMA, IsbreServer
from tests.waiting import eventually

P = "/v1/isbre"


def test_the_lineage_worker_is_back_within_seconds_after_kill_9(tmp_path: Path) -> None:
    receiver = Receiver().start()
    server = IsbreServer(tmp_path / "warehouse", env={"ISBRE_LINEAGE_URL": receiver.url}).start()
    try:
        lineage = lambda: http.get(f"{server.url}/health").json()["components"]["lineage"]  # noqa: E731
        first = eventually(lambda: lineage().get("process"), what="the lineage worker")
        os.kill(first, signal.SIGKILL)
        degraded = eventually(
            lambda: lineage()["status"] == "degraded" or lineage().get("process") != first,
            "the lineage worker seen gone",
        )
        assert degraded
        second = eventually(
            lambda: (p := lineage().get("process")) not in (None, first) and p,
            timeout=10,
            what="a new worker",
        )
        assert lineage()["status"] == "ok"
        http.post(f"{server.url}{P}/namespaces", json={"namespace": ["db"]}).raise_for_status()
        http.post(
            f"{server.url}{P}/namespaces/db/tables", json={"name": "t", "schema": ID_SCHEMA}
        ).raise_for_status()
        eventually(lambda: len(receiver.snapshot()) >= 2, what="lineage from the new worker")
        assert second != first
        assert "lineage worker" in server.log() and "restart" in server.log()
    finally:
        server.stop()
        receiver.stop()


class _GrowthFails(LmdbStore):
    def grow(self) -> None:
        raise lmdb.MemoryError("mmap failed")


def test_a_store_that_cannot_grow_fails_the_batch_not_the_writer(tmp_path: Path) -> None:
    service = CatalogService(_GrowthFails(tmp_path / "s", map_size=128 << 10), (tmp_path / "wh").as_uri())
    try:
        with pytest.raises(StoreGrowthError) as failed:
            service.namespaces.create(("big",), {"p": "x" * (200 << 10)})
        assert "grow" in str(failed.value) or "room" in str(failed.value)
        assert service.core.writer.alive
        service.namespaces.create(("small",), {})
        assert service.namespaces.load(("small",)) == {}
    finally:
        service.close()


class _Bug(BaseException):
    """Stands for a failure nobody foresaw, outside any per-request handling."""


class _BrokenStore(LmdbStore):
    @contextmanager
    def write(self) -> Iterator[WriteView]:
        raise _Bug("the writer's own loop broke")
        yield  # pragma: no cover


def test_a_writer_that_breaks_fails_its_callers_and_says_so(tmp_path: Path) -> None:
    fatal: list[BaseException] = []
    writer = Writer(_BrokenStore(tmp_path / "s"), on_fatal=fatal.append)
    future = writer.submit(lambda batch: None)
    with pytest.raises(WriterClosedError):
        future.result(timeout=10)
    assert not writer.alive
    assert len(fatal) == 1 and isinstance(fatal[0], _Bug)
    with pytest.raises(WriterClosedError):
        writer.submit(lambda batch: None)
    closing = threading.Thread(target=writer.close)
    closing.start()
    closing.join(timeout=5)
    assert not closing.is_alive(), "close() hung on a dead writer"


def test_live_reports_a_dead_writer(tmp_path: Path) -> None:
    from isbre.rest.health import liveness

    service = open_catalog(tmp_path / "wh")
    try:
        assert liveness(service)[0] == 200
        service.core.writer.submit(lambda batch: (_ for _ in ()).throw(_Bug("x")))  # kills the loop
        eventually(lambda: not service.core.writer.alive, "the writer stopped", timeout=10)
        status, body = liveness(service)
        assert status == 503 and "writer" in body["reason"]
    finally:
        with contextlib.suppress(Exception):
            service.close()


def test_a_mutation_that_raises_base_exception_is_fatal_to_the_writer_only(tmp_path: Path) -> None:
    fatal: list[BaseException] = []
    writer = Writer(LmdbStore(tmp_path / "s"), on_fatal=fatal.append)

    def breaks(batch: Batch) -> None:
        raise _Bug("in a mutation")

    with pytest.raises(WriterClosedError):
        writer.execute(breaks)
    assert fatal and not writer.alive
    writer.close()


def metadata_files(warehouse: Path) -> set[Path]:
    return {p for p in warehouse.rglob("*.metadata.json")}


@pytest.mark.parametrize("reserve_mb", ["2", "0"], ids=["refused early", "disk really full"])
def test_a_full_disk_gives_clean_errors_and_recovers(small_disk: Path, reserve_mb: str) -> None:
    """With a reserve, commits are refused before the disk fills; without one, the writes that
    meet the full disk fail cleanly too."""
    warehouse = small_disk / "warehouse"
    server = IsbreServer(warehouse, env={"ISBRE_MIN_FREE_DISK_MB": reserve_mb})
    server.log_path = small_disk.parent / "full-disk-server.log"  # the log must not fill the disk
    server.start()
    try:
        base = f"{server.url}{P}/namespaces"
        http.post(base, json={"namespace": ["db"]}).raise_for_status()
        http.post(f"{base}/db/tables", json={"name": "t", "schema": ID_SCHEMA}).raise_for_status()
        for round_ in range(2):
            filler = small_disk / f"filler-{round_}"
            fill(filler)
            files = metadata_files(warehouse)
            high = server.high_water()
            for i in range(20):
                commit = {"updates": [{"action": "set-properties", "updates": {"i": str(i)}}]}
                answer = http.post(f"{base}/db/tables/t", json=commit, timeout=30)
                assert answer.status_code in (503, 507), answer.text
                assert answer.json()["error"]["code"] == answer.status_code
                if answer.status_code == 503:
                    assert "retry-after" in answer.headers
            created = http.post(f"{base}/db/tables", json={"name": f"new{round_}", "schema": ID_SCHEMA})
            assert created.status_code in (503, 507)
            # Only the store is written here: LMDB may have free pages left in its file for the first.
            statuses = set()
            for i in range(50):
                grown = {"namespace": [f"full{round_}_{i}"], "properties": {"p": "x" * 60_000}}
                statuses.add(http.post(base, json=grown).status_code)
            assert 507 in statuses and statuses <= {200, 503, 507}, statuses
            assert metadata_files(warehouse) == files, "a refused commit left a metadata file"
            assert not list((warehouse / "db").glob(f"new{round_}-*")), "a refused create left a directory"
            assert server.process is not None and server.process.poll() is None
            assert server.high_water() >= high
            filler.unlink()
            commit = {"updates": [{"action": "set-properties", "updates": {"after": str(round_)}}]}
            recovered = http.post(f"{base}/db/tables/t", json=commit, timeout=30)
            assert recovered.status_code == 200, recovered.text
        assert "disk" in server.log().lower()
    finally:
        server.stop()


def test_new_directories_are_synced_up_to_an_existing_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from isbre.catalog import metadata_files as files
    from isbre.catalog.table_handles import TrustedRoots

    synced: list[Path] = []
    original = os.fsync

    def fsync(descriptor: int) -> None:  # the handles' paths, as the kernel names them
        synced.append(Path(os.readlink(f"/proc/self/fd/{descriptor}")))
        original(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "a" / "b" / "c" / "file.json"
    files.write_durably(None, TrustedRoots([tmp_path.as_uri()]), target.as_uri(), b"{}")  # type: ignore[arg-type]
    # Each folder made, synced into the one above it (the root's too); the file and its entry.
    expected = {tmp_path, tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c", target}
    assert {Path(os.path.realpath(path)) for path in expected} <= set(synced)


def test_directories_another_writer_made_are_synced_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from isbre.catalog import metadata_files as files

    synced: list[Path] = []
    monkeypatch.setattr(files, "_fsync_dir", lambda path: synced.append(Path(path)))
    root = tmp_path / "table"
    data = root / "data" / "part=1"
    data.mkdir(parents=True)
    seen: set[Path] = set()
    files.sync_directories(data / "a.parquet", root, seen)
    files.sync_directories(data / "b.parquet", root, seen)
    assert synced == [root / "data", root]


# A helper whose parent ends, whose SIGTERM handler never gets to run (here: it does nothing, as
# when the main thread is stuck in a call that signals do not interrupt).
_STUCK_HELPER = """
import signal, time
from isbre.catalog.processes import die_with_parent
die_with_parent(grace_s=1.0)
signal.signal(signal.SIGTERM, lambda *_: None)
print("ready", flush=True)
time.sleep(600)
"""
_PARENT = """
import subprocess, sys
child = subprocess.Popen(
    [sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
)
assert child.stdout.readline().strip() == "ready"
print(child.pid, flush=True)
"""


def test_a_helper_stuck_past_its_parents_death_ends_all_the_same() -> None:
    parent = subprocess.run(
        [sys.executable, "-c", _PARENT, _STUCK_HELPER], capture_output=True, text=True, timeout=60, check=True
    )
    pid = int(parent.stdout.strip())

    def ended() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # Ended but not reaped (its parent is gone, so whoever adopted it reaps it): a zombie counts.
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"

    try:
        eventually(ended, "the orphaned helper to end", timeout=15)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "helper",
    [
        ["isbre.lineage.worker", "--state", "."],
        ["isbre.events.relay_worker", "--state", "."],
        [
            "isbre.events.fanout_process",
            "--listen=x.sock",
            "--retry-ms=1",
            "--keepalive-seconds=1",
            "--ring-size=1",
            "--ring-bytes=1",
        ],
    ],
    ids=["lineage", "relays", "fan-out"],
)
def test_a_helper_whose_server_is_already_gone_ends_before_doing_anything(
    helper: list[str], tmp_path: Path
) -> None:
    """A helper is told which server it works for: one whose server ended before it asked for the
    parent-death signal ends there, though its new parent is a subreaper (a service manager, a
    container's init) and not init, which it could not tell from its server."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    done = subprocess.run(
        [sys.executable, "-m", *helper, f"--server-pid={gone.pid}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert list(tmp_path.iterdir()) == []  # it wrote nothing, not even a log or a status file
