"""A bounded map that forgets its least recently used entry first, safe to share between threads:
cachetools' LRU cache (weights by `getsizeof`) behind a lock, as cachetools leaves locking to its
user."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from cachetools import LRUCache

K = TypeVar("K")
V = TypeVar("V")


def _one(_: object) -> int:
    return 1


class Lru(Generic[K, V]):
    def __init__(self, capacity: int, weigh: Callable[[V], int] = _one) -> None:
        """`capacity`: the most the entries may weigh together (by default each weighs 1: a count)."""
        self._entries: LRUCache[K, V] = LRUCache(capacity, getsizeof=weigh)
        self._lock = threading.Lock()

    @property
    def weight(self) -> int:
        """What the entries weigh together."""
        return int(self._entries.currsize)

    def peek(self, key: K) -> V | None:
        """The entry, or None (it becomes the most recently used)."""
        with self._lock:
            return self._entries.get(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            try:
                self._entries[key] = value
            except ValueError:  # heavier than the whole capacity: it would not fit alone
                self._entries.pop(key, None)
