"""How long to wait before trying again: delays that double from a first one up to a cap.

Two users: a helper process that keeps dying is restarted ever more slowly (and one that ran for
longer than the cap counts as healthy again), and a commit that lost the race for its table's
pointer to another process waits a random part of its delay before staging again (full jitter, as
the Java reference's commit retries do), so that racing processes spread out instead of meeting
again at once.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, first_s: float, most_s: float, jitter: bool = False) -> None:
        if not 0 < first_s <= most_s:
            raise ValueError(f"a backoff needs 0 < first_s <= most_s, not {first_s} and {most_s}")
        self.first_s = first_s
        self.most_s = most_s
        self.jitter = jitter
        self._bound = first_s

    def next(self) -> float:
        """The next delay: the bound itself, or with jitter a random part of it; the bound doubles."""
        delay = random.uniform(0, self._bound) if self.jitter else self._bound
        self._bound = min(2 * self._bound, self.most_s)
        return delay

    def reset(self) -> None:
        self._bound = self.first_s

    def after_run(self, ran_s: float) -> float:
        """The delay before restarting something that ran `ran_s` seconds: from the first again
        when it ran longer than the cap (it was healthy), else the next one."""
        if ran_s > self.most_s:
            self.reset()
        return self.next()
