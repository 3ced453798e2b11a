"""The catalog's state in PostgreSQL (SQLAlchemy Core over psycopg 3), for servers on several hosts.

Same semantics as the LMDB store. Every write transaction first takes one
transaction-scoped advisory lock, so write transactions run one at a time, as
LMDB's single writer does: `commit_seq` is assigned inside the lock and becomes
visible when the lock is released at commit, so a reader that has seen N never
later finds N-1 appear. Reads run in REPEATABLE READ snapshots. Keys of
namespaces and objects are the same bytes the LMDB store uses (`bytea`, which
PostgreSQL orders bytewise), and locations use the C collation, so listings and
prefix scans order exactly as in LMDB.

A write transaction that appended to the log sends a NOTIFY on commit; servers
LISTEN on one connection each and read the log when woken (see `on_commit`).
A connection that fails raises `StoreUnavailableError`: the caller answers 503,
and the pool replaces dead connections once the database is back.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

import psycopg
from isbre.catalog.coverage import Coverage, Range, Span, SpanKey, merge
from isbre.catalog.identifiers import (
    Identifier,
    children_prefix,
    direct_children,
    namespace_key,
    objects_prefix,
)
from isbre.catalog.records import CommitRecord
from isbre.catalog.store import Entry, Lease, Pointer, ReadView, Store, StoreUnavailableError, WriteView
from psycopg.conninfo import make_conninfo
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Index,
    LargeBinary,
    MetaData,
    Table,
    Text,
    and_,
    bindparam,
    create_engine,
    delete,
    exc,
    func,
    make_url,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import insert

log = logging.getLogger(__name__)

# pg_advisory_xact_lock key of the one writer at a time ("isbre" in ASCII).
WRITER_LOCK = 0x6973627265
SCHEMA_VERSION = 1
# Leases are advisory locks (LEASES, crc32 of the name): a key space apart from WRITER_LOCK's.
LEASES = 0x69736272
CHANNEL = "isbre_commits"  # NOTIFY channel of committed log appends
# A connection that cannot be made, or a peer that stops answering, fails within seconds (an answer
# then is a 503, not a request hanging on a dead database).
CONNECT_ARGS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 2,
}
# No byte of UTF-8 is 0xFF: `prefix <= key < prefix + END` is "key starts with prefix".
END = b"\xff"

schema = MetaData()
meta = Table(
    "isbre_meta", schema, Column("key", Text, primary_key=True), Column("value", Text, nullable=False)
)
namespaces = Table(
    "isbre_namespaces",
    schema,
    Column("warehouse", Text, primary_key=True),
    Column("key", LargeBinary, primary_key=True),
    Column("properties", Text, nullable=False),
)
pointers = Table(
    "isbre_pointers",
    schema,
    Column("warehouse", Text, primary_key=True),
    Column("kind", Text, primary_key=True),
    Column("key", LargeBinary, primary_key=True),
    Column("pointer", Text, nullable=False),
)
log_table = Table(
    "isbre_log",
    schema,
    Column("commit_seq", BigInteger, primary_key=True, autoincrement=False),
    Column("ts", BigInteger, nullable=False),
    Column("record", LargeBinary, nullable=False),
)
cursors_table = Table(
    "isbre_cursors",
    schema,
    Column("name", Text, primary_key=True),
    Column("commit_seq", BigInteger, nullable=False),
)
idempotency = Table(
    "isbre_idempotency",
    schema,
    Column("key", Text, primary_key=True),
    Column("response", Text, nullable=False),
    Column("ts", BigInteger, nullable=False),
    Index("isbre_idempotency_by_time", "ts"),
)
locations = Table(
    "isbre_locations",
    schema,
    Column("location", Text(collation="C"), primary_key=True),
    Column("owner", Text, nullable=False, unique=True),
)
ranges = Table(
    "isbre_coverage",
    schema,
    Column("table_uuid", Text, primary_key=True),
    Column("source_id", Text, primary_key=True),
    Column("topic", Text, primary_key=True),
    Column("partition", BigInteger, primary_key=True),
    Column("start_offset", BigInteger, primary_key=True),
    Column("end_offset", BigInteger, nullable=False),
)
coverage_commits = Table(
    "isbre_coverage_commits",
    schema,
    Column("table_uuid", Text, primary_key=True),
    Column("snapshot_id", BigInteger, primary_key=True),
    Column("commit_seq", BigInteger, nullable=False),
)


# The hot statements, built once: SQLAlchemy then finds their compiled form at once, where a
# statement built anew for each call costs more than the database's answer to it.
_LOCK = select(func.pg_advisory_xact_lock(WRITER_LOCK))
_NOTIFY = select(func.pg_notify(CHANNEL, bindparam("commit_seq")))
_HIGH_WATER = select(meta.c.value).where(meta.c.key == "commit_seq")
_POINTER = select(pointers.c.pointer).where(
    pointers.c.warehouse == bindparam("warehouse"),
    pointers.c.kind == bindparam("kind"),
    pointers.c.key == bindparam("key"),
)
_POINTERS = select(pointers.c.warehouse, pointers.c.kind, pointers.c.key, pointers.c.pointer).where(
    tuple_(pointers.c.warehouse, pointers.c.kind, pointers.c.key).in_(bindparam("keys", expanding=True))
)
_NAMESPACE = select(namespaces.c.properties).where(
    namespaces.c.warehouse == bindparam("warehouse"), namespaces.c.key == bindparam("key")
)
_IDEMPOTENT = select(idempotency.c.response).where(idempotency.c.key == bindparam("key"))


def _starts_with(column: Any, prefix: bytes) -> Any:
    return and_(column >= prefix, column < prefix + END)


class _PostgresView(WriteView):
    def __init__(self, connection: Connection, scope: str = "", txn: _Transaction | None = None) -> None:
        self._db = connection
        self._scope = scope
        self.txn = txn or _Transaction()  # shared by the transaction's scoped views and savepoints

    def scoped(self, warehouse: str) -> _PostgresView:
        return _PostgresView(self._db, warehouse, self.txn)

    # -- reads

    def namespace(self, namespace: tuple[str, ...]) -> dict[str, str] | None:
        found, row = self.txn.overlaid(namespaces, self._scope, namespace_key(namespace))
        if found:
            return None if row is None else json.loads(row["properties"])
        raw = self._db.scalar(_NAMESPACE, {"warehouse": self._scope, "key": namespace_key(namespace)})
        return None if raw is None else json.loads(raw)

    def namespaces(
        self, parent: tuple[str, ...], after: tuple[str, ...] | None, limit: int | None
    ) -> list[tuple[str, ...]]:
        prefix = children_prefix(parent)
        query = select(namespaces.c.key).where(
            namespaces.c.warehouse == self._scope, _starts_with(namespaces.c.key, prefix)
        )
        if after:
            query = query.where(namespaces.c.key > namespace_key(after))
        keys = (key for (key,) in self._sql().execute(query.order_by(namespaces.c.key)))
        return direct_children(keys, parent, limit)

    def is_empty(self, namespace: tuple[str, ...]) -> bool:
        objects = select(pointers.c.key).where(
            pointers.c.warehouse == self._scope, _starts_with(pointers.c.key, objects_prefix(namespace))
        )
        children = select(namespaces.c.key).where(
            namespaces.c.warehouse == self._scope,
            _starts_with(namespaces.c.key, children_prefix(namespace)),
        )
        return self._sql().scalar(objects.limit(1)) is None and self._sql().scalar(children.limit(1)) is None

    def prefetch(self, kind: str, idents: list[tuple[str, Identifier]]) -> None:
        wanted = [(scope, kind, ident.key) for scope, ident in idents]
        wanted = [key for key in wanted if not self.txn.overlaid(pointers, *key)[0]]
        if not wanted:
            return
        found = {
            (w, k, key): pointer for w, k, key, pointer in self._sql().execute(_POINTERS, {"keys": wanted})
        }
        for key in wanted:  # what the database holds now: kept in the overlay, but never sent
            row = found.get(key)
            self.txn.overlay[(pointers.name, *key)] = (
                None if row is None else {"warehouse": key[0], "kind": key[1], "key": key[2], "pointer": row}
            )

    def pointer(self, kind: str, ident: Identifier) -> Pointer | None:
        found, row = self.txn.overlaid(pointers, self._scope, kind, ident.key)
        if found:
            return None if row is None else Pointer.from_json(row["pointer"].encode())
        raw = self._db.scalar(_POINTER, {"warehouse": self._scope, "kind": kind, "key": ident.key})
        return None if raw is None else Pointer.from_json(raw.encode())

    def identifiers(
        self, kind: str, namespace: tuple[str, ...], after: str | None, limit: int | None
    ) -> list[Identifier]:
        prefix = objects_prefix(namespace)
        query = select(pointers.c.key).where(
            pointers.c.warehouse == self._scope, pointers.c.kind == kind, _starts_with(pointers.c.key, prefix)
        )
        if after is not None:
            query = query.where(pointers.c.key > prefix + after.encode())
        query = query.order_by(pointers.c.key)
        if limit is not None:
            query = query.limit(limit)
        return [Identifier.from_key(key) for (key,) in self._sql().execute(query)]

    def commit_seq(self) -> int:
        if self.txn.appended:
            return self.txn.appended[-1]
        if self.txn.high_water is None:
            # Read once: a read runs in one snapshot, a write holds the writer lock.
            raw = self._db.scalar(_HIGH_WATER)
            self.txn.high_water = 0 if raw is None else int(raw)
        return self.txn.high_water

    def records(self, after: int, limit: int) -> list[CommitRecord]:
        query = (
            select(log_table.c.record)
            .where(log_table.c.commit_seq > after)
            .order_by(log_table.c.commit_seq)
            .limit(limit)
        )
        return [CommitRecord.from_json(raw) for (raw,) in self._sql().execute(query)]

    def cursors(self) -> dict[str, int]:
        rows = self._sql().execute(select(cursors_table.c.name, cursors_table.c.commit_seq))
        return {name: commit_seq for name, commit_seq in rows}

    def idempotent_response(self, key: str) -> dict[str, Any] | None:
        found, row = self.txn.overlaid(idempotency, key)
        if found:
            return None if row is None else json.loads(row["response"])
        raw = self._db.scalar(_IDEMPOTENT, {"key": key})
        return None if raw is None else json.loads(raw)

    def overlapping(self, location: str) -> list[tuple[str, str]]:
        above = [location[:end] for end, ch in enumerate(location) if ch == "/"]
        exact = select(locations.c.location, locations.c.owner).where(
            locations.c.location.in_([*above, location])
        )
        found = sorted(
            ((loc, owner) for loc, owner in self._sql().execute(exact)), key=lambda row: len(row[0])
        )
        # "/" is 0x2F and "0" 0x30: in the C collation, the locations under `location/` sort between.
        under = (
            select(locations.c.location, locations.c.owner)
            .where(locations.c.location > location + "/", locations.c.location < location + "0")
            .order_by(locations.c.location)
            .limit(16)
        )
        return found + [(loc, owner) for loc, owner in self._sql().execute(under)]

    def marker(self, name: str) -> bool:
        return self._sql().scalar(select(meta.c.key).where(meta.c.key == f"marker:{name}")) is not None

    def log_floor(self) -> int:
        lowest = self._sql().scalar(select(func.min(log_table.c.commit_seq)))
        return self.commit_seq() + 1 if lowest is None else int(lowest)

    def coverage(self, table_uuid: str) -> Coverage:
        found: dict[SpanKey, list[Range]] = {}
        query = select(
            ranges.c.source_id, ranges.c.topic, ranges.c.partition, ranges.c.start_offset, ranges.c.end_offset
        ).where(ranges.c.table_uuid == table_uuid)
        for source_id, topic, partition, start, end in self._sql().execute(query):
            found.setdefault(SpanKey(source_id, topic, partition), []).append((start, end))
        return Coverage(found)

    def coverage_commit(self, table_uuid: str, snapshot_id: int) -> int | None:
        return self._sql().scalar(
            select(coverage_commits.c.commit_seq).where(
                coverage_commits.c.table_uuid == table_uuid, coverage_commits.c.snapshot_id == snapshot_id
            )
        )

    # -- writes

    @property
    def connection(self) -> Connection:
        return self._db

    def set_high_water(self, commit_seq: int) -> None:
        self._upsert(meta, key="commit_seq", value=str(commit_seq))

    def _upsert(self, table: Table, **row: Any) -> None:
        self.txn.buffer(table, row)

    def _sql(self) -> Connection:
        """The connection, once every buffered write has been sent (for any statement other than
        a lookup by key, which the buffer answers itself)."""
        self.txn.flush(self._db)
        return self._db

    def put_namespace(self, namespace: tuple[str, ...], properties: dict[str, str]) -> None:
        self._upsert(
            namespaces,
            warehouse=self._scope,
            key=namespace_key(namespace),
            properties=json.dumps(properties),
        )

    def delete_namespace(self, namespace: tuple[str, ...]) -> None:
        self.txn.buffer(namespaces, {"warehouse": self._scope, "key": namespace_key(namespace)}, delete=True)

    def put_pointer(self, kind: str, ident: Identifier, pointer: Pointer) -> None:
        self._upsert(
            pointers,
            warehouse=self._scope,
            kind=kind,
            key=ident.key,
            pointer=pointer.to_json().decode(),
        )

    def delete_pointer(self, kind: str, ident: Identifier) -> None:
        row = {"warehouse": self._scope, "kind": kind, "key": ident.key}
        self.txn.buffer(pointers, row, delete=True)

    def append(self, record: CommitRecord) -> None:
        if record.commit_seq != self.commit_seq() + 1:
            raise AssertionError(f"commit_seq {record.commit_seq} does not follow {self.commit_seq()}")
        self.txn.buffer(
            log_table, {"commit_seq": record.commit_seq, "ts": record.ts, "record": record.to_json()}
        )
        self.txn.appended.append(record.commit_seq)  # the high-water is stored once, at commit

    def put_cursor(self, name: str, commit_seq: int) -> None:
        self._upsert(cursors_table, name=name, commit_seq=commit_seq)

    def add_coverage(
        self, table_uuid: str, spans: list[Span], snapshot_id: int | None, commit_seq: int
    ) -> None:
        if snapshot_id is not None:
            self._upsert(
                coverage_commits,
                table_uuid=table_uuid,
                snapshot_id=snapshot_id,
                commit_seq=commit_seq,
            )
        by_stream: dict[SpanKey, list[Range]] = {}
        for span in spans:
            by_stream.setdefault(span.key, []).append((span.start, span.end))
        for key, added in by_stream.items():
            stream = and_(
                ranges.c.table_uuid == table_uuid,
                ranges.c.source_id == key.source_id,
                ranges.c.topic == key.topic,
                ranges.c.partition == key.partition,
            )
            existing = list(
                self._sql().execute(select(ranges.c.start_offset, ranges.c.end_offset).where(stream))
            )
            merged = merge([*(tuple(r) for r in existing), *added])
            self._sql().execute(delete(ranges).where(stream))
            self._sql().execute(
                ranges.insert(),
                [
                    {
                        "table_uuid": table_uuid,
                        "source_id": key.source_id,
                        "topic": key.topic,
                        "partition": key.partition,
                        "start_offset": start,
                        "end_offset": end,
                    }
                    for start, end in merged
                ],
            )

    def drop_coverage(self, table_uuid: str) -> None:
        self._sql().execute(delete(ranges).where(ranges.c.table_uuid == table_uuid))
        self._sql().execute(delete(coverage_commits).where(coverage_commits.c.table_uuid == table_uuid))

    def put_idempotent_response(self, key: str, response: dict[str, Any]) -> None:
        self._upsert(idempotency, key=key, response=json.dumps(response), ts=response["ts"])

    def trim_idempotency(self, older_than_us: int, limit: int) -> int:
        oldest = (
            select(idempotency.c.key)
            .where(idempotency.c.ts < older_than_us)
            .order_by(idempotency.c.ts)
            .limit(limit)
            .scalar_subquery()
        )
        return self._sql().execute(delete(idempotency).where(idempotency.c.key.in_(oldest))).rowcount

    def place(self, owner: str, location: str) -> None:
        self.unplace(owner)
        self._upsert(locations, location=location, owner=owner)

    def unplace(self, owner: str) -> None:
        self._sql().execute(delete(locations).where(locations.c.owner == owner))

    def set_marker(self, name: str) -> None:
        self._upsert(meta, key=f"marker:{name}", value="")

    def trim_log(self, keep_after: int, older_than_us: int, ceiling: int, limit: int) -> int:
        oldest = (
            self._sql()
            .execute(
                select(log_table.c.commit_seq, log_table.c.ts)
                .where(log_table.c.commit_seq <= ceiling)
                .order_by(log_table.c.commit_seq)
                .limit(limit)
            )
            .all()
        )
        last = None
        for seq, ts in oldest:
            if seq > keep_after and ts >= older_than_us:
                break
            last = seq
        if last is None:
            return 0
        return self._sql().execute(delete(log_table).where(log_table.c.commit_seq <= last)).rowcount

    @contextmanager
    def savepoint(self) -> Iterator[WriteView]:
        with self.txn.savepoint(self._db):
            yield _PostgresView(self._db, self._scope, self.txn)


_MISSING: Any = object()


@dataclass
class _Frame:
    """A savepoint: where the transaction's buffer and log stood when it began, and whether a
    SAVEPOINT was sent for it (only once something inside it had to reach the database)."""

    name: str
    ops: int
    undo: int
    appended: int
    sent: bool = False


@dataclass
class _Transaction:
    """A write transaction's buffer, shared by its views.

    Writes by key (pointers, namespaces, log records, idempotency keys, cursors, …) wait in
    `ops` and are answered from `overlay` until they are sent, together, in a few statements:
    before any statement that could see them (a listing, a range), and at commit. A mutation of a
    batch thus costs only its reads, and its savepoint costs nothing unless something inside it
    reached the database (a SAVEPOINT is then sent first). A lookup by key that misses the overlay
    goes to the database without sending the buffer: no buffered write touches that key.
    """

    high_water: int | None = None
    appended: list[int] = field(default_factory=list)
    ops: list[tuple[Table, dict[str, Any], bool]] = field(default_factory=list)  # (table, row, delete)
    sent: int = 0
    overlay: dict[tuple[Any, ...], dict[str, Any] | None] = field(default_factory=dict)
    undo: list[tuple[tuple[Any, ...], Any]] = field(default_factory=list)
    frames: list[_Frame] = field(default_factory=list)

    @staticmethod
    def _key(table: Table, row: dict[str, Any]) -> tuple[Any, ...]:
        return (table.name, *(row[column.name] for column in table.primary_key.columns))

    def buffer(self, table: Table, row: dict[str, Any], delete: bool = False) -> None:
        key = self._key(table, row)
        self.undo.append((key, self.overlay.get(key, _MISSING)))
        self.overlay[key] = None if delete else row
        self.ops.append((table, row, delete))

    def overlaid(self, table: Table, *key: Any) -> tuple[bool, dict[str, Any] | None]:
        found = self.overlay.get((table.name, *key), _MISSING)
        return (False, None) if found is _MISSING else (True, found)

    def flush(self, db: Connection) -> None:
        for frame in self.frames:
            if not frame.sent:
                self._send(db, frame.ops)  # what came before the savepoint goes before it
                db.exec_driver_sql(f"SAVEPOINT {frame.name}")
                frame.sent = True
        self._send(db, len(self.ops))

    def _send(self, db: Connection, until: int) -> None:
        pending, self.sent = self.ops[self.sent : until], max(self.sent, until)
        by_table: dict[Table, list[tuple[dict[str, Any], bool]]] = {}
        for table, row, deleting in pending:  # tables are independent: only each one's order matters
            by_table.setdefault(table, []).append((row, deleting))
        for table, changes in by_table.items():
            for deleting, run in groupby(changes, key=lambda change: change[1]):
                # Within a run of upserts (or deletes) of one table, the last write of a key wins.
                rows = list({self._key(table, row): row for row, _ in run}.values())
                db.execute(_delete_by_key(table) if deleting else _upsert_by_key(table), rows)

    @contextmanager
    def savepoint(self, db: Connection) -> Iterator[None]:
        frame = _Frame(f"isbre_{len(self.frames)}", len(self.ops), len(self.undo), len(self.appended))
        self.frames.append(frame)
        try:
            yield
        except BaseException:
            self.frames.pop()
            for key, previous in reversed(self.undo[frame.undo :]):
                if previous is _MISSING:
                    del self.overlay[key]
                else:
                    self.overlay[key] = previous
            del self.undo[frame.undo :], self.ops[frame.ops :], self.appended[frame.appended :]
            self.sent = min(self.sent, frame.ops)
            if frame.sent:
                db.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {frame.name}")
                db.exec_driver_sql(f"RELEASE SAVEPOINT {frame.name}")
            raise
        self.frames.pop()
        if frame.sent:
            db.exec_driver_sql(f"RELEASE SAVEPOINT {frame.name}")


@functools.cache
def _upsert_by_key(table: Table) -> Any:
    statement = insert(table)
    keys = [column.name for column in table.primary_key.columns]
    changed = {c.name: statement.excluded[c.name] for c in table.columns if c.name not in keys}
    if not changed:
        return statement.on_conflict_do_nothing(index_elements=keys)
    return statement.on_conflict_do_update(index_elements=keys, set_=changed)


@functools.cache
def _delete_by_key(table: Table) -> Any:
    return delete(table).where(
        and_(*(column == bindparam(column.name) for column in table.primary_key.columns))
    )


@contextmanager
def _reachable() -> Iterator[None]:
    """Connection failures as StoreUnavailableError; anything else as it is."""
    try:
        yield
    except (exc.OperationalError, exc.InterfaceError, exc.TimeoutError) as error:
        raise StoreUnavailableError(f"the catalog database is unavailable: {_first_line(error)}") from error
    except exc.DBAPIError as error:
        if not error.connection_invalidated:
            raise
        raise StoreUnavailableError(f"lost the catalog database: {_first_line(error)}") from error


def _first_line(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


class _Listener:
    """One LISTEN connection per store, calling back on each commit notification. After losing its
    connection it calls back once it is listening again: notifications sent meanwhile are gone."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._callbacks: list[Callable[[int | None], None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="isbre-store-listener", daemon=True)
        self._thread.start()

    def add(self, callback: Callable[[int | None], None]) -> None:
        self._callbacks.append(callback)

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
                            self._fire(int(notice.payload))
            except psycopg.Error as error:
                if not self._stop.is_set():
                    log.warning("commit notifications interrupted (%s); listening again", _first_line(error))
                    self._stop.wait(0.5)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class _SessionLease(Lease):
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


class PostgresStore(Store):
    def __init__(self, url: str, pool_size: int = 10, migrate: bool = True) -> None:
        """`url`: postgresql://user:password@host:port/db (psycopg 3 is the driver); `migrate`: bring
        the schema up to date now (servers do, at start)."""
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
        self._listener: _Listener | None = None
        self._listener_lock = threading.Lock()
        if migrate:
            self.migrate()

    def schema_version(self) -> int | None:
        """The schema the database has (None: no isbre tables yet)."""
        with _reachable(), self.engine.connect() as connection:
            if not connection.dialect.has_table(connection, meta.name):
                return None
            found = connection.scalar(select(meta.c.value).where(meta.c.key == "schema_version"))
        return None if found is None else int(found)

    def migrate(self) -> int:
        """Bring the schema to SCHEMA_VERSION (one migrator at a time); returns the version."""
        with _reachable(), self.engine.begin() as connection:
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
        with _reachable(), engine.connect() as connection:
            try:
                yield connection
            except exc.SQLAlchemyError as error:
                if connection.invalidated:
                    raise StoreUnavailableError(f"lost the catalog database: {_first_line(error)}") from error
                raise

    @contextmanager
    def read(self, warehouse: str = "", snapshot: bool = True) -> Iterator[ReadView]:
        with self._connection(self._reader if snapshot else self._autocommit) as connection:
            try:
                yield _PostgresView(connection, warehouse)
            finally:
                connection.rollback()

    @contextmanager
    def write(self) -> Iterator[_PostgresView]:
        with self._connection(self.engine) as connection, connection.begin():
            connection.execute(_LOCK)
            view = _PostgresView(connection)
            yield view
            if view.txn.appended:
                view.set_high_water(view.txn.appended[-1])
            view.txn.flush(connection)
            if view.txn.appended:
                # Delivered to listeners when, and only if, the transaction commits.
                connection.execute(_NOTIFY, {"commit_seq": str(view.txn.appended[-1])})

    def on_commit(self, callback: Callable[[int | None], None]) -> bool:
        with self._listener_lock:
            if self._listener is None:
                self._listener = _Listener(self._conninfo)
        self._listener.add(callback)
        return True

    def try_lease(self, name: str) -> Lease | None:
        try:
            connection = psycopg.connect(make_conninfo(self._conninfo, **CONNECT_ARGS), autocommit=True)
        except psycopg.Error as error:
            raise StoreUnavailableError(f"cannot take the {name} lease: {_first_line(error)}") from error
        found = connection.execute(
            "SELECT pg_try_advisory_lock(%s, %s)", (LEASES, zlib.crc32(name.encode()) & 0x7FFFFFFF)
        ).fetchone()
        if found is None or not found[0]:
            connection.close()
            return None
        return _SessionLease(connection)

    def describe(self) -> dict[str, Any]:
        pool: Any = self.engine.pool  # a QueuePool (create_engine's pool_size and max_overflow)
        connections = {
            "size": pool.size(),
            "in_use": pool.checkedout(),
            "idle": pool.checkedin(),
            "overflow": max(0, pool.overflow()),
        }
        return {"kind": "postgresql", "url": self.url, "connections": connections}

    def load(self, entries: Iterable[Entry]) -> Counter[str]:
        """Fill an empty store with `entries` (from `LmdbStore.export`), keeping every commit_seq, in
        one transaction: all of it lands, or nothing. Returns how many of each kind."""
        counts: Counter[str] = Counter()
        rows: dict[Table, list[dict[str, Any]]] = {}
        high = 0
        for entry in entries:
            counts[entry.kind] += 1
            values = entry.values
            match entry.kind:
                case "namespace":
                    scope, key, properties = values
                    row = {"warehouse": scope, "key": key, "properties": json.dumps(properties)}
                    rows.setdefault(namespaces, []).append(row)
                case "pointer":
                    scope, kind, key, pointer = values
                    row = {
                        "warehouse": scope,
                        "kind": kind,
                        "key": key,
                        "pointer": pointer.to_json().decode(),
                    }
                    rows.setdefault(pointers, []).append(row)
                case "record":
                    (record,) = values
                    row = {"commit_seq": record.commit_seq, "ts": record.ts, "record": record.to_json()}
                    rows.setdefault(log_table, []).append(row)
                case "high_water":
                    (high,) = values
                case "marker":
                    rows.setdefault(meta, []).append({"key": f"marker:{values[0]}", "value": ""})
                case "cursor":
                    rows.setdefault(cursors_table, []).append({"name": values[0], "commit_seq": values[1]})
                case "idempotency":
                    key, response = values
                    row = {"key": key, "response": json.dumps(response), "ts": response.get("ts", 0)}
                    rows.setdefault(idempotency, []).append(row)
                case "location":
                    rows.setdefault(locations, []).append({"owner": values[0], "location": values[1]})
                case "coverage":
                    table_uuid, stream, start, end = values
                    rows.setdefault(ranges, []).append(
                        {
                            "table_uuid": table_uuid,
                            "source_id": stream.source_id,
                            "topic": stream.topic,
                            "partition": stream.partition,
                            "start_offset": start,
                            "end_offset": end,
                        }
                    )
                case "coverage_commit":
                    row = {"table_uuid": values[0], "snapshot_id": values[1], "commit_seq": values[2]}
                    rows.setdefault(coverage_commits, []).append(row)
                case _:
                    raise ValueError(f"unknown entry kind {entry.kind!r}")
        with self.write() as view:
            if view.commit_seq() or view.scoped("").namespaces((), None, 1) or self._has_objects(view):
                raise ValueError(f"{self.url} already holds a catalog: copy only into an empty one")
            connection = view.connection
            connection.execute(delete(meta).where(meta.c.key.like("marker:%")))
            for table, found in rows.items():
                for start in range(0, len(found), 1000):
                    connection.execute(insert(table).on_conflict_do_nothing(), found[start : start + 1000])
            view.set_high_water(high)
        return counts

    @staticmethod
    def _has_objects(view: _PostgresView) -> bool:
        return view.connection.scalar(select(pointers.c.key).limit(1)) is not None

    def grow(self) -> None:
        """Nothing to grow: a PostgreSQL store never raises StoreFullError."""

    def capacity(self) -> int:
        with self.engine.connect() as connection:
            return int(connection.scalar(select(func.pg_database_size(func.current_database()))) or 0)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self.engine.dispose()
