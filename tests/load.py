"""Commit load for the tests that stop a server in the middle of it."""

from __future__ import annotations

import threading
from collections import Counter

import httpx


def commit_until_stopped(
    url: str,
    namespace: str,
    table: str,
    writer: str,
    acknowledged: list[str],
    stop: threading.Event,
    statuses: Counter[int] | None = None,
) -> None:
    """Set a new property per commit until `stop` or the connection fails; keep the keys answered 200."""
    with httpx.Client(timeout=30) as client:
        i = 0
        while not stop.is_set():
            key = f"{writer}-{i}"
            body = {"updates": [{"action": "set-properties", "updates": {key: "1"}}]}
            try:
                response = client.post(f"{url}/v1/isbre/namespaces/{namespace}/tables/{table}", json=body)
            except httpx.TransportError:
                return  # the server went away with this request in flight: it may or may not have landed
            if statuses is not None:
                statuses[response.status_code] += 1
            if response.status_code == 200:
                acknowledged.append(key)
            i += 1
