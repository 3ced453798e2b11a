"""A PostgreSQL store's whole state as typed entries, read in one snapshot (`Store.export`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from isbre.catalog.coverage import SpanKey
from isbre.catalog.postgres.schema import (
    coverage_commits,
    cursors_table,
    idempotency,
    locations,
    log_table,
    meta,
    namespaces,
    pointers,
    ranges,
    sink_rows,
)
from isbre.catalog.postgres.view import PostgresView
from isbre.catalog.records import CommitRecord
from isbre.catalog.sink_rows import SinkRows
from isbre.catalog.store import Pointer
from isbre.catalog.store_entries import (
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
from sqlalchemy import select


def export_entries(view: PostgresView) -> Iterator[Entry]:
    db = view.connection
    for scope, key, properties in db.execute(select(namespaces).order_by(namespaces.c.warehouse)):
        yield NamespaceEntry(scope, bytes(key), json.loads(properties))
    for scope, kind, key, pointer in db.execute(select(pointers).order_by(pointers.c.warehouse)):
        yield PointerEntry(scope, kind, bytes(key), Pointer.from_json(pointer.encode()))
    for (record,) in db.execute(select(log_table.c.record).order_by(log_table.c.commit_seq)):
        yield RecordEntry(CommitRecord.from_json(bytes(record)))
    yield HighWaterEntry(view.commit_seq())
    for (key,) in db.execute(select(meta.c.key).where(meta.c.key.like("marker:%"))):
        yield MarkerEntry(key.removeprefix("marker:"))
    for name, commit_seq in db.execute(select(cursors_table.c.name, cursors_table.c.commit_seq)):
        yield CursorEntry(name, commit_seq)
    for key, response in db.execute(select(idempotency.c.key, idempotency.c.response)):
        yield IdempotencyEntry(key, json.loads(response))
    for location, owner in db.execute(select(locations.c.location, locations.c.owner)):
        yield LocationEntry(owner, location)
    for table_uuid, source_id, topic, partition, start, end in db.execute(select(ranges)):
        yield CoverageEntry(table_uuid, SpanKey(source_id, topic, partition), start, end)
    for table_uuid, snapshot_id, commit_seq in db.execute(select(coverage_commits)):
        yield CoverageCommitEntry(table_uuid, snapshot_id, commit_seq)
    for table_uuid, totals in db.execute(select(sink_rows.c.table_uuid, sink_rows.c.totals)):
        yield SinkRowsEntry(SinkRows.from_json(table_uuid, totals))
