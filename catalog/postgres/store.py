"""The PostgreSQL store: connections, transactions, migration, leases and notifications."""

from __future__ import annotations

import contextlib
import logging
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from isbre.catalog.postgres.copy import export_entries
from isbre.catalog.postgres.failures import first_line, reachable
from isbre.catalog.postgres.leases import SessionLease
from isbre.catalog.postgres.listener import Listener
from isbre.catalog.postgres.schema import (
    CONNECT_ARGS,
    LEASES,
    NOTIFY,
    SCHEMA_VERSION,
    WRITER_LOCK,
    WRITER_LOCK_STATEMENT,
    meta,
    schema,
)
from isbre.catalog.postgres.view import PostgresView
from isbre.catalog.store import (
    FIRST_WAREHOUSE,
    Lease,
    ReadView,
    Store,
    StoreUnavailableError,
    WriteView,
)
from isbre.catalog.store_entries import Entry
from psycopg.conninfo import make_conninfo
from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    exc,
    func,
    make_url,
    select,
    update,
)

T = TypeVar("T")
log = logging.getLogger(__name__)


class PostgresStore(Store):
    def __init__(
        self, url: str, pool_size: int = 10, migrate: bool = True, warehouses: tuple[str, ...] = ()
    ) -> None:
        """`url`: postgresql://user:password@host:port/db (psycopg 3 is the driver); `migrate`: bring
        the schema up to date now (servers do, at start); `warehouses`: the scopes, besides the
        first, that this process will use."""
        self.opened_scopes = frozenset({FIRST_WAREHOUSE, *warehouses})
        address = make_url(url.replace("postgres://", "postgresql://", 1)).set(
            drivername="postgresql+psycopg"
        )
        self.url = address.render_as_string(hide_password=True)
        self._conninfo = address.set(drivername="postgresql").render_as_string(hide_password=False)
        # No pre-ping (a round trip before every transaction): a connection found dead fails its
        # request with 503, and SQLAlchemy then discards every connection of the pool made before.
        self.engine = create_engine(
            address, pool_size=pool_size, max_overflow=pool_size, connect_args=CONNECT_ARGS
        )
        # Reads: one snapshot, its isolation given in the BEGIN statement itself.
        self._reader = self.engine.execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True
        )
        # Reads that need no snapshot: no BEGIN, no ROLLBACK.
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self._listener: Listener | None = None
        self._listener_lock = threading.Lock()
        if migrate:
            self.migrate()

    def schema_version(self) -> int | None:
        """The schema the database has (None: no isbre tables yet)."""
        with reachable(), self.engine.connect() as connection:
            if not connection.dialect.has_table(connection, meta.name):
                return None
            found = connection.scalar(select(meta.c.value).where(meta.c.key == "schema_version"))
        return None if found is None else int(found)

    def migrate(self) -> int:
        """Bring the schema to SCHEMA_VERSION (one migrator at a time); returns the version."""
        with reachable(), self.engine.begin() as connection:
            connection.execute(select(func.pg_advisory_xact_lock(WRITER_LOCK)))
            schema.create_all(connection)  # version 1: the tables, where missing
            found = connection.scalar(select(meta.c.value).where(meta.c.key == "schema_version"))
            if found is None:
                connection.execute(meta.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
                # A new store indexes every location it is given: nothing to index later.
                connection.execute(meta.insert().values(key="marker:locations", value=""))
            elif int(found) > SCHEMA_VERSION:
                raise RuntimeError(f"the store has schema {found}; this isbre knows up to {SCHEMA_VERSION}")
            else:
                connection.execute(
                    update(meta).where(meta.c.key == "schema_version").values(value=str(SCHEMA_VERSION))
                )
        return SCHEMA_VERSION

    @contextmanager
    def _connection(self, engine: Engine) -> Iterator[Connection]:
        """A pooled connection; any failure once it was lost is StoreUnavailableError (SQLAlchemy
        reports some of them as a transaction to roll back first)."""
        with reachable(), engine.connect() as connection:
            try:
                yield connection
            except exc.SQLAlchemyError as error:
                if connection.invalidated:
                    raise StoreUnavailableError(f"lost the catalog database: {first_line(error)}") from error
                raise

    @contextmanager
    def read(self, warehouse: str = "", snapshot: bool = True) -> Iterator[ReadView]:
        with self._connection(self._reader if snapshot else self._autocommit) as connection:
            try:
                yield PostgresView(connection, self.opened_scopes, warehouse)
            finally:
                connection.rollback()

    @contextmanager
    def write(self) -> Iterator[PostgresView]:
        listener, notified = self._listener, None
        try:
            with self._connection(self.engine) as connection:
                transaction = connection.begin()
                try:
                    connection.execute(WRITER_LOCK_STATEMENT)
                    view = PostgresView(connection, self.opened_scopes)
                    yield view
                    if view.txn.appended:
                        view.set_high_water(view.txn.appended[-1])
                    view.txn.flush(connection)
                    if view.txn.appended:
                        notified = view.txn.appended[-1]
                        if listener is not None:
                            listener.sending(notified)
                        # Delivered to listeners when, and only if, the transaction commits.
                        connection.execute(NOTIFY, {"commit_seq": str(notified)})
                except BaseException:
                    with contextlib.suppress(exc.SQLAlchemyError):  # lost: the database rolls it back
                        transaction.rollback()
                    raise  # before its end: nothing of it was committed
                try:
                    transaction.commit()
                except (exc.OperationalError, exc.InterfaceError) as error:
                    # Lost as it ended: the database may have committed it before the answer was lost.
                    raise StoreUnavailableError(
                        f"lost the catalog database as a transaction ended: {first_line(error)}",
                        maybe_committed=True,
                    ) from error
        except BaseException:
            if listener is not None and notified is not None:
                listener.not_sent(notified)
            raise

    def on_commit(self, callback: Callable[[int | None], None]) -> bool:
        with self._listener_lock:
            if self._listener is None:
                self._listener = Listener(self._conninfo)
        self._listener.add(callback)
        return True

    def try_lease(self, name: str) -> Lease | None:
        try:
            connection = psycopg.connect(make_conninfo(self._conninfo, **CONNECT_ARGS), autocommit=True)
        except psycopg.Error as error:
            raise StoreUnavailableError(f"cannot take the {name} lease: {first_line(error)}") from error
        found = connection.execute(
            "SELECT pg_try_advisory_lock(%s, %s)", (LEASES, zlib.crc32(name.encode()) & 0x7FFFFFFF)
        ).fetchone()
        if found is None or not found[0]:
            connection.close()
            return None
        return SessionLease(connection)

    def export(self) -> Iterator[Entry]:
        with self.read() as view:
            assert isinstance(view, PostgresView)
            yield from export_entries(view)

    def describe(self) -> dict[str, Any]:
        pool: Any = self.engine.pool  # a QueuePool (create_engine's pool_size and max_overflow)
        connections = {
            "size": pool.size(),
            "in_use": pool.checkedout(),
            "idle": pool.checkedin(),
            "overflow": max(0, pool.overflow()),
        }
        return {"kind": "postgresql", "url": self.url, "connections": connections}

    def transact(self, work: Callable[[WriteView], T]) -> T:
        with self.write() as view:
            return work(view)

    def capacity(self) -> int:
        with self.engine.connect() as connection:
            return int(connection.scalar(select(func.pg_database_size(func.current_database()))) or 0)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self.engine.dispose()
