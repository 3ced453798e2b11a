"""A lease is a session advisory lock held on a connection of its own."""

from __future__ import annotations

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
        self._connection.close()
