"""A bounded map that forgets its least recently used entry first, safe to share between threads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


def _one(_: object) -> int:
    return 1


class Lru(Generic[K, V]):
    def __init__(self, capacity: int, weigh: Callable[[V], int] = _one) -> None:
        """`capacity`: the most the entries may weigh together (by default each weighs 1: a count)."""
        self._capacity = capacity
        self._weigh = weigh
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    @property
    def weight(self) -> int:
        """What the entries weigh together."""
        return self._weight

    def peek(self, key: K) -> V | None:
        """The entry, or None."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V) -> None:
        weight = self._weigh(value)
        with self._lock:
            if (old := self._entries.pop(key, None)) is not None:
                self._weight -= old[1]
            if weight > self._capacity:
                return  # it would push out everything else and still not fit
            self._entries[key] = (value, weight)
            self._weight += weight
            while self._weight > self._capacity:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._weight -= dropped
