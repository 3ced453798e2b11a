"""A lease is a session advisory lock held on a connection of its own."""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
from isbre.catalog.store import (
    Lease,
)


class SessionLease(Lease):
    """A session-level advisory lock on a connection of its own: PostgreSQL releases it when the
    connection ends, so a holder that dies (or loses the database) frees it within seconds."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection

    def held(self) -> bool:
        try:
            self._connection.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def release(self) -> None:
        """Unlocked before the connection closes: a backend lets go of its locks only as it ends,
        after the client has closed, and a holder taking the lease at once was refused."""
        with contextlib.suppress(psycopg.Error):  # a connection already lost holds nothing
            self._connection.execute("SELECT pg_advisory_unlock_all()")
        self._connection.close()
