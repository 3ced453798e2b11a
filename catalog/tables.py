"""Staging a table change: requirements, PyIceberg's update machinery, the next metadata file.

Staging runs in the caller's thread against the current pointer; the writer
then swaps pointers only if each is still the one staging started from. A
moved pointer means a concurrent commit landed first: the caller stages again
against the new state, where the requirements are checked afresh.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertCreate,
    SetPartitionStatisticsUpdate,
    SetStatisticsUpdate,
    TableRequirement,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
    update_table_metadata,
)
from pyiceberg.utils.datetime import datetime_to_millis

from catalog.coverage import Span, snapshot_spans
from catalog.identifiers import Identifier
from catalog.locations import LocationNotAllowedError, inside, normalized
from catalog.metadata_files import Loaded, metadata_json
from catalog.records import CommitRecord, summary_counters
from catalog.store import Pointer

_VERSIONED = re.compile(r"^(\d+)-[0-9a-fA-F-]{36}\.(gz\.)?metadata\.json$")


@dataclass(frozen=True)
class TableChange:
    ident: Identifier
    requirements: tuple[TableRequirement, ...]
    updates: tuple[TableUpdate, ...]


@dataclass
class Staged:
    ident: Identifier
    base: Pointer | None
    metadata: TableMetadata
    json: bytes
    metadata_location: str
    changed: bool
    updates: tuple[TableUpdate, ...] = ()
    spans: tuple[Span, ...] = ()
    previous_location: str | None = None  # the table's location before this change

    @property
    def pointer(self) -> Pointer:
        return Pointer(self.metadata_location, str(self.metadata.table_uuid))

    @property
    def moved(self) -> bool:
        """Whether the change creates the table or changes its location."""
        return self.changed and self.metadata.location != self.previous_location


def next_metadata_location(table_location: str, previous: str | None) -> str:
    version = 0
    if previous is not None and (match := _VERSIONED.match(previous.rsplit("/", 1)[-1])):
        version = int(match.group(1)) + 1
    return f"{table_location.rstrip('/')}/metadata/{version:05d}-{uuid.uuid4()}.metadata.json"


def stage(change: TableChange, base: Pointer | None, current: Loaded[TableMetadata] | None) -> Staged:
    if base is None and not any(isinstance(r, AssertCreate) for r in change.requirements):
        raise NoSuchTableError(f"Table does not exist: {change.ident}")
    for requirement in change.requirements:
        requirement.validate(current.metadata if current else None)
    if current is None:
        metadata = _created_by_updates(change)
    else:
        updated = apply_updates(current.metadata, change.updates, base.metadata_location)
        if updated is None:
            return Staged(change.ident, base, current.metadata, current.json, base.metadata_location, False)
        metadata = updated
    _check_statistics(metadata, change.updates)
    for update in change.updates:
        if isinstance(update, AddSnapshotUpdate):
            check_path(update.snapshot.manifest_list, "manifest list")
    location = next_metadata_location(metadata.location, base.metadata_location if base else None)
    added = [u.snapshot for u in change.updates if isinstance(u, AddSnapshotUpdate)]
    spans = tuple(span for snapshot in added for span in snapshot_spans(snapshot))
    json = metadata_json(metadata)
    previous = current.metadata.location if current else None
    return Staged(change.ident, base, metadata, json, location, True, change.updates, spans, previous)


def _created_by_updates(change: TableChange) -> TableMetadata:
    try:
        metadata = update_table_metadata(_empty_metadata(), change.updates, enforce_validation=True)
    except (StopIteration, LookupError, AttributeError, TypeError) as exc:
        # PyIceberg's machinery assumes a complete create (a schema, a spec, a location).
        raise ValueError(f"Incomplete create by updates: {type(exc).__name__} {exc}".strip()) from exc
    if not metadata.location:
        raise ValueError("A create by updates needs a set-location update")
    return metadata


def check_path(path: str, what: str) -> None:
    """A path metadata carries must have one spelling (catalog/locations.py): 400 otherwise."""
    try:
        normalized(path)
    except LocationNotAllowedError as exc:
        raise ValueError(f"Invalid {what} path: {exc}") from exc


def check_carried_paths(metadata: TableMetadata) -> None:
    """Every path of whole metadata (a register): manifest lists, previous metadata, statistics."""
    for snapshot in metadata.snapshots:
        check_path(snapshot.manifest_list, "manifest list")
    for entry in metadata.metadata_log:
        check_path(entry.metadata_file, "previous metadata file")
    for statistics in (*metadata.statistics, *metadata.partition_statistics):
        check_path(statistics.statistics_path, "statistics")


def _check_statistics(metadata: TableMetadata, updates: tuple[TableUpdate, ...]) -> None:
    """Statistics files a change adds must belong to one of the table's snapshots and lie inside its
    location: a purge deletes them."""
    snapshots = {snapshot.snapshot_id for snapshot in metadata.snapshots}
    root = normalized(metadata.location)
    for update in updates:
        if isinstance(update, SetStatisticsUpdate):
            found, what = update.statistics, "statistics"
        elif isinstance(update, SetPartitionStatisticsUpdate):
            found, what = update.partition_statistics, "partition statistics"
        else:
            continue
        if found.snapshot_id not in snapshots:
            raise ValueError(
                f"Cannot set {what} for snapshot {found.snapshot_id}: the table has no such snapshot"
            )
        try:
            path = normalized(found.statistics_path)
        except LocationNotAllowedError as exc:
            raise ValueError(f"Invalid {what} path: {exc}") from exc
        if not inside(path, root) or path == root:
            raise ValueError(
                f"The {what} file {found.statistics_path!r} is outside the table's location {root}"
            )


def apply_updates(
    base: TableMetadata, updates: tuple[TableUpdate, ...], location: str
) -> TableMetadata | None:
    """PyIceberg's `update_table_metadata` for an existing table, without its closing deep copy.

    The deep copy guards callers that mutate metadata in place; isbre never
    does (cached metadata is shared read-only), and the copy was a quarter of
    a commit's CPU. Each update is still applied by PyIceberg's own functions.
    Returns None when the updates change nothing.
    """
    context = _TableMetadataUpdateContext()
    metadata = base
    for update in updates:
        metadata = _apply_table_update(update, metadata, context)
    if not context.has_changes():
        return None
    metadata = _update_table_metadata_log(metadata, location, base.last_updated_ms)
    if metadata.last_updated_ms == base.last_updated_ms:
        metadata = metadata.model_copy(
            update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())}
        )
    metadata.spec().check_compatible(metadata.schema())
    metadata.sort_order().check_compatible(metadata.schema())
    return metadata


def _empty_metadata() -> TableMetadata:
    # The same starting point PyIceberg's own catalogs use for a create-by-updates.
    from pyiceberg.catalog import MetastoreCatalog

    return MetastoreCatalog._empty_table_metadata()


def commit_record(staged: Staged, txn: str | None, txn_size: int | None) -> CommitRecord:
    metadata = staged.metadata
    record = CommitRecord(
        kind="table.create" if staged.base is None else "table.commit",
        namespace=list(staged.ident.namespace),
        name=staged.ident.name,
        table_uuid=str(metadata.table_uuid),
        metadata_location=staged.metadata_location,
        previous_metadata_location=staged.base.metadata_location if staged.base else None,
        schema_id=metadata.current_schema_id,
        txn=txn,
        txn_size=txn_size,
    )
    added = [u.snapshot for u in staged.updates if isinstance(u, AddSnapshotUpdate)]
    if added:
        # One commit can add several snapshots (PyIceberg's overwrite: a delete, then an append);
        # the record describes the commit as a whole.
        record.snapshot_id = added[-1].snapshot_id
        record.parent_snapshot_id = added[0].parent_snapshot_id
        summaries = [s.summary for s in added if s.summary is not None]
        if summaries:
            record.operation = _combined_operation([s.operation.value for s in summaries])
            record.summary = _combined_counters(
                [summary_counters(s.additional_properties) for s in summaries]
            )
    return record


def _combined_operation(operations: list[str]) -> str:
    if len(set(operations)) == 1:
        return operations[0]
    adds = any(op in ("append", "overwrite") for op in operations)
    removes = any(op in ("delete", "overwrite") for op in operations)
    return "overwrite" if adds and removes else operations[-1]


def _combined_counters(counters: list[dict[str, int]]) -> dict[str, int]:
    """Deltas summed over the snapshots, totals as of the last one."""
    combined: dict[str, int] = {}
    for snapshot in counters:
        for key, value in snapshot.items():
            combined[key] = value if key.startswith("total_") else combined.get(key, 0) + value
    return combined
