"""Filling an empty store with another's entries (`Store.export`, catalog/store_entries.py), so a
catalog moves between LMDB and PostgreSQL (either way) keeping every commit_seq."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import isbre.catalog.store_entries as store_entries
from isbre.catalog.coverage import Span
from isbre.catalog.identifiers import Identifier, namespace_from_key
from isbre.catalog.records import CommitRecord
from isbre.catalog.store import Store, WriteView


class NotEmptyError(ValueError):
    """A store is loaded only when it holds nothing yet."""


def load_entries(view: WriteView, entries: Iterable[store_entries.Entry]) -> Counter[str]:
    """Write `entries` into the empty store of `view`; returns how many of each kind."""
    if view.holds_anything():
        raise NotEmptyError("the target store already holds a catalog: copy only into an empty one")
    # The one-time steps done are the loaded catalog's: a new store marks those it never needs.
    view.clear_markers()
    counts: Counter[str] = Counter()
    high = 0
    records: list[CommitRecord] = []
    for entry in entries:
        counts[entry.kind] += 1
        match entry:
            case store_entries.NamespaceEntry(scope, key, properties):
                view.scoped(scope).put_namespace(namespace_from_key(key), properties)
            case store_entries.PointerEntry(scope, object_kind, key, pointer):
                view.scoped(scope).put_pointer(object_kind, Identifier.from_key(key), pointer)
            case store_entries.RecordEntry(record):
                records.append(record)
            case store_entries.HighWaterEntry(commit_seq):
                high = commit_seq
            case store_entries.MarkerEntry(name):
                view.set_marker(name)
            case store_entries.CursorEntry(name, commit_seq):
                view.put_cursor(name, commit_seq)
            case store_entries.IdempotencyEntry(key, response):
                view.put_idempotent_response(key, response)
            case store_entries.LocationEntry(owner, location):
                view.place(owner, location)
            case store_entries.CoverageEntry(table_uuid, stream, start, end):
                view.add_coverage(table_uuid, [Span(stream, start, end)], None, 0)
            case store_entries.CoverageCommitEntry(table_uuid, snapshot_id, commit_seq):
                view.add_coverage(table_uuid, [], snapshot_id, commit_seq)
            case store_entries.SinkRowsEntry(totals):
                view.put_sink_rows(totals)
            case store_entries.PendingFileEntry(file):
                view.put_pending_file(file)
    records.sort(key=lambda record: record.commit_seq)
    # The log keeps its commit_seqs: it starts where the source's retained log starts.
    view.set_high_water(records[0].commit_seq - 1 if records else high)
    for record in records:
        view.append(record)
    view.set_high_water(max(high, records[-1].commit_seq if records else 0))
    return counts


def load_store(store: Store, entries: Iterable[store_entries.Entry]) -> Counter[str]:
    """Fill the empty `store` with `entries` (another store's `export`, of either kind), keeping
    every commit_seq, in one transaction: all of it lands, or nothing. Returns how many of each
    kind; NotEmptyError when the store already holds a catalog."""
    held = list(entries)  # `transact` may run the load again
    return store.transact(lambda view: load_entries(view, held))
