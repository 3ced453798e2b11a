"""A store's whole state as typed entries: what `Store.export` yields and `store_copy.load_store`
takes, so a catalog moves between LMDB and PostgreSQL (either way) keeping every commit_seq."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from isbre.catalog.coverage import SpanKey
from isbre.catalog.pending_files import PendingFile
from isbre.catalog.pointers import Pointer
from isbre.catalog.records import CommitRecord
from isbre.catalog.sink_rows import SinkRows


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


@dataclass(frozen=True)
class PendingFileEntry:
    """A metadata file not yet synced (a copy made after a machine crash can still restore it)."""

    kind: ClassVar[str] = "pending_file"
    file: PendingFile


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
    | PendingFileEntry
)
