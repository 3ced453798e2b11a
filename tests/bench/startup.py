"""Start-up: seconds from starting `isbre serve` until it answers, beside a minimal FastAPI app
under uvicorn with as many workers (the floor any server on this stack pays), in the same run.

"Answers" means what a client waits for: `/ready` 200 from isbre (with workers, when every one
has started), and 200 from the minimal app's one route.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.bench.harness import RUNS, Report, median_of
from tests.server import free_port

MINIMAL_APP = """
from fastapi import FastAPI

app = FastAPI()


@app.get("/ready")
def ready() -> dict[str, str]:
    return {"status": "ok"}
"""


def _until_ready(url: str, process: subprocess.Popen[bytes], started: float) -> float:
    while process.poll() is None:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return time.perf_counter() - started
        except httpx.TransportError:
            pass
        time.sleep(0.01)
    raise RuntimeError(f"the server exited with {process.returncode}")


def _seconds(command: list[str], cwd: Path, port: int) -> float:
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return _until_ready(f"http://127.0.0.1:{port}/ready", process, started)
    finally:
        process.terminate()
        process.wait()


def isbre_seconds(workdir: Path, workers: int) -> float:
    warehouse = workdir / f"startup-{time.monotonic_ns()}"
    port = free_port()
    command = [sys.executable, "-m", "isbre.rest.cli", "serve", "--warehouse", str(warehouse)]
    command += ["--port", str(port), "--workers", str(workers)]
    return _seconds(command, Path.cwd(), port)


def minimal_seconds(workdir: Path, workers: int) -> float:
    (workdir / "minimal_app.py").write_text(MINIMAL_APP)
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "minimal_app:app", "--port", str(port)]
    command += ["--workers", str(workers)]
    return _seconds(command, workdir, port)


def run(workdir: Path) -> Report:
    report = Report(
        f"Start-up: seconds until the server answers (median of {RUNS} starts), isbre beside a "
        "minimal FastAPI app under uvicorn",
        ["workers", "isbre, s", "minimal app, s", "isbre / minimal"],
    )
    for workers in (1, 2, 8):
        isbre = median_of(RUNS, lambda w=workers: isbre_seconds(workdir, w))
        minimal = median_of(RUNS, lambda w=workers: minimal_seconds(workdir, w))
        report.add(str(workers), isbre, minimal, f"{isbre / minimal:.2f}x")
    return report
