"""Which store a location names: a PostgreSQL URL, or an LMDB directory."""

from __future__ import annotations

import os
from pathlib import Path

from isbre.catalog.file_uris import file_uri
from isbre.catalog.lmdb_store import LmdbStore
from isbre.catalog.store import Store


def is_database_url(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://", "postgresql+psycopg://"))


def open_store(
    location: str | Path, map_size: int = 256 << 20, warehouses: tuple[str, ...] = (), migrate: bool = True
) -> Store:
    """`location`: postgresql://… (shared by several servers) or an LMDB directory (one host);
    `warehouses`: the scopes, besides the first, that this process will use; `migrate`: bring a
    database's schema up to date (a server's helpers leave that to the server)."""
    if isinstance(location, str) and is_database_url(location):
        # Imported here: an embedded catalog never loads SQLAlchemy and the driver.
        from isbre.catalog.postgres.store import PostgresStore

        return PostgresStore(location, migrate=migrate, warehouses=warehouses)
    return LmdbStore(Path(location).resolve(), map_size=map_size, warehouses=warehouses)


def store_files(store: Store) -> tuple[str, ...]:
    """Locations no table may take: the store's own files, when it has any."""
    where = store.local_dir()
    return () if where is None else (file_uri(where),)


# A helper process (the events fan-out, the lineage worker) learns its store from the environment:
# a database URL may hold a password, which a command line shows to every user of the machine.
HELPER_STORE_ENV = "ISBRE_HELPER_STORE"


def helper_environment(location: str, **more: str) -> dict[str, str]:
    return {**os.environ, HELPER_STORE_ENV: location, **more}


def helper_store() -> str:
    """In a helper process: the store it follows."""
    return os.environ.pop(HELPER_STORE_ENV)
