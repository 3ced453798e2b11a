"""A read or write transaction on the PostgreSQL store, as the catalog sees it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from isbre.catalog.coverage import Coverage, Range, Span, SpanKey, merge
from isbre.catalog.identifiers import (
    Identifier,
    children_prefix,
    direct_children,
    namespace_key,
    objects_prefix,
)
from isbre.catalog.postgres import location_index
from isbre.catalog.postgres.schema import (
    END,
    HIGH_WATER,
    IDEMPOTENT,
    NAMESPACE,
    POINTER,
    POINTERS,
    coverage_commits,
    cursors_table,
    idempotency,
    locations,
    log_table,
    meta,
    namespaces,
    pending_files,
    pointers,
    ranges,
    sink_rows,
)
from isbre.catalog.postgres.transaction import Transaction
from isbre.catalog.records import CommitRecord
from isbre.catalog.sink_rows import SinkRows
from isbre.catalog.store import (
    FIRST_WAREHOUSE,
    PendingFile,
    Pointer,
    WriteView,
    check_scope,
)
from sqlalchemy import (
    Connection,
    Table,
    and_,
    delete,
    func,
    select,
)


def _starts_with(column: Any, prefix: bytes) -> Any:
    return and_(column >= prefix, column < prefix + END)


class PostgresView(WriteView):
    def __init__(
        self,
        connection: Connection,
        scopes: frozenset[str],
        scope: str = FIRST_WAREHOUSE,
        txn: Transaction | None = None,
    ) -> None:
        check_scope(scopes, scope)
        self._db = connection
        self._scopes = scopes
        self._scope = scope
        self.txn = txn or Transaction()  # shared by the transaction's scoped views and savepoints

    def scoped(self, warehouse: str) -> PostgresView:
        return PostgresView(self._db, self._scopes, warehouse, self.txn)

    # -- reads

    def namespace(self, namespace: tuple[str, ...]) -> dict[str, str] | None:
        found, row = self.txn.overlaid(namespaces, self._scope, namespace_key(namespace))
        if found:
            return None if row is None else json.loads(row["properties"])
        raw = self._db.scalar(NAMESPACE, {"warehouse": self._scope, "key": namespace_key(namespace)})
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
            (w, k, key): pointer for w, k, key, pointer in self._sql().execute(POINTERS, {"keys": wanted})
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
        raw = self._db.scalar(POINTER, {"warehouse": self._scope, "kind": kind, "key": ident.key})
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
            raw = self._db.scalar(HIGH_WATER)
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
        raw = self._db.scalar(IDEMPOTENT, {"key": key})
        return None if raw is None else json.loads(raw)

    def placed(self, owner: str) -> str | None:
        return location_index.placed(self._sql(), owner)

    def overlapping(self, location: str) -> list[tuple[str, str]]:
        return location_index.overlapping(self._sql(), location)

    def key(self, purpose: str) -> bytes | None:
        found = self._sql().scalar(select(meta.c.value).where(meta.c.key == f"key:{purpose}"))
        return None if found is None else bytes.fromhex(found)

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

    def snapshot_commit(self, table_uuid: str, snapshot_id: int) -> int | None:
        return self._sql().scalar(
            select(coverage_commits.c.commit_seq).where(
                coverage_commits.c.table_uuid == table_uuid, coverage_commits.c.snapshot_id == snapshot_id
            )
        )

    def sink_rows(self, table_uuid: str | None) -> list[SinkRows]:
        if table_uuid is not None:
            found, row = self.txn.overlaid(sink_rows, table_uuid)
            if found:
                return [] if row is None else [SinkRows.from_json(table_uuid, row["totals"])]
        query = select(sink_rows.c.table_uuid, sink_rows.c.totals)
        if table_uuid is not None:
            query = query.where(sink_rows.c.table_uuid == table_uuid)
        return [SinkRows.from_json(uuid, totals) for uuid, totals in self._sql().execute(query)]

    def pending_files(self, limit: int, with_data: bool = True) -> list[PendingFile]:
        columns = pending_files.c if with_data else (pending_files.c.location, pending_files.c.owner)
        rows = self._sql().execute(select(*columns).limit(limit))
        return [PendingFile(row[0], row[1], bytes(row[2]) if with_data else b"") for row in rows]

    def pending_count(self) -> int:
        return int(self._sql().scalar(select(func.count()).select_from(pending_files)) or 0)

    # -- writes

    @property
    def connection(self) -> Connection:
        return self._db

    def set_high_water(self, commit_seq: int) -> None:
        self._upsert(meta, key="commit_seq", value=str(commit_seq))
        self.txn.high_water = commit_seq

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

    def put_pending_file(self, pending: PendingFile) -> None:
        self._upsert(pending_files, location=pending.location, owner=pending.owner, data=pending.data)

    def delete_pending_files(self, locations: list[str]) -> None:
        for location in locations:
            self.txn.buffer(pending_files, {"location": location}, delete=True)

    def put_cursor(self, name: str, commit_seq: int) -> None:
        self._upsert(cursors_table, name=name, commit_seq=commit_seq)

    def delete_cursor(self, name: str) -> None:
        self._sql().execute(delete(cursors_table).where(cursors_table.c.name == name))

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
        self.txn.buffer(sink_rows, {"table_uuid": table_uuid}, delete=True)

    def put_sink_rows(self, totals: SinkRows) -> None:
        self._upsert(sink_rows, table_uuid=totals.table_uuid, totals=totals.to_json().decode())

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

    def put_key(self, purpose: str, key: bytes) -> None:
        self._upsert(meta, key=f"key:{purpose}", value=key.hex())

    def set_marker(self, name: str) -> None:
        self._upsert(meta, key=f"marker:{name}", value="")

    def clear_markers(self) -> None:
        self._sql().execute(delete(meta).where(meta.c.key.like("marker:%")))

    def holds_anything(self) -> bool:
        if self.commit_seq():
            return True
        return any(
            self._sql().scalar(select(table.c.key).limit(1)) is not None for table in (namespaces, pointers)
        )

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
            yield PostgresView(self._db, self._scopes, self._scope, self.txn)
