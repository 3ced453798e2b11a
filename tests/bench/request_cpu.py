"""Server CPU per read request: isbre's loadTable and tableExists (served by rest/lean_routes.py),
the same loadTable through its FastAPI route (a query string sends it there), and the floor of
this stack in the same run: an ASGI app of one function and a minimal FastAPI app, each answering
a 1 KB JSON body under uvicorn. And what the server spends while nobody asks anything.

Clients run on threads of this process, 4 at a time; the figure is the server process's CPU time
divided by the requests, median of RUNS runs.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from tests.bench.harness import RUNS, Report, cpu_seconds
from tests.bench.load_table import table_with_snapshots
from tests.server import IsbreServer, free_port

CLIENTS = 4
REQUESTS = 1500  # per client and run
IDLE_S = 10.0

FLOOR_APPS = """
from fastapi import Depends, FastAPI, Request, Response

BODY = b'{"metadata-location": "' + b"x" * 1000 + b'"}'


async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": BODY})


fastapi_app = FastAPI()


async def in_namespace(request: Request, namespace: str) -> str:
    return namespace


@fastapi_app.get("/v1/x/namespaces/{namespace}/tables/{table}")
async def load(request: Request, table: str, target: str = Depends(in_namespace)) -> Response:
    return Response(BODY, media_type="application/json")
"""


def _per_request(process: psutil.Process, url: str, method: str = "GET") -> float:
    """Server CPU milliseconds per request, median of RUNS runs of CLIENTS x REQUESTS."""

    def work() -> None:
        with httpx.Client() as client:
            for _ in range(REQUESTS):
                client.request(method, url).raise_for_status()

    runs = []
    for _ in range(RUNS):
        threads = [threading.Thread(target=work) for _ in range(CLIENTS)]
        before = cpu_seconds(process)
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        runs.append((cpu_seconds(process) - before) * 1000 / (CLIENTS * REQUESTS))
    return statistics.median(runs)


def _floor(workdir: Path, app: str) -> float:
    (workdir / "floor_apps.py").write_text(FLOOR_APPS)
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", f"floor_apps:{app}", "--port", str(port)]
    command += ["--log-level", "warning", "--no-access-log"]
    process = subprocess.Popen(command, cwd=workdir)
    try:
        url = f"http://127.0.0.1:{port}/v1/x/namespaces/bench/tables/t"
        _wait_for(url, process)
        return _per_request(psutil.Process(process.pid), url)
    finally:
        process.terminate()
        process.wait()


def _wait_for(url: str, process: subprocess.Popen[bytes]) -> None:
    while process.poll() is None:
        try:
            httpx.get(url, timeout=1).raise_for_status()
            return
        except httpx.TransportError:
            time.sleep(0.01)
    raise RuntimeError(f"the app exited with {process.returncode}")


def _idle_share(process: psutil.Process) -> float:
    """Percent of a core the server's process tree uses while nobody asks anything."""
    time.sleep(1.0)  # what the last request started has ended
    before = cpu_seconds(process)
    time.sleep(IDLE_S)
    return (cpu_seconds(process) - before) / IDLE_S * 100


def run(workdir: Path) -> list[Report]:
    idle = Report(f"An idle server: CPU of its processes over {IDLE_S:g} s", ["server", "% of a core"])
    report = Report(
        f"Server CPU per read request, milliseconds ({CLIENTS} clients, median of {RUNS} runs), "
        "beside the stack's floor",
        ["request", "server CPU ms", "vs ASGI app"],
    )
    figures: list[tuple[str, Callable[[], float]]] = [
        ("an ASGI app of one function under uvicorn", lambda: _floor(workdir, "asgi")),
        (
            "a minimal FastAPI route (a path parameter, one dependency)",
            lambda: _floor(workdir, "fastapi_app"),
        ),
    ]
    server = IsbreServer(workdir / "request-cpu-warehouse").start()
    try:
        url = table_with_snapshots(server)
        process = psutil.Process(server.pid)
        figures += [
            ("isbre loadTable (10 snapshots)", lambda: _per_request(process, url)),
            (
                "the same through FastAPI's route (?snapshots=all)",
                lambda: _per_request(process, f"{url}?snapshots=all"),
            ),
            ("isbre tableExists", lambda: _per_request(process, url, "HEAD")),
        ]
        measured = [(name, measure()) for name, measure in figures]
        idle.add("isbre, one worker, LMDB", f"{_idle_share(process):.2f}")
    finally:
        server.stop()
    floor = measured[0][1]
    for name, ms in measured:
        report.add(name, f"{ms:.3f}", f"{ms / floor:.2f}x")
    return [report, idle]
