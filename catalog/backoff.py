"""How long to wait before trying again: delays that double from a first one up to a cap.

Two users: a helper process that keeps dying is restarted ever more slowly (and one that ran for
longer than the cap counts as healthy again), and a relay whose broker refuses waits longer before
each try until one succeeds. Both reset on health, which tenacity's per-call retries (the commit
loop's, catalog/table_commit.py) have no notion of.
"""

from __future__ import annotations


class Backoff:
    def __init__(self, first_s: float, most_s: float) -> None:
        if not 0 < first_s <= most_s:
            raise ValueError(f"a backoff needs 0 < first_s <= most_s, not {first_s} and {most_s}")
        self.first_s = first_s
        self.most_s = most_s
        self._bound = first_s

    def next(self) -> float:
        """The next delay; the one after it is twice as long, up to the cap."""
        delay = self._bound
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
