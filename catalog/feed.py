"""Commits made by other processes on the same store: noticed within milliseconds.

The writer tells its own process's followers about each batch it commits. A
commit made by another process on the store (an embedded catalog, a tool,
another server on a shared database) reaches no listener of this one, so a
thread here reads the store's high-water mark and, when it moved past
everything this process has seen, calls the followers that read the log
themselves. It reads when the store says something was committed (PostgreSQL's
NOTIFY; LMDB's data file written to, where Linux reports it: catalog/file_changes.py),
and every few milliseconds where the store cannot say.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from isbre.catalog.commit_log import CommitLog
from isbre.catalog.records import CommitRecord
from isbre.catalog.store import StoreUnavailableError

log = logging.getLogger(__name__)

# Followers hear of another process's commit within this many seconds where the store cannot tell.
POLL_S = 0.01
# Where it can, the high-water is read this often too, in case a notification was lost.
NOTIFIED_POLL_S = 1.0


class CommitFeed:
    def __init__(self, commit_log: CommitLog, interval: float = POLL_S) -> None:
        self._log = commit_log
        self._interval = interval
        self._seen = commit_log.commit_seq()
        self._followers: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._woken = threading.Event()
        self._thread = threading.Thread(target=self._run, name="isbre-commit-feed", daemon=True)
        commit_log.writer.add_listener(self._committed_here)
        if commit_log.store.on_commit(self._notified):
            self._interval = max(interval, NOTIFIED_POLL_S)

    def follow(self, follower: Callable[[], None]) -> None:
        """Call `follower()` (on the feed's thread) when another process has committed."""
        self._followers.append(follower)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._woken.set()
        self._log.writer.remove_listener(self._committed_here)
        if self._thread.is_alive():
            self._thread.join()

    def _notified(self, commit_seq: int | None) -> None:
        if commit_seq is None or commit_seq > self._seen:  # not a commit this process has seen
            self._woken.set()

    def _committed_here(self, records: list[CommitRecord]) -> None:
        self._seen = max(self._seen, records[-1].commit_seq)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._woken.wait(self._interval)
            self._woken.clear()
            if self._stop.is_set():
                return
            try:
                high = self._log.commit_seq()
            except StoreUnavailableError as exc:
                log.warning("cannot read the commit log's high-water (%s); trying again", exc)
                continue
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
