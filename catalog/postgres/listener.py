"""Commit notifications: one LISTEN connection per store."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg
from isbre.catalog.postgres.failures import first_line
from isbre.catalog.postgres.schema import CHANNEL, CONNECT_ARGS
from psycopg.conninfo import make_conninfo

log = logging.getLogger(__name__)


class Listener:
    """One LISTEN connection per store, calling back on each commit notification of another store
    (its own commits it already knows of: their notifications would only wake its readers to read
    what they have). After losing its connection it calls back once it is listening again:
    notifications sent meanwhile are gone."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._callbacks: list[Callable[[int | None], None]] = []
        self._own: set[int] = set()  # high-waters this store is notifying of
        self._own_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="isbre-store-listener", daemon=True)
        self._thread.start()

    def add(self, callback: Callable[[int | None], None]) -> None:
        self._callbacks.append(callback)

    def sending(self, commit_seq: int) -> None:
        """This store's transaction notifies of `commit_seq`: skip that notification."""
        with self._own_lock:
            self._own.add(commit_seq)

    def not_sent(self, commit_seq: int) -> None:
        """The transaction that was to notify of `commit_seq` did not commit."""
        with self._own_lock:
            self._own.discard(commit_seq)

    def _heard(self, commit_seq: int) -> None:
        with self._own_lock:
            if commit_seq in self._own:
                self._own.discard(commit_seq)
                return
        self._fire(commit_seq)

    def _fire(self, commit_seq: int | None) -> None:
        for callback in list(self._callbacks):
            try:
                callback(commit_seq)
            except Exception:
                log.exception("commit callback %r failed", callback)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    make_conninfo(self._conninfo, **CONNECT_ARGS), autocommit=True
                ) as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    self._fire(None)  # whatever was sent while not listening is lost: look
                    while not self._stop.is_set():
                        for notice in connection.notifies(timeout=0.5, stop_after=1):
                            self._heard(int(notice.payload))
            except psycopg.Error as error:
                if not self._stop.is_set():
                    log.warning("commit notifications interrupted (%s); listening again", first_line(error))
                    self._stop.wait(0.5)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
