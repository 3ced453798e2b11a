"""A transaction on the embedded store, read or write: the `ReadView` / `WriteView` of LMDB."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Protocol

import lmdb
from isbre.catalog.coverage import Coverage, Range, Span, SpanKey, merge
from isbre.catalog.identifiers import (
    Identifier,
    children_prefix,
    direct_children,
    namespace_key,
    objects_prefix,
)
from isbre.catalog.lmdb_layout import (
    HIGH_WATER,
    OWNER,
    PER_WAREHOUSE,
    RANGE,
    SEQ,
    as_bytes,
    commit_key,
    keys_after,
    pending_file,
    pending_key,
    pending_value,
    ranges_prefix,
    stream_key,
    stream_prefix,
)
from isbre.catalog.records import CommitRecord
from isbre.catalog.sink_rows import SinkRows
from isbre.catalog.store import FIRST_WAREHOUSE, PendingFile, Pointer, WriteView, check_scope


class OpenEnvironment(Protocol):
    """What a view uses of the store that opened it (`LmdbStore`)."""

    env: lmdb.Environment
    dbs: dict[str, lmdb._Database]
    opened_scopes: frozenset[str]
    map_was_full: bool


class MapFullError(Exception):
    """The map has no room left for this transaction: it is aborted; `LmdbStore.transact` grows
    the map and runs the transaction again."""


class LmdbView(WriteView):
    def __init__(self, store: OpenEnvironment, txn: lmdb.Transaction, scope: str = FIRST_WAREHOUSE) -> None:
        self._store = store
        self._txn = txn
        self._scope = scope

    def _db(self, name: str) -> lmdb._Database:
        if self._scope and name in PER_WAREHOUSE:
            return self._store.dbs[f"{self._scope}/{name}"]
        return self._store.dbs[name]

    def scoped(self, warehouse: str) -> LmdbView:
        check_scope(self._store.opened_scopes, warehouse)
        return LmdbView(self._store, self._txn, warehouse)

    def namespace(self, namespace: tuple[str, ...]) -> dict[str, str] | None:
        raw = self._txn.get(namespace_key(namespace), db=self._db("namespaces"))
        return None if raw is None else json.loads(as_bytes(raw))

    def namespaces(
        self, parent: tuple[str, ...], after: tuple[str, ...] | None, limit: int | None
    ) -> list[tuple[str, ...]]:
        prefix = children_prefix(parent)
        after_key = namespace_key(after)[len(prefix) :] if after else None
        with self._txn.cursor(db=self._db("namespaces")) as cursor:
            return direct_children((key for key, _ in keys_after(cursor, prefix, after_key)), parent, limit)

    def is_empty(self, namespace: tuple[str, ...]) -> bool:
        for db, prefix in (
            ("tables", objects_prefix(namespace)),
            ("views", objects_prefix(namespace)),
            ("namespaces", children_prefix(namespace)),
        ):
            with self._txn.cursor(db=self._db(db)) as cursor:
                if next(keys_after(cursor, prefix, None), None) is not None:
                    return False
        return True

    def pointer(self, kind: str, ident: Identifier) -> Pointer | None:
        raw = self._txn.get(ident.key, db=self._db(kind + "s"))
        return None if raw is None else Pointer.from_json(as_bytes(raw))

    def identifiers(
        self, kind: str, namespace: tuple[str, ...], after: str | None, limit: int | None
    ) -> list[Identifier]:
        found: list[Identifier] = []
        with self._txn.cursor(db=self._db(kind + "s")) as cursor:
            after_key = after.encode() if after is not None else None
            for key, _ in keys_after(cursor, objects_prefix(namespace), after_key):
                found.append(Identifier.from_key(key))
                if limit is not None and len(found) >= limit:
                    break
        return found

    def commit_seq(self) -> int:
        raw = self._txn.get(HIGH_WATER, db=self._db("meta"))
        return 0 if raw is None else SEQ.unpack(raw)[0]

    def records(self, after: int, limit: int) -> list[CommitRecord]:
        found: list[CommitRecord] = []
        with self._txn.cursor(db=self._db("commit_log")) as cursor:
            if not cursor.set_range(SEQ.pack(after + 1)):
                return found
            for _, value in cursor:
                found.append(CommitRecord.from_json(as_bytes(value)))
                if len(found) >= limit:
                    break
        return found

    def cursors(self) -> dict[str, int]:
        with self._txn.cursor(db=self._db("cursors")) as cursor:
            return {as_bytes(key).decode(): SEQ.unpack(value)[0] for key, value in cursor}

    def idempotent_response(self, key: str) -> dict[str, Any] | None:
        raw = self._txn.get(key.encode(), db=self._db("idempotency"))
        return None if raw is None else json.loads(as_bytes(raw))

    def placed(self, owner: str) -> str | None:
        found = self._txn.get(OWNER + owner.encode(), db=self._db("locations"))
        return None if found is None else as_bytes(found).decode()

    def overlapping(self, location: str) -> list[tuple[str, str]]:
        db = self._db("locations")
        found = []
        for end in (i for i, ch in enumerate(location) if ch == "/"):
            above = location[:end]
            if (owner := self._txn.get(above.encode(), db=db)) is not None:
                found.append((above, as_bytes(owner).decode()))
        if (owner := self._txn.get(location.encode(), db=db)) is not None:
            found.append((location, as_bytes(owner).decode()))
        with self._txn.cursor(db=db) as cursor:
            for key, owner in keys_after(cursor, (location + "/").encode(), None):
                found.append((key.decode(), owner.decode()))
                if len(found) >= 16:
                    break
        return found

    def key(self, purpose: str) -> bytes | None:
        found = self._txn.get(b"key:" + purpose.encode(), db=self._db("meta"))
        return None if found is None else as_bytes(found)

    def marker(self, name: str) -> bool:
        return self._txn.get(b"marker:" + name.encode(), db=self._db("meta")) is not None

    def log_floor(self) -> int:
        with self._txn.cursor(db=self._db("commit_log")) as cursor:
            if cursor.first():
                return SEQ.unpack(cursor.key())[0]
        return self.commit_seq() + 1

    def coverage(self, table_uuid: str) -> Coverage:
        # Keys are prefix + (start, end): a range lives in the key, so merging only rewrites keys.
        found: dict[SpanKey, list[Range]] = {}
        with self._txn.cursor(db=self._db("coverage")) as cursor:
            for raw, _ in keys_after(cursor, ranges_prefix(table_uuid), None):
                key, covered = stream_key(raw)
                found.setdefault(key, []).append(covered)
        return Coverage(found)

    def snapshot_commit(self, table_uuid: str, snapshot_id: int) -> int | None:
        raw = self._txn.get(commit_key(table_uuid, snapshot_id), db=self._db("coverage"))
        return None if raw is None else SEQ.unpack(raw)[0]

    def sink_rows(self, table_uuid: str | None) -> list[SinkRows]:
        db = self._db("sink_rows")
        if table_uuid is not None:
            raw = self._txn.get(table_uuid.encode(), db=db)
            return [] if raw is None else [SinkRows.from_json(table_uuid, as_bytes(raw))]
        with self._txn.cursor(db=db) as cursor:
            return [SinkRows.from_json(as_bytes(key).decode(), as_bytes(value)) for key, value in cursor]

    def pending_files(self, limit: int, with_data: bool = True) -> list[PendingFile]:
        with self._txn.cursor(db=self._db("pending_files")) as cursor:
            values = itertools.islice(cursor.iternext(keys=False), limit)
            found = [pending_file(as_bytes(value)) for value in values]
        return found if with_data else [replace(each, data=b"") for each in found]

    def pending_count(self) -> int:
        entries: int = self._txn.stat(self._db("pending_files"))["entries"]
        return entries

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
            seq = SEQ.pack(record.commit_seq)
            self._txn.put(seq, record.to_json(), db=self._db("commit_log"), append=True)
            self._txn.put(HIGH_WATER, seq, db=self._db("meta"))

    def put_pending_file(self, pending: PendingFile) -> None:
        with self._full_is_retryable():
            self._txn.put(pending_key(pending.location), pending_value(pending), db=self._db("pending_files"))

    def delete_pending_files(self, locations: list[str]) -> None:
        for location in locations:
            self._txn.delete(pending_key(location), db=self._db("pending_files"))

    def put_cursor(self, name: str, commit_seq: int) -> None:
        with self._full_is_retryable():
            self._txn.put(name.encode(), SEQ.pack(commit_seq), db=self._db("cursors"))

    def delete_cursor(self, name: str) -> None:
        self._txn.delete(name.encode(), db=self._db("cursors"))

    def add_coverage(
        self, table_uuid: str, spans: list[Span], snapshot_id: int | None, commit_seq: int
    ) -> None:
        db = self._db("coverage")
        if snapshot_id is not None:
            with self._full_is_retryable():
                self._txn.put(commit_key(table_uuid, snapshot_id), SEQ.pack(commit_seq), db=db)
        by_stream: dict[SpanKey, list[Range]] = {}
        for span in spans:
            by_stream.setdefault(span.key, []).append((span.start, span.end))
        for key, added in by_stream.items():
            prefix = stream_prefix(table_uuid, key)
            with self._txn.cursor(db=db) as cursor:
                existing = [RANGE.unpack(raw[len(prefix) :]) for raw, _ in keys_after(cursor, prefix, None)]
            merged = merge([*existing, *added])
            with self._full_is_retryable():
                for covered in set(existing) - set(merged):
                    self._txn.delete(prefix + RANGE.pack(*covered), db=db)
                for covered in set(merged) - set(existing):
                    self._txn.put(prefix + RANGE.pack(*covered), b"", db=db)

    def drop_coverage(self, table_uuid: str) -> None:
        db = self._db("coverage")
        with self._txn.cursor(db=db) as cursor:
            doomed = [raw for raw, _ in keys_after(cursor, table_uuid.encode() + b"\x00", None)]
        for raw in doomed:
            self._txn.delete(raw, db=db)
        self._txn.delete(table_uuid.encode(), db=self._db("sink_rows"))

    def put_sink_rows(self, totals: SinkRows) -> None:
        with self._full_is_retryable():
            self._txn.put(totals.table_uuid.encode(), totals.to_json(), db=self._db("sink_rows"))

    def put_idempotent_response(self, key: str, response: dict[str, Any]) -> None:
        with self._full_is_retryable():
            self._txn.put(key.encode(), json.dumps(response).encode(), db=self._db("idempotency"))
            self._txn.put(SEQ.pack(response["ts"]) + key.encode(), b"", db=self._db("idempotency_by_time"))

    def trim_idempotency(self, older_than_us: int, limit: int) -> int:
        """Reads only expired keys: the time index is ordered by when each key was stored."""
        removed = 0
        with self._txn.cursor(db=self._db("idempotency_by_time")) as cursor:
            positioned = cursor.first()
            while positioned and removed < limit:
                stamp = cursor.key()
                if SEQ.unpack(stamp[: SEQ.size])[0] >= older_than_us:
                    break
                self._txn.delete(stamp[SEQ.size :], db=self._db("idempotency"))
                cursor.delete()
                removed += 1
                positioned = bool(cursor.key())
        return removed

    def place(self, owner: str, location: str) -> None:
        self.unplace(owner)
        db = self._db("locations")
        with self._full_is_retryable():
            self._txn.put(location.encode(), owner.encode(), db=db)
            self._txn.put(OWNER + owner.encode(), location.encode(), db=db)

    def unplace(self, owner: str) -> None:
        db = self._db("locations")
        location = self._txn.get(OWNER + owner.encode(), db=db)
        if location is not None:
            if self._txn.get(location, db=db) == owner.encode():
                self._txn.delete(location, db=db)
            self._txn.delete(OWNER + owner.encode(), db=db)

    def put_key(self, purpose: str, key: bytes) -> None:
        with self._full_is_retryable():
            self._txn.put(b"key:" + purpose.encode(), key, db=self._db("meta"))

    def set_marker(self, name: str) -> None:
        with self._full_is_retryable():
            self._txn.put(b"marker:" + name.encode(), b"", db=self._db("meta"))

    def clear_markers(self) -> None:
        db = self._db("meta")
        with self._txn.cursor(db=db) as cursor:
            markers = [
                key for key in map(as_bytes, cursor.iternext(values=False)) if key.startswith(b"marker:")
            ]
        for key in markers:
            self._txn.delete(key, db=db)

    def set_high_water(self, commit_seq: int) -> None:
        with self._full_is_retryable():
            self._txn.put(HIGH_WATER, SEQ.pack(commit_seq), db=self._db("meta"))

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
                seq = SEQ.unpack(cursor.key())[0]
                if seq > ceiling:
                    break
                if seq > keep_after and CommitRecord.from_json(as_bytes(cursor.value())).ts >= older_than_us:
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
            yield LmdbView(self._store, child, self._scope)
        except BaseException:
            child.abort()
            raise
        with self._full_is_retryable():
            child.commit()
