"""The walk of one table commit, from the socket to the store's sync, stays short and is the one
docs/commit-flow.md describes.

The walk is traced, not read: a profiler records, while one commitTable request is served by a
real server in this process, the isbre files on the call stack at each point where the commit's
work passes from one part to the next or is made durable: where the request's bytes arrive
(`data_received`), where the event loop hands the request to a worker thread, where that thread
waits for the writer, where the metadata file is written, each fsync and fdatasync, and the store
transaction's commit. The commit's only sync is the store's: its metadata file is written unsynced
(its bytes ride in the transaction; catalog/file_settling.py syncs such files in groups). Helpers that
a step calls and returns from (the requirement checks, the JSON encoder) are side trips a reader
takes by name, not the walk.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from tests.server import ID_SCHEMA, InProcessServer

ROOT = Path(__file__).parent.parent
MOST_FILES = 13
_OWN = tuple(str(ROOT / package) + "/" for package in ("catalog", "rest", "events", "lineage", "sinks"))


def _isbre_stack(frame: FrameType | None) -> list[str]:
    found: list[str] = []
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_OWN):
            found.append(str(Path(name).relative_to(ROOT)))
        frame = frame.f_back
    return found[::-1]


def _file(frame: FrameType) -> str:
    return Path(frame.f_code.co_filename).name


def _in_writer() -> bool:
    # the commit feed's reader also ends read transactions with commit(); the writer's is the commit's
    return threading.current_thread().name == "isbre-writer"


class Walk:
    """The isbre files on the stack at each hand-over and durability point, in order of first sight."""

    def __init__(self) -> None:
        self.tracing = False
        self.files: list[str] = []
        self.points: list[tuple[str, list[str]]] = []

    def _seen(self, what: str, frame: FrameType | None) -> None:
        stack = _isbre_stack(frame)
        self.points.append((what, stack))
        for name in stack:
            if name not in self.files:
                self.files.append(name)

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.tracing:
            return
        if event == "c_call":
            name = getattr(arg, "__name__", "")
            owner = type(getattr(arg, "__self__", None)).__name__
            if name in ("fsync", "fdatasync"):
                self._seen(name, frame)
            elif name == "write" and getattr(arg, "__module__", "") == "posix":
                self._seen("file written", frame)
            elif (
                name == "commit"
                and owner == "Transaction"
                and _in_writer()
                and _file(frame) == "lmdb_store.py"
            ):
                self._seen("store commit", frame)
        elif event == "call":
            code = frame.f_code
            if code.co_name == "data_received" and code.co_filename.startswith(_OWN):
                self._seen("bytes arrive", frame)
            elif code.co_name == "run_in_threadpool":
                self._seen("to a worker thread", frame.f_back)
            elif code.co_name == "result" and code.co_filename.endswith("futures/_base.py"):
                self._seen("waits for the writer", frame.f_back)


def test_one_commit_walks_through_few_files_and_the_docs_name_them(tmp_path: Path) -> None:
    walk = Walk()
    threading.setprofile(walk.profile)  # the server's threads, started below
    sys.setprofile(walk.profile)
    server = InProcessServer(tmp_path / "warehouse")
    try:
        server.start()
        with httpx.Client(base_url=f"{server.url}/v1", timeout=30) as client:
            client.post("/namespaces", json={"namespace": ["ns"]}).raise_for_status()
            client.post("/namespaces/ns/tables", json={"name": "t", "schema": ID_SCHEMA}).raise_for_status()

            def commit(value: str) -> None:
                change = {"action": "set-properties", "updates": {"k": value}}
                client.post(
                    "/namespaces/ns/tables/t", json={"requirements": [], "updates": [change]}
                ).raise_for_status()

            commit("warm")  # caches and threads as a running server has them
            walk.tracing = True
            commit("traced")
            walk.tracing = False
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        server.stop()
    points = {what for what, _ in walk.points}
    expected = {"bytes arrive", "to a worker thread", "waits for the writer", "file written", "store commit"}
    assert expected <= points, points
    assert "fsync" not in points, "a table commit synced something besides its store transaction"
    described = re.findall(r"^\d+\. `([a-z_/]+\.py)`", (ROOT / "docs" / "commit-flow.md").read_text(), re.M)
    shown = "\n".join(f"{what}: {' > '.join(stack)}" for what, stack in walk.points)
    assert len(walk.files) <= MOST_FILES, shown
    assert described == walk.files, shown
