"""The embedded store: one LMDB environment with a named database per kind of state."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import lmdb
from isbre.catalog.coverage import Coverage, Range, Span, SpanKey, merge
from isbre.catalog.file_changes import FileChanges, watch
from isbre.catalog.identifiers import (
    Identifier,
    children_prefix,
    direct_children,
    namespace_key,
    objects_prefix,
)
from isbre.catalog.records import CommitRecord
from isbre.catalog.sink_rows import SinkRows
from isbre.catalog.store import (
    FIRST_WAREHOUSE,
    InsufficientStorageError,
    Lease,
    Pointer,
    ReadView,
    Store,
    StoreGrowthError,
    WriteView,
    check_scope,
)
from isbre.catalog.store_copy import (
    CoverageCommitEntry,
    CoverageEntry,
    CursorEntry,
    Entry,
    HighWaterEntry,
    IdempotencyEntry,
    LocationEntry,
    MarkerEntry,
    NamespaceEntry,
    PointerEntry,
    RecordEntry,
    SinkRowsEntry,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

FORMAT_VERSION = b"1"
DATABASES = (
    "meta",
    "namespaces",
    "tables",
    "views",
    "commit_log",
    "coverage",
    "sink_rows",
    "cursors",
    "idempotency",
    "idempotency_by_time",
    "locations",
)
# A warehouse's own databases; the other ones (the log, locations, idempotency, …) are the store's.
# The first warehouse uses the unprefixed names, so a store made before warehouses had names still
# opens; another warehouse `w` has `w/namespaces`, `w/tables` and `w/views`.
PER_WAREHOUSE = ("namespaces", "tables", "views")
_SEQ = struct.Struct(">Q")
_HIGH_WATER = b"commit_seq"
_RANGE = struct.Struct(">QQ")


_SNAPSHOT = struct.Struct(">q")
# The locations database maps a normalized location to its owner's uuid, and `_OWNER + uuid` back to
# the location (a location, being a URI, never starts with NUL).
_OWNER = b"\x00"


# A table's coverage keys: `<uuid>\0S<source>\0<topic>\0<partition><start><end>` for ranges (the range
# lives in the key, so merging rewrites keys only) and `<uuid>\0C<snapshot id>` -> commit_seq for the
# commits that declared spans. NUL cannot occur in a uuid, a source id or a topic (spans are checked).
def _ranges_prefix(table_uuid: str) -> bytes:
    return table_uuid.encode() + b"\x00S"


def _stream_prefix(table_uuid: str, key: SpanKey) -> bytes:
    parts = (key.source_id.encode(), key.topic.encode(), _SEQ.pack(key.partition))
    return _ranges_prefix(table_uuid) + b"\x00".join(parts)


def _commit_key(table_uuid: str, snapshot_id: int) -> bytes:
    return table_uuid.encode() + b"\x00C" + _SNAPSHOT.pack(snapshot_id)


def _stream_key(raw: bytes) -> tuple[SpanKey, Range]:
    _, marked_source_id, topic, rest = raw.split(b"\x00", 3)
    key = SpanKey(marked_source_id[1:].decode(), topic.decode(), _SEQ.unpack(rest[: _SEQ.size])[0])
    return key, _RANGE.unpack(rest[_SEQ.size :])


def _bytes(value: bytes | memoryview) -> bytes:
    """What lmdb hands out: bytes, as the store never reads with buffers=True (lmdb's types also
    allow the memoryview that reading with buffers gives)."""
    assert isinstance(value, bytes)
    return value


def _after(cursor: lmdb.Cursor, prefix: bytes, after: bytes | None) -> Iterator[tuple[bytes, bytes]]:
    """Items whose key starts with `prefix`, strictly after `prefix + after`."""
    start = prefix + after if after is not None else prefix
    if not cursor.set_range(start):
        return
    for key, value in cursor:
        if not _bytes(key).startswith(prefix):
            return
        if after is not None and key == start:
            continue
        yield _bytes(key), _bytes(value)


class _FileLease(Lease):
    def __init__(self, descriptor: int) -> None:
        self._descriptor: int | None = descriptor

    def held(self) -> bool:
        return self._descriptor is not None

    def release(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)  # the lock goes with the descriptor
            self._descriptor = None


class MapFullError(Exception):
    """The map has no room left for this transaction: it is aborted; `LmdbStore.transact` grows
    the map and runs the transaction again."""


class _LmdbView(WriteView):
    def __init__(self, store: LmdbStore, txn: lmdb.Transaction, scope: str = FIRST_WAREHOUSE) -> None:
        self._store = store
        self._txn = txn
        self._scope = scope

    def _db(self, name: str) -> lmdb._Database:
        if self._scope and name in PER_WAREHOUSE:
            return self._store.dbs[f"{self._scope}/{name}"]
        return self._store.dbs[name]

    def scoped(self, warehouse: str) -> _LmdbView:
        check_scope(self._store.opened_scopes, warehouse)
        return _LmdbView(self._store, self._txn, warehouse)

    def namespace(self, namespace: tuple[str, ...]) -> dict[str, str] | None:
        raw = self._txn.get(namespace_key(namespace), db=self._db("namespaces"))
        return None if raw is None else json.loads(_bytes(raw))

    def namespaces(
        self, parent: tuple[str, ...], after: tuple[str, ...] | None, limit: int | None
    ) -> list[tuple[str, ...]]:
        prefix = children_prefix(parent)
        after_key = namespace_key(after)[len(prefix) :] if after else None
        with self._txn.cursor(db=self._db("namespaces")) as cursor:
            return direct_children((key for key, _ in _after(cursor, prefix, after_key)), parent, limit)

    def is_empty(self, namespace: tuple[str, ...]) -> bool:
        for db, prefix in (
            ("tables", objects_prefix(namespace)),
            ("views", objects_prefix(namespace)),
            ("namespaces", children_prefix(namespace)),
        ):
            with self._txn.cursor(db=self._db(db)) as cursor:
                if next(_after(cursor, prefix, None), None) is not None:
                    return False
        return True

    def pointer(self, kind: str, ident: Identifier) -> Pointer | None:
        raw = self._txn.get(ident.key, db=self._db(kind + "s"))
        return None if raw is None else Pointer.from_json(_bytes(raw))

    def identifiers(
        self, kind: str, namespace: tuple[str, ...], after: str | None, limit: int | None
    ) -> list[Identifier]:
        found: list[Identifier] = []
        with self._txn.cursor(db=self._db(kind + "s")) as cursor:
            after_key = after.encode() if after is not None else None
            for key, _ in _after(cursor, objects_prefix(namespace), after_key):
                found.append(Identifier.from_key(key))
                if limit is not None and len(found) >= limit:
                    break
        return found

    def commit_seq(self) -> int:
        raw = self._txn.get(_HIGH_WATER, db=self._db("meta"))
        return 0 if raw is None else _SEQ.unpack(raw)[0]

    def records(self, after: int, limit: int) -> list[CommitRecord]:
        found: list[CommitRecord] = []
        with self._txn.cursor(db=self._db("commit_log")) as cursor:
            if not cursor.set_range(_SEQ.pack(after + 1)):
                return found
            for _, value in cursor:
                found.append(CommitRecord.from_json(_bytes(value)))
                if len(found) >= limit:
                    break
        return found

    def cursors(self) -> dict[str, int]:
        with self._txn.cursor(db=self._db("cursors")) as cursor:
            return {_bytes(key).decode(): _SEQ.unpack(value)[0] for key, value in cursor}

    def idempotent_response(self, key: str) -> dict[str, Any] | None:
        raw = self._txn.get(key.encode(), db=self._db("idempotency"))
        return None if raw is None else json.loads(_bytes(raw))

    def overlapping(self, location: str) -> list[tuple[str, str]]:
        db = self._db("locations")
        found = []
        for end in (i for i, ch in enumerate(location) if ch == "/"):
            above = location[:end]
            if (owner := self._txn.get(above.encode(), db=db)) is not None:
                found.append((above, _bytes(owner).decode()))
        if (owner := self._txn.get(location.encode(), db=db)) is not None:
            found.append((location, _bytes(owner).decode()))
        with self._txn.cursor(db=db) as cursor:
            for key, owner in _after(cursor, (location + "/").encode(), None):
                found.append((key.decode(), owner.decode()))
                if len(found) >= 16:
                    break
        return found

    def marker(self, name: str) -> bool:
        return self._txn.get(b"marker:" + name.encode(), db=self._db("meta")) is not None

    def log_floor(self) -> int:
        with self._txn.cursor(db=self._db("commit_log")) as cursor:
            if cursor.first():
                return _SEQ.unpack(cursor.key())[0]
        return self.commit_seq() + 1

    def coverage(self, table_uuid: str) -> Coverage:
        # Keys are prefix + (start, end): a range lives in the key, so merging only rewrites keys.
        found: dict[SpanKey, list[Range]] = {}
        with self._txn.cursor(db=self._db("coverage")) as cursor:
            for raw, _ in _after(cursor, _ranges_prefix(table_uuid), None):
                key, covered = _stream_key(raw)
                found.setdefault(key, []).append(covered)
        return Coverage(found)

    def coverage_commit(self, table_uuid: str, snapshot_id: int) -> int | None:
        raw = self._txn.get(_commit_key(table_uuid, snapshot_id), db=self._db("coverage"))
        return None if raw is None else _SEQ.unpack(raw)[0]

    def sink_rows(self, table_uuid: str | None) -> list[SinkRows]:
        db = self._db("sink_rows")
        if table_uuid is not None:
            raw = self._txn.get(table_uuid.encode(), db=db)
            return [] if raw is None else [SinkRows.from_json(table_uuid, _bytes(raw))]
        with self._txn.cursor(db=db) as cursor:
            return [SinkRows.from_json(_bytes(key).decode(), _bytes(value)) for key, value in cursor]

    # -- writes: LMDB raises MapFullError from any of them when the map is full

    @contextmanager
    def _full_is_retryable(self) -> Iterator[None]:
        try:
            yield
        except lmdb.MapFullError as exc:
            self._store.map_was_full = True  # whoever catches this, `transact` runs the work again
            raise MapFullError(str(exc)) from exc

    def put_namespace(self, namespace: tuple[str, ...], properties: dict[str, str]) -> None:
        with self._full_is_retryable():
            self._txn.put(
                namespace_key(namespace), json.dumps(properties).encode(), db=self._db("namespaces")
            )

    def delete_namespace(self, namespace: tuple[str, ...]) -> None:
        self._txn.delete(namespace_key(namespace), db=self._db("namespaces"))

    def put_pointer(self, kind: str, ident: Identifier, pointer: Pointer) -> None:
        with self._full_is_retryable():
            self._txn.put(ident.key, pointer.to_json(), db=self._db(kind + "s"))

    def delete_pointer(self, kind: str, ident: Identifier) -> None:
        self._txn.delete(ident.key, db=self._db(kind + "s"))

    def append(self, record: CommitRecord) -> None:
        if record.commit_seq != self.commit_seq() + 1:
            raise AssertionError(f"commit_seq {record.commit_seq} does not follow {self.commit_seq()}")
        with self._full_is_retryable():
            seq = _SEQ.pack(record.commit_seq)
            self._txn.put(seq, record.to_json(), db=self._db("commit_log"), append=True)
            self._txn.put(_HIGH_WATER, seq, db=self._db("meta"))

    def put_cursor(self, name: str, commit_seq: int) -> None:
        with self._full_is_retryable():
            self._txn.put(name.encode(), _SEQ.pack(commit_seq), db=self._db("cursors"))

    def add_coverage(
        self, table_uuid: str, spans: list[Span], snapshot_id: int | None, commit_seq: int
    ) -> None:
        db = self._db("coverage")
        if snapshot_id is not None:
            with self._full_is_retryable():
                self._txn.put(_commit_key(table_uuid, snapshot_id), _SEQ.pack(commit_seq), db=db)
        by_stream: dict[SpanKey, list[Range]] = {}
        for span in spans:
            by_stream.setdefault(span.key, []).append((span.start, span.end))
        for key, added in by_stream.items():
            prefix = _stream_prefix(table_uuid, key)
            with self._txn.cursor(db=db) as cursor:
                existing = [_RANGE.unpack(raw[len(prefix) :]) for raw, _ in _after(cursor, prefix, None)]
            merged = merge([*existing, *added])
            with self._full_is_retryable():
                for covered in set(existing) - set(merged):
                    self._txn.delete(prefix + _RANGE.pack(*covered), db=db)
                for covered in set(merged) - set(existing):
                    self._txn.put(prefix + _RANGE.pack(*covered), b"", db=db)

    def drop_coverage(self, table_uuid: str) -> None:
        db = self._db("coverage")
        with self._txn.cursor(db=db) as cursor:
            doomed = [raw for raw, _ in _after(cursor, table_uuid.encode() + b"\x00", None)]
        for raw in doomed:
            self._txn.delete(raw, db=db)
        self._txn.delete(table_uuid.encode(), db=self._db("sink_rows"))

    def put_sink_rows(self, totals: SinkRows) -> None:
        with self._full_is_retryable():
            self._txn.put(totals.table_uuid.encode(), totals.to_json(), db=self._db("sink_rows"))

    def put_idempotent_response(self, key: str, response: dict[str, Any]) -> None:
        with self._full_is_retryable():
            self._txn.put(key.encode(), json.dumps(response).encode(), db=self._db("idempotency"))
            self._txn.put(_SEQ.pack(response["ts"]) + key.encode(), b"", db=self._db("idempotency_by_time"))

    def trim_idempotency(self, older_than_us: int, limit: int) -> int:
        """Reads only expired keys: the time index is ordered by when each key was stored."""
        removed = 0
        with self._txn.cursor(db=self._db("idempotency_by_time")) as cursor:
            positioned = cursor.first()
            while positioned and removed < limit:
                stamp = cursor.key()
                if _SEQ.unpack(stamp[: _SEQ.size])[0] >= older_than_us:
                    break
                self._txn.delete(stamp[_SEQ.size :], db=self._db("idempotency"))
                cursor.delete()
                removed += 1
                positioned = bool(cursor.key())
        return removed

    def place(self, owner: str, location: str) -> None:
        self.unplace(owner)
        db = self._db("locations")
        with self._full_is_retryable():
            self._txn.put(location.encode(), owner.encode(), db=db)
            self._txn.put(_OWNER + owner.encode(), location.encode(), db=db)

    def unplace(self, owner: str) -> None:
        db = self._db("locations")
        location = self._txn.get(_OWNER + owner.encode(), db=db)
        if location is not None:
            if self._txn.get(location, db=db) == owner.encode():
                self._txn.delete(location, db=db)
            self._txn.delete(_OWNER + owner.encode(), db=db)

    def set_marker(self, name: str) -> None:
        with self._full_is_retryable():
            self._txn.put(b"marker:" + name.encode(), b"", db=self._db("meta"))

    def clear_markers(self) -> None:
        db = self._db("meta")
        with self._txn.cursor(db=db) as cursor:
            markers = [
                key for key in map(_bytes, cursor.iternext(values=False)) if key.startswith(b"marker:")
            ]
        for key in markers:
            self._txn.delete(key, db=db)

    def set_high_water(self, commit_seq: int) -> None:
        with self._full_is_retryable():
            self._txn.put(_HIGH_WATER, _SEQ.pack(commit_seq), db=self._db("meta"))

    def holds_anything(self) -> bool:
        if self.commit_seq():
            return True
        return any(
            self._txn.stat(self._store.dbs[name])["entries"]
            for name in self._store.dbs
            if name.rsplit("/", 1)[-1] in PER_WAREHOUSE
        )

    def trim_log(self, keep_after: int, older_than_us: int, ceiling: int, limit: int) -> int:
        removed = 0
        with self._txn.cursor(db=self._db("commit_log")) as cursor:
            positioned = cursor.first()
            while positioned and removed < limit:
                seq = _SEQ.unpack(cursor.key())[0]
                if seq > ceiling:
                    break
                if seq > keep_after and CommitRecord.from_json(_bytes(cursor.value())).ts >= older_than_us:
                    break
                cursor.delete()  # moves to the next record, or off the end of the log
                removed += 1
                positioned = bool(cursor.key())
        return removed

    def prefetch(self, kind: str, idents: list[tuple[str, Identifier]]) -> None:
        pass  # a memory-mapped read is as fast as the hint

    @contextmanager
    def savepoint(self) -> Iterator[WriteView]:
        child = self._store.env.begin(write=True, parent=self._txn)
        try:
            yield _LmdbView(self._store, child, self._scope)
        except BaseException:
            child.abort()
            raise
        with self._full_is_retryable():
            child.commit()


class _ResizeGate:
    """LMDB may only be remapped while this process has no open transaction."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open = 0
        self._resizing = False

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._open += 1
        try:
            yield
        finally:
            with self._cond:
                self._open -= 1
                if not self._open:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            while self._open:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


def _index_idempotency_by_time(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> None:
    """Stores made before keys were indexed by time: index the keys they hold, once."""
    marker = b"marker:idempotency-by-time"
    if txn.get(marker, db=dbs["meta"]) is not None:
        return
    with txn.cursor(db=dbs["idempotency"]) as cursor:
        for key, value in cursor:
            txn.put(
                _SEQ.pack(json.loads(_bytes(value)).get("ts", 0)) + key, b"", db=dbs["idempotency_by_time"]
            )
    txn.put(marker, b"", db=dbs["meta"])


class LmdbStore(Store):
    reads_in_process = True

    def __init__(self, path: Path, map_size: int = 256 << 20, warehouses: tuple[str, ...] = ()) -> None:
        """`warehouses`: the scopes, besides the first (unnamed) one, that this process will use."""
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        names = [*DATABASES, *(f"{w}/{name}" for w in warehouses for name in PER_WAREHOUSE)]
        self.env = lmdb.open(
            str(path), map_size=map_size, max_dbs=len(names), subdir=True, sync=True, metasync=True
        )
        self._gate = _ResizeGate()
        self._listeners: list[Callable[[int | None], None]] = []
        self._listeners_lock = threading.Lock()
        self._changes: FileChanges | None = None
        self.map_was_full = False
        self.opened_scopes = frozenset({FIRST_WAREHOUSE, *warehouses})
        with self.env.begin(write=True) as txn:
            self.dbs = {name: self.env.open_db(name.encode(), txn=txn) for name in names}
            version = txn.get(b"format", db=self.dbs["meta"])
            if version is None:
                txn.put(b"format", FORMAT_VERSION, db=self.dbs["meta"])
                # A new store indexes every location it is given: nothing to index later.
                txn.put(b"marker:locations", b"", db=self.dbs["meta"])
            elif version != FORMAT_VERSION:
                raise RuntimeError(
                    f"{path} holds store format {version!r}; this isbre reads {FORMAT_VERSION!r}"
                )
            _index_idempotency_by_time(txn, self.dbs)

    @contextmanager
    def _begin(self, write: bool) -> Iterator[lmdb.Transaction]:
        while True:
            with self._gate.transaction():
                try:
                    txn = self.env.begin(write=write)
                except lmdb.MapResizedError:
                    pass  # another process grew the map; adopt its size below
                else:
                    try:
                        yield txn
                    except BaseException:
                        txn.abort()
                        raise
                    try:
                        txn.commit()
                    except lmdb.MapFullError as exc:
                        self.map_was_full = True
                        raise MapFullError(str(exc)) from exc
                    except lmdb.Error as exc:
                        if "No space left" in str(exc) or "quota" in str(exc).lower():
                            raise InsufficientStorageError(
                                f"No room left on the store's disk: {exc}"
                            ) from exc
                        raise
                    return
            with self._gate.exclusive():
                self.env.set_mapsize(0)

    @contextmanager
    def read(self, warehouse: str = "", snapshot: bool = True) -> Iterator[ReadView]:
        with self._begin(write=False) as txn:
            yield _LmdbView(self, txn).scoped(warehouse)

    @contextmanager
    def write(self) -> Iterator[WriteView]:
        """One attempt: a full map raises MapFullError (`transact` grows the map and runs again)."""
        with self._begin(write=True) as txn:
            yield _LmdbView(self, txn)

    def catch_up(self) -> None:
        # A writer killed while it synced its commit's meta page leaves the commit durable but
        # unannounced: LMDB publishes it (to readers) when the next writer takes the lock that the
        # dead one held. Taking the lock and letting it go is that next writer.
        with self._gate.transaction():
            self.env.begin(write=True).abort()

    def transact(self, work: Callable[[WriteView], T]) -> T:
        while True:
            self.map_was_full = False
            try:
                with self.write() as view:
                    result = work(view)
                    if self.map_was_full:  # `work` went on past a full map: its transaction is void
                        raise MapFullError("the LMDB map filled up during the transaction")
                return result
            except MapFullError:
                try:
                    self.grow()
                except Exception as exc:
                    log.error("the LMDB map is full and could not grow: %s", exc)
                    raise StoreGrowthError(f"the store is full and could not make room: {exc}") from exc

    def grow(self) -> None:
        """Double the map (every process of the store adopts the new size on its next transaction)."""
        with self._gate.exclusive():
            size = self.env.info()["map_size"] * 2
            log.warning("LMDB map is full; growing it to %d MiB", size >> 20)
            self.env.set_mapsize(size)

    def capacity(self) -> int:
        return self.env.info()["map_size"]

    def describe(self) -> dict[str, Any]:
        return {"kind": "lmdb", "path": str(self.path)}

    def local_dir(self) -> Path:
        return self.path

    def on_commit(self, callback: Callable[[int | None], None]) -> bool:
        """Where the system reports writes to the store's data file (Linux), `callback(None)` after
        any process's commits, this one's included (a write does not say whose it was)."""
        with self._listeners_lock:
            if self._changes is None:
                self._changes = watch(self.path / "data.mdb", self._written)
                if self._changes is None:
                    return False
            self._listeners.append(callback)
        return True

    def _written(self) -> None:
        for callback in list(self._listeners):
            callback(None)

    def try_lease(self, name: str) -> Lease | None:
        """A lock on a file beside the store: one holder among the processes of this host (the
        workers of one server each run what only one of them may)."""
        descriptor = os.open(self.path / f"lease-{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return None
        return _FileLease(descriptor)

    def scopes(self) -> list[str]:
        """Every warehouse scope the store holds ("" first), whether or not this process opened it."""
        with self.env.begin() as txn, txn.cursor() as cursor:
            named = [key.decode() for key, _ in cursor]
        return [
            "",
            *sorted(name.removesuffix("/namespaces") for name in named if name.endswith("/namespaces")),
        ]

    def export(self) -> Iterator[Entry]:
        with self.env.begin() as txn:
            for scope in self.scopes():
                for name in PER_WAREHOUSE:
                    db = self.env.open_db(f"{scope}/{name}".removeprefix("/").encode(), txn=txn, create=False)
                    for key, value in txn.cursor(db=db):
                        if name == "namespaces":
                            yield NamespaceEntry(scope, _bytes(key), json.loads(value))
                        else:
                            pointer = Pointer.from_json(_bytes(value))
                            yield PointerEntry(scope, name.removesuffix("s"), _bytes(key), pointer)
            for _, value in txn.cursor(db=self.dbs["commit_log"]):
                yield RecordEntry(CommitRecord.from_json(_bytes(value)))
            high = txn.get(_HIGH_WATER, db=self.dbs["meta"])
            yield HighWaterEntry(0 if high is None else _SEQ.unpack(high)[0])
            for key in txn.cursor(db=self.dbs["meta"]).iternext(values=False):
                if key.startswith(b"marker:"):
                    yield MarkerEntry(_bytes(key).removeprefix(b"marker:").decode())
            for key, value in txn.cursor(db=self.dbs["cursors"]):
                yield CursorEntry(_bytes(key).decode(), _SEQ.unpack(value)[0])
            for key, value in txn.cursor(db=self.dbs["idempotency"]):
                yield IdempotencyEntry(_bytes(key).decode(), json.loads(value))
            for key, value in txn.cursor(db=self.dbs["locations"]):
                if not key.startswith(_OWNER):
                    yield LocationEntry(_bytes(value).decode(), _bytes(key).decode())
            for key, value in txn.cursor(db=self.dbs["coverage"]):
                table_uuid, kind = _bytes(key).split(b"\x00", 1)
                if kind.startswith(b"C"):
                    snapshot = _SNAPSHOT.unpack(kind[1:])[0]
                    yield CoverageCommitEntry(table_uuid.decode(), snapshot, _SEQ.unpack(value)[0])
                else:
                    stream, (start, end) = _stream_key(_bytes(key))
                    yield CoverageEntry(table_uuid.decode(), stream, start, end)
            for key, value in txn.cursor(db=self.dbs["sink_rows"]):
                yield SinkRowsEntry(SinkRows.from_json(_bytes(key).decode(), _bytes(value)))

    def close(self) -> None:
        if self._changes is not None:
            self._changes.close()
        self.env.close()
