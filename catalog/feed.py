"""Commits made by other processes on the same store: noticed within milliseconds.

The writer tells its own process's followers about each batch it commits. A
commit made by another process on the store (an embedded catalog, a tool)
reaches no listener of this one, so a thread here reads the store's
high-water mark every few milliseconds (one key in a read transaction) and,
when it moved past everything this process has seen, calls the followers that
read the log themselves.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from catalog.records import CommitRecord
from catalog.service import CatalogService

log = logging.getLogger(__name__)

# Followers hear of another process's commit within this many seconds.
POLL_S = 0.01


class CommitFeed:
    def __init__(self, service: CatalogService, interval: float = POLL_S) -> None:
        self._service = service
        self._interval = interval
        self._seen = service.commit_seq()
        self._followers: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="isbre-commit-feed", daemon=True)
        service.writer.add_listener(self._committed_here)

    def follow(self, follower: Callable[[], None]) -> None:
        """Call `follower()` (on the feed's thread) when another process has committed."""
        self._followers.append(follower)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._service.writer.remove_listener(self._committed_here)
        if self._thread.is_alive():
            self._thread.join()

    def _committed_here(self, records: list[CommitRecord]) -> None:
        self._seen = max(self._seen, records[-1].commit_seq)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                high = self._service.commit_seq()
            except Exception:
                log.exception("cannot read the commit log's high-water; trying again")
                continue
            if high <= self._seen:
                continue
            self._seen = high
            for follower in list(self._followers):
                try:
                    follower()
                except Exception:
                    log.exception("commit follower %r failed", follower)
