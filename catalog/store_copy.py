"""A store's whole state as typed entries: what `Store.export` yields and `Store.load` takes, so a
catalog moves between LMDB and PostgreSQL (either way) keeping every commit_seq."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from isbre.catalog.coverage import Span, SpanKey
from isbre.catalog.identifiers import Identifier, namespace_from_key
from isbre.catalog.records import CommitRecord
from isbre.catalog.sink_rows import SinkRows
from isbre.catalog.store import Pointer, WriteView


@dataclass(frozen=True)
class NamespaceEntry:
    kind: ClassVar[str] = "namespace"
    scope: str
    key: bytes
    properties: dict[str, str]


@dataclass(frozen=True)
class PointerEntry:
    kind: ClassVar[str] = "pointer"
    scope: str
    object_kind: str  # "table" or "view"
    key: bytes
    pointer: Pointer


@dataclass(frozen=True)
class RecordEntry:
    kind: ClassVar[str] = "record"
    record: CommitRecord


@dataclass(frozen=True)
class HighWaterEntry:
    """The log's high-water: above the last record kept when the newest ones were trimmed."""

    kind: ClassVar[str] = "high_water"
    commit_seq: int


@dataclass(frozen=True)
class MarkerEntry:
    kind: ClassVar[str] = "marker"
    name: str


@dataclass(frozen=True)
class CursorEntry:
    kind: ClassVar[str] = "cursor"
    name: str
    commit_seq: int


@dataclass(frozen=True)
class IdempotencyEntry:
    kind: ClassVar[str] = "idempotency"
    key: str
    response: dict[str, Any]


@dataclass(frozen=True)
class LocationEntry:
    kind: ClassVar[str] = "location"
    owner: str
    location: str


@dataclass(frozen=True)
class CoverageEntry:
    kind: ClassVar[str] = "coverage"
    table_uuid: str
    stream: SpanKey
    start: int
    end: int


@dataclass(frozen=True)
class CoverageCommitEntry:
    kind: ClassVar[str] = "coverage_commit"
    table_uuid: str
    snapshot_id: int
    commit_seq: int


@dataclass(frozen=True)
class SinkRowsEntry:
    kind: ClassVar[str] = "sink_rows"
    totals: SinkRows


Entry = (
    NamespaceEntry
    | PointerEntry
    | RecordEntry
    | HighWaterEntry
    | MarkerEntry
    | CursorEntry
    | IdempotencyEntry
    | LocationEntry
    | CoverageEntry
    | CoverageCommitEntry
    | SinkRowsEntry
)


class NotEmptyError(ValueError):
    """A store is loaded only when it holds nothing yet."""


def load_entries(view: WriteView, entries: Iterable[Entry]) -> Counter[str]:
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
            case NamespaceEntry(scope, key, properties):
                view.scoped(scope).put_namespace(namespace_from_key(key), properties)
            case PointerEntry(scope, object_kind, key, pointer):
                view.scoped(scope).put_pointer(object_kind, Identifier.from_key(key), pointer)
            case RecordEntry(record):
                records.append(record)
            case HighWaterEntry(commit_seq):
                high = commit_seq
            case MarkerEntry(name):
                view.set_marker(name)
            case CursorEntry(name, commit_seq):
                view.put_cursor(name, commit_seq)
            case IdempotencyEntry(key, response):
                view.put_idempotent_response(key, response)
            case LocationEntry(owner, location):
                view.place(owner, location)
            case CoverageEntry(table_uuid, stream, start, end):
                view.add_coverage(table_uuid, [Span(stream, start, end)], None, 0)
            case CoverageCommitEntry(table_uuid, snapshot_id, commit_seq):
                view.add_coverage(table_uuid, [], snapshot_id, commit_seq)
            case SinkRowsEntry(totals):
                view.put_sink_rows(totals)
    records.sort(key=lambda record: record.commit_seq)
    # The log keeps its commit_seqs: it starts where the source's retained log starts.
    view.set_high_water(records[0].commit_seq - 1 if records else high)
    for record in records:
        view.append(record)
    view.set_high_water(max(high, records[-1].commit_seq if records else 0))
    return counts
