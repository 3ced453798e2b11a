"""The one way the tests wait for something another process or thread does: ask again until it
holds, and fail naming what never happened (and the last answer), never sleep and hope."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _asked(check: Callable[[], T], what: str, timeout: float, deadline: float) -> tuple[bool, T]:
    """`check()`'s answer and whether it holds; fails naming `what` once past `deadline`."""
    answer = check()
    if not answer and time.monotonic() > deadline:
        raise AssertionError(f"after {timeout} s: {what} (last answer: {answer!r})")
    return bool(answer), answer


def eventually(check: Callable[[], T], what: str, timeout: float = 30.0, every: float = 0.05) -> T:
    """`check()`'s first truthy answer, asked every `every` seconds for up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (asked := _asked(check, what, timeout, deadline))[0]:
        time.sleep(every)
    return asked[1]


async def until(check: Callable[[], T], what: str, timeout: float = 30.0, every: float = 0.005) -> T:
    """`eventually` on an event loop: the loop runs on while it waits."""
    deadline = time.monotonic() + timeout
    while not (asked := _asked(check, what, timeout, deadline))[0]:
        await asyncio.sleep(every)
    return asked[1]
