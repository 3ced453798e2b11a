"""The console's commit feed under load: frames per second in headless Chromium while the
server commits at a fixed rate, and whether every commit reached the page."""

from __future__ import annotations

import itertools
import re
import statistics
import threading
import time
from pathlib import Path

import httpx
from playwright.sync_api import Page

from tests.bench.harness import RUNS, Report
from tests.browser import chromium, chromium_path
from tests.server import IsbreServer

RATE = 200  # commits per second
SECONDS = 10
THREADS = 8

# Every animation frame's time, from the page's own clock.
COUNT_FRAMES = """
window.frameTimes = [];
const tick = (t) => { window.frameTimes.push(t); requestAnimationFrame(tick); };
requestAnimationFrame(tick);
"""


def commit_steadily(server: IsbreServer) -> tuple[int, float]:
    """RATE commits a second for SECONDS (namespace property updates, spread over threads);
    returns how many were made and the rate reached."""
    total = RATE * SECONDS
    start = time.monotonic() + 0.2
    made = [0] * THREADS

    def work(lane: int) -> None:
        with httpx.Client(base_url=f"{server.url}/v1/isbre") as client:
            for n in range(lane, total, THREADS):
                delay = start + n / RATE - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                body = {"updates": {"n": str(n)}}
                client.post("/namespaces/bench/properties", json=body).raise_for_status()
                made[lane] += 1

    threads = [threading.Thread(target=work, args=(lane,)) for lane in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(made), sum(made) / (time.monotonic() - start)


NEW_SINCE_OPENED = re.compile(r"(\d+) new since the page opened")


def shown_after(page: Page, made: int, timeout: float = 30.0) -> int:
    """The feed's count of commits once it reaches `made` (or what it reached by the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        # "K recent commits from the log, N new since the page opened (...)": the commits are the N.
        found = NEW_SINCE_OPENED.search(page.locator("main > span.muted").inner_text())
        shown = int(found.group(1)) if found else 0
        if shown >= made or time.monotonic() > deadline:
            return shown
        time.sleep(0.1)


def frame_rates(times_ms: list[float]) -> tuple[list[int], float]:
    """Frames in each whole second of the run, and the longest gap between two frames (ms)."""
    first = times_ms[0]
    seconds = [0] * int((times_ms[-1] - first) // 1000)
    for t in times_ms:
        second = int((t - first) // 1000)
        if second < len(seconds):
            seconds[second] += 1
    gaps = [b - a for a, b in itertools.pairwise(times_ms)]
    return seconds, max(gaps)


def run(workdir: Path) -> list[Report]:
    report = Report(
        f"Console feed in headless Chromium while the server commits {RATE}/s for {SECONDS} s "
        f"(namespace property updates from {THREADS} client threads), median of {RUNS} runs",
        ["commits/s reached", "commits shown / made", "median fps", "lowest 1-s fps", "longest frame (ms)"],
    )
    if chromium_path() is None:
        print("console feed: skipped, no Chromium on this machine")
        return []
    server = IsbreServer(workdir / "console").start()
    httpx.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["bench"]}).raise_for_status()
    results = []
    try:
        with chromium() as browser:
            for _ in range(RUNS):
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{server.url}/ui/#/feed")
                page.wait_for_selector("#connection.connection-live")
                page.evaluate(COUNT_FRAMES)
                made, reached = commit_steadily(server)
                shown = shown_after(page, made)
                seconds, longest = frame_rates(page.evaluate("window.frameTimes"))
                results.append((reached, shown, made, statistics.median(seconds), min(seconds), longest))
                page.close()
    finally:
        server.stop()
    median = lambda i: statistics.median(r[i] for r in results)  # noqa: E731
    report.add(median(0), f"{min(r[1] for r in results)} / {results[0][2]}", median(3), median(4), median(5))
    return [report]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="isbre-bench-") as directory:
        for found in run(Path(directory)):
            print(found.markdown(), end="\n\n")
