"""Server-side scan planning: the data files a scan reads, each with its delete files and the part
of the filter its partition does not settle, found as PyIceberg's local planner finds them
(`pyiceberg_internals.ScanPruning`), through the manifest cache.

A `Scan` is resolved against one table once; its pages are manifest ranges planned again from it
on whichever worker or replica is asked, so a plan holds no state between requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from isbre.catalog.confined_io import ConfinedIO
from isbre.catalog.manifest_cache import ManifestCache
from isbre.catalog.manifest_entries import referenced_data_file
from isbre.catalog.pyiceberg_internals import ScanPruning
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    LiteralPredicate,
    Not,
    Or,
    Reference,
    SetPredicate,
)
from pyiceberg.expressions.literals import StringLiteral
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.manifest import ManifestFile as Manifest
from pyiceberg.schema import Schema
from pyiceberg.table.delete_file_index import DeleteFileIndex
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot
from pyiceberg.types import BinaryType, FixedType

INITIAL_SEQUENCE_NUMBER = 0


class ScanNotPlannableError(ValueError):
    """The scan names snapshots the table does not hold, or in an order it cannot have."""


@dataclass(frozen=True)
class RowFilter:
    """The rows a scan keeps: `expression`, its names matched as `case_sensitive` says, bound to
    the scanned snapshot's own schema when `snapshot_schema` (time travel), else the table's."""

    expression: BooleanExpression = field(default_factory=AlwaysTrue)
    case_sensitive: bool = True
    snapshot_schema: bool = False


@dataclass(frozen=True)
class Scan:
    """What to plan, resolved against one table.

    `end_snapshot_id`: the snapshot a point-in-time scan reads, or the last (inclusive) of an
    incremental one; None for a table without snapshots. `start_snapshot_id` (incremental only):
    the exclusive start, None for the first ancestor. An incremental scan reads the data files that
    the `append` snapshots between them added, as PyIceberg's incremental append scan does."""

    table_uuid: str
    end_snapshot_id: int | None
    incremental: bool = False
    start_snapshot_id: int | None = None
    rows: RowFilter = field(default_factory=RowFilter)


@dataclass(frozen=True)
class PlannedTask:
    data_file: DataFile
    deletes: tuple[DataFile, ...]
    residual: BooleanExpression


class History:
    """A table's snapshots by id: PyIceberg's lookup walks the whole list, and a plan looks up a
    few snapshots, so a table of long history would cost each plan that many walks."""

    def __init__(self, metadata: TableMetadata) -> None:
        self.metadata = metadata
        self._by_id = {each.snapshot_id: each for each in metadata.snapshots}

    def snapshot(self, snapshot_id: int) -> Snapshot:
        found = self._by_id.get(snapshot_id)
        if found is None:
            raise ScanNotPlannableError(f"Snapshot {snapshot_id} is not one of the table's")
        return found

    def ancestors(self, end: int, start: int | None) -> Iterator[Snapshot]:
        """The snapshots from `end` back to `start` (exclusive), newest first, as far as the
        metadata holds them (an expired parent ends the walk)."""
        current: Snapshot | None = self.snapshot(end)
        while current is not None and current.snapshot_id != start:
            yield current
            parent = current.parent_snapshot_id
            current = None if parent is None else self._by_id.get(parent)


def appends(history: History, scan: Scan) -> list[Snapshot]:
    """An incremental scan's `append` snapshots, oldest first."""
    assert scan.end_snapshot_id is not None
    walked = list(history.ancestors(scan.end_snapshot_id, scan.start_snapshot_id))
    if scan.start_snapshot_id is not None:
        history.snapshot(scan.start_snapshot_id)
        reached = walked[-1].parent_snapshot_id if walked else scan.start_snapshot_id
        if reached != scan.start_snapshot_id:
            raise ScanNotPlannableError(
                f"Snapshot {scan.start_snapshot_id} is not an ancestor of {scan.end_snapshot_id}"
            )
    return [s for s in reversed(walked) if s.summary is not None and s.summary.operation == Operation.APPEND]


def spec_literals(expression: BooleanExpression, schema: Schema, case_sensitive: bool) -> BooleanExpression:
    """`expression` with the string literals of binary and fixed columns read as the spec writes
    their values, hex (PyIceberg reads the JSON as a string literal, which does not bind to those
    types); ValueError for one that is not hex."""
    if isinstance(expression, And | Or):
        left = spec_literals(expression.left, schema, case_sensitive)
        return type(expression)(left, spec_literals(expression.right, schema, case_sensitive))
    if isinstance(expression, Not):
        return Not(spec_literals(expression.child, schema, case_sensitive))
    if not isinstance(expression, LiteralPredicate | SetPredicate) or not isinstance(
        expression.term, Reference
    ):
        return expression
    try:
        field_type = schema.find_field(expression.term.name, case_sensitive).field_type
    except ValueError:
        return expression  # binding names it
    if not isinstance(field_type, BinaryType | FixedType):
        return expression
    if isinstance(expression, LiteralPredicate):
        literal = expression.literal
        return (
            type(expression)(expression.term, _bytes(literal))
            if isinstance(literal, StringLiteral)
            else expression
        )
    if all(isinstance(literal, StringLiteral) for literal in expression.literals):
        return type(expression)(expression.term, {_bytes(literal) for literal in expression.literals})
    return expression


def _bytes(literal: Any) -> bytes:
    try:
        return bytes.fromhex(literal.value)
    except ValueError as exc:
        raise ValueError(f"Invalid binary value {literal.value!r}: binary and fixed values are hex") from exc


def scanned_metadata(history: History, scan: Scan) -> TableMetadata:
    """The metadata whose current schema the filter binds to: the snapshot's own schema when the
    scan asks for it (time travel), else the table's."""
    metadata = history.metadata
    if not scan.rows.snapshot_schema or scan.end_snapshot_id is None:
        return metadata
    schema_id = history.snapshot(scan.end_snapshot_id).schema_id
    if schema_id is None or schema_id == metadata.current_schema_id:
        return metadata
    return metadata.model_copy(update={"current_schema_id": schema_id})


class Planner:
    """Plans one scan of one table, reading its files through `io` (the table's own files only)."""

    def __init__(self, history: History, scan: Scan, io: ConfinedIO, cache: ManifestCache) -> None:
        self.history = history
        self.metadata = history.metadata
        self.scan = scan
        self.io = io
        self._cache = cache
        rows, scanned = scan.rows, scanned_metadata(history, scan)
        expression = spec_literals(rows.expression, scanned.schema(), rows.case_sensitive)
        self._pruning = ScanPruning(scanned, expression, rows.case_sensitive)
        self._appends = appends(history, scan) if scan.incremental and scan.end_snapshot_id else []

    def data_manifests(self) -> list[Manifest]:
        """The data manifests the scan reads, in a fixed order (a page is a range of them)."""
        if self.scan.end_snapshot_id is None:
            return []
        listed: Iterable[Manifest]
        if self.scan.incremental:
            added = {s.snapshot_id for s in self._appends}
            listed = (m for s in self._appends for m in self.manifests(s) if m.added_snapshot_id in added)
        else:
            listed = iter(self.manifests(self.history.snapshot(self.scan.end_snapshot_id)))
        found: dict[str, Manifest] = {}
        for manifest in listed:
            if manifest.content == ManifestContent.DATA and self._pruning.keeps_manifest(manifest):
                found.setdefault(manifest.manifest_path, manifest)
        return list(found.values())

    def tasks(self, manifests: list[Manifest]) -> list[PlannedTask]:
        """The file scan tasks of `manifests` (some of `data_manifests()`)."""
        added = {s.snapshot_id for s in self._appends}
        entries = [
            entry
            for manifest in manifests
            for entry in self.entries(manifest)
            if (
                not self.scan.incremental
                or (entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id in added)
            )
            and self.keeps(entry.data_file)
        ]
        deletes = self._deletes
        return [
            PlannedTask(entry.data_file, tuple(deletes.of(entry)), self.residual(entry.data_file))
            for entry in entries
        ]

    def keeps(self, data_file: DataFile) -> bool:
        """Whether the scan's filter may match rows of `data_file` (its partition, its bounds)."""
        return self._pruning.keeps_file(data_file)

    def residual(self, data_file: DataFile) -> BooleanExpression:
        """What is left of the scan's filter for the rows of `data_file`."""
        return self._pruning.residual(data_file)

    def added_deletes(self, added_by: Snapshot) -> list[DataFile]:
        """The delete files `added_by` added (a rewrite that a reader of changes is told of)."""
        return [
            entry.data_file
            for manifest in self.manifests(added_by)
            if manifest.content == ManifestContent.DELETES
            and manifest.added_snapshot_id == added_by.snapshot_id
            for entry in self.entries(manifest)
            if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == added_by.snapshot_id
        ]

    @cached_property
    def _deletes(self) -> DeleteIndex:
        """The scan's delete files, read once per planner (an incremental scan reads none)."""
        deletes = DeleteIndex(self.metadata)
        if self.scan.incremental or self.scan.end_snapshot_id is None:
            return deletes
        for manifest in self.manifests(self.history.snapshot(self.scan.end_snapshot_id)):
            if manifest.content == ManifestContent.DELETES and self._pruning.keeps_manifest(manifest):
                for entry in self.entries(manifest):
                    if self._pruning.keeps_file(entry.data_file):
                        deletes.add(entry)
        return deletes

    def manifests(self, of: Snapshot) -> tuple[Manifest, ...]:
        return self._cache.manifests(self.io, self.io.check(of.manifest_list), self.metadata.format_version)

    def entries(self, manifest: Manifest, deleted: bool = False) -> tuple[ManifestEntry, ...]:
        """The manifest's live entries (and with `deleted`, its deleted ones)."""
        # Every path is checked for this table, not only when first read: another table's manifest
        # list may name the same manifest.
        version = self.metadata.format_version
        return self._cache.entries(self.io, manifest, self.scan.table_uuid, self.io.check, version, deleted)


class DeleteIndex:
    """The delete files of a scan, matched to data files as the spec says: position deletes (and
    deletion vectors) by PyIceberg's index; equality deletes to the data files of their partition
    (every partition, for an unpartitioned spec) with a lower data sequence number."""

    def __init__(self, metadata: TableMetadata) -> None:
        self._specs = metadata.specs()
        self._positions = DeleteFileIndex()
        self._equalities: list[tuple[int, DataFile]] = []
        # Deletion vectors (and position delete files that say so) by the one data file they name.
        self._referencing: dict[str, list[tuple[int, DataFile]]] = {}

    def add(self, entry: ManifestEntry) -> None:
        delete_file = entry.data_file
        if delete_file.content == DataFileContent.POSITION_DELETES:
            referenced = referenced_data_file(delete_file)
            if referenced is not None:
                self._referencing.setdefault(referenced, []).append((_sequence(entry), delete_file))
                return
            self._positions.add_delete_file(entry, partition_key=delete_file.partition)
        elif delete_file.content == DataFileContent.EQUALITY_DELETES:
            self._equalities.append((_sequence(entry), delete_file))

    def of(self, entry: ManifestEntry) -> list[DataFile]:
        data_file, sequence = entry.data_file, _sequence(entry)
        found = sorted(
            self._positions.for_data_file(sequence, data_file, partition_key=data_file.partition),
            key=lambda d: d.file_path,
        )
        found += [d for at, d in self._referencing.get(data_file.file_path, ()) if at >= sequence]
        for deleted_at, delete_file in self._equalities:
            if deleted_at > sequence and (
                self._specs[delete_file.spec_id].is_unpartitioned()
                or (delete_file.spec_id == data_file.spec_id and delete_file.partition == data_file.partition)
            ):
                found.append(delete_file)
        return found


def _sequence(entry: ManifestEntry) -> int:
    return entry.sequence_number or INITIAL_SEQUENCE_NUMBER
