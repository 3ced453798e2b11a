"""A PostgreSQL store's whole state as typed entries, read in one snapshot (`Store.export`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import isbre.catalog.store_entries as store_entries
from isbre.catalog.coverage import SpanKey
from isbre.catalog.postgres.schema import (
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
from isbre.catalog.postgres.view import PostgresView
from isbre.catalog.records import CommitRecord
from isbre.catalog.sink_rows import SinkRows
from isbre.catalog.store import PendingFile, Pointer
from sqlalchemy import select


def export_entries(view: PostgresView) -> Iterator[store_entries.Entry]:
    db = view.connection
    for scope, key, properties in db.execute(select(namespaces).order_by(namespaces.c.warehouse)):
        yield store_entries.NamespaceEntry(scope, bytes(key), json.loads(properties))
    for scope, kind, key, pointer in db.execute(select(pointers).order_by(pointers.c.warehouse)):
        yield store_entries.PointerEntry(scope, kind, bytes(key), Pointer.from_json(pointer.encode()))
    for (record,) in db.execute(select(log_table.c.record).order_by(log_table.c.commit_seq)):
        yield store_entries.RecordEntry(CommitRecord.from_json(bytes(record)))
    yield store_entries.HighWaterEntry(view.commit_seq())
    for (key,) in db.execute(select(meta.c.key).where(meta.c.key.like("marker:%"))):
        yield store_entries.MarkerEntry(key.removeprefix("marker:"))
    for name, commit_seq in db.execute(select(cursors_table.c.name, cursors_table.c.commit_seq)):
        yield store_entries.CursorEntry(name, commit_seq)
    for key, response in db.execute(select(idempotency.c.key, idempotency.c.response)):
        yield store_entries.IdempotencyEntry(key, json.loads(response))
    for location, owner in db.execute(select(locations.c.location, locations.c.owner)):
        yield store_entries.LocationEntry(owner, location)
    for table_uuid, source_id, topic, partition, start, end in db.execute(select(ranges)):
        yield store_entries.CoverageEntry(table_uuid, SpanKey(source_id, topic, partition), start, end)
    for table_uuid, snapshot_id, commit_seq in db.execute(select(coverage_commits)):
        yield store_entries.CoverageCommitEntry(table_uuid, snapshot_id, commit_seq)
    for table_uuid, totals in db.execute(select(sink_rows.c.table_uuid, sink_rows.c.totals)):
        yield store_entries.SinkRowsEntry(SinkRows.from_json(table_uuid, totals))
    for location, owner, data in db.execute(select(pending_files)):
        yield store_entries.PendingFileEntry(PendingFile(location, owner, bytes(data)))
