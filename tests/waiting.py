"""The one way the tests wait for something another process or thread does: ask again until it
holds, and fail naming what never happened (and the last answer), never sleep and hope."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def patience(seconds: float) -> float:
    """`seconds` stretched by how busy the machine is: what another process does takes longer
    when other work competes for the cores (a load average above one per core), and a test does
    not own the machine it runs on."""
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return seconds * max(1.0, per_core)


def _asked(check: Callable[[], T], what: str, timeout: float, started: float) -> tuple[bool, T]:
    """`check()`'s answer and whether it holds; fails naming `what` once `timeout` seconds (as
    `patience` stretches them) have passed since `started`."""
    answer = check()
    if not answer and (waited := time.monotonic() - started) > patience(timeout):
        raise AssertionError(f"after {waited:.1f} s: {what} (last answer: {answer!r})")
    return bool(answer), answer


def eventually(check: Callable[[], T], what: str, timeout: float = 30.0, every: float = 0.05) -> T:
    """`check()`'s first truthy answer, asked every `every` seconds for up to `timeout` seconds
    (on a busy machine, longer: `patience`)."""
    started = time.monotonic()
    while not (asked := _asked(check, what, timeout, started))[0]:
        time.sleep(every)
    return asked[1]


async def until(check: Callable[[], T], what: str, timeout: float = 30.0, every: float = 0.005) -> T:
    """`eventually` on an event loop: the loop runs on while it waits."""
    started = time.monotonic()
    while not (asked := _asked(check, what, timeout, started))[0]:
        await asyncio.sleep(every)
    return asked[1]
