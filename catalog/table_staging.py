"""Staging a table change: requirements, PyIceberg's update machinery, the next metadata file.

Staging runs in the caller's thread against the current pointer; the writer
then swaps pointers only if each is still the one staging started from. A
moved pointer means a concurrent commit landed first: the caller stages again
against the new state, where the requirements are checked afresh.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from isbre.catalog.coverage import Span, snapshot_spans
from isbre.catalog.format_v3 import AnyTableUpdate, as_v3
from isbre.catalog.identifiers import Identifier
from isbre.catalog.locations import LocationNotAllowedError, inside, normalized
from isbre.catalog.metadata_checks import check_change
from isbre.catalog.metadata_files import Loaded, metadata_json
from isbre.catalog.metadata_updates import apply_updates, check_unique_ids
from isbre.catalog.places import Place, named_places, places_of
from isbre.catalog.pyiceberg_internals import empty_table_metadata
from isbre.catalog.records import CommitRecord, summary_counters
from isbre.catalog.requirements import check_requirement
from isbre.catalog.sink_rows import snapshots_rows
from isbre.catalog.store import Pointer
from isbre.catalog.table_properties import METADATA_PATH, check_no_code
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import SortOrder
from pyiceberg.table.statistics import PartitionStatisticsFile, StatisticsFile
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertCreate,
    SetPartitionStatisticsUpdate,
    SetPropertiesUpdate,
    SetStatisticsUpdate,
    TableRequirement,
)
from pyiceberg.types import NestedField, StructType

_VERSIONED = re.compile(r"^(\d+)-[0-9a-fA-F-]{36}\.(gz\.)?metadata\.json$")


@dataclass(frozen=True)
class TableChange:
    ident: Identifier
    requirements: tuple[TableRequirement, ...]
    updates: tuple[AnyTableUpdate, ...]
    job: str | None = None  # the catalog's own maintenance job that asks for it
    # The catalog's own commits: Iceberg's rules for them (catalog/conflicts.py), checked on the
    # very metadata the change is staged on; raises ConflictError.
    validate: Callable[[TableMetadata], None] | None = None


@dataclass
class Staged:
    ident: Identifier
    base: Pointer | None
    metadata: TableMetadata
    json: bytes
    metadata_location: str
    changed: bool
    updates: tuple[AnyTableUpdate, ...] = ()
    spans: tuple[Span, ...] = ()
    rows: dict[str, int] = field(default_factory=dict)  # what a sink's commit counted (catalog/sink_rows.py)
    previous_places: tuple[Place, ...] | None = None  # the table's places before this change
    job: str | None = None
    # The manifest list the catalog wrote to make the commit's append again on a newer head
    # (catalog/append_rebase.py): removed again if the commit does not land.
    rebased_list: str | None = None

    @property
    def pointer(self) -> Pointer:
        return Pointer(self.metadata_location, str(self.metadata.table_uuid))

    @property
    def added_snapshots(self) -> list[int]:
        return [u.snapshot.snapshot_id for u in self.updates if isinstance(u, AddSnapshotUpdate)]

    @property
    def places(self) -> tuple[Place, ...]:
        return named_places(self.metadata.location, self.metadata.properties)

    @property
    def moved(self) -> bool:
        """Whether the change creates the table or changes where its files go."""
        return self.changed and self.places != self.previous_places


def next_metadata_location(location: str, properties: Mapping[str, str], previous: str | None) -> str:
    """A new metadata file: in `write.metadata.path`, or `<location>/metadata`, numbered after
    `previous` as the Java library numbers them."""
    version = 0
    if previous is not None and (match := _VERSIONED.match(previous.rsplit("/", 1)[-1])):
        version = int(match.group(1)) + 1
    directory = properties.get(METADATA_PATH, "").rstrip("/") or f"{location.rstrip('/')}/metadata"
    return f"{directory}/{version:05d}-{uuid.uuid4()}.metadata.json"


# Properties the Java reference persists on every new table unless the create sets them.
CREATE_DEFAULTS = {"write.parquet.compression-codec": "zstd"}


def new_metadata(
    schema: Schema,
    spec: PartitionSpec,
    order: SortOrder,
    location: str,
    properties: dict[str, str],
    table_uuid: uuid.UUID,
) -> TableMetadata:
    """A new table's metadata: PyIceberg's, with fresh ids, the columns' default values kept (its
    fresh-id pass drops `initial-default` and `write-default`) and the reference's persisted
    defaults; format version 3 in isbre's writable model."""
    metadata = new_table_metadata(
        schema, spec, order, location, {**CREATE_DEFAULTS, **properties}, table_uuid
    )
    fresh = metadata.schemas[0]
    kept = Schema(
        *(_with_defaults(new, given) for new, given in zip(fresh.fields, schema.fields, strict=True)),
        schema_id=fresh.schema_id,
        identifier_field_ids=fresh.identifier_field_ids,
    )
    return as_v3(metadata.model_copy(update={"schemas": [kept]}))


def _with_defaults(fresh: NestedField, given: NestedField) -> NestedField:
    field_type = fresh.field_type
    if isinstance(field_type, StructType) and isinstance(given.field_type, StructType):
        field_type = StructType(
            *(_with_defaults(a, b) for a, b in zip(field_type.fields, given.field_type.fields, strict=True))
        )
    if field_type is fresh.field_type and given.initial_default is None and given.write_default is None:
        return fresh
    return NestedField(
        fresh.field_id,
        fresh.name,
        field_type,
        fresh.required,
        fresh.doc,
        initial_default=given.initial_default,
        write_default=given.write_default,
    )


def stage(change: TableChange, base: Pointer | None, current: Loaded[TableMetadata] | None) -> Staged:
    if base is None and not any(isinstance(r, AssertCreate) for r in change.requirements):
        raise NoSuchTableError(f"Table does not exist: {change.ident}")
    for update in change.updates:
        if isinstance(update, SetPropertiesUpdate):
            check_no_code(update.updates)
    for requirement in change.requirements:
        check_requirement(requirement, current.metadata if current else None)
    if change.validate is not None and current is not None:
        change.validate(current.metadata)
    if current is None:
        metadata = _created_by_updates(change)
    else:
        assert base is not None  # metadata was loaded from the table's pointer
        updated = apply_updates(current.metadata, change.updates, base.metadata_location)
        if updated is None:
            return Staged(change.ident, base, current.metadata, current.json, base.metadata_location, False)
        metadata = updated
        metadata.spec().check_compatible(metadata.schema())
        metadata.sort_order().check_compatible(metadata.schema())
    check_unique_ids(metadata)
    check_change(metadata, change.updates)
    _check_statistics(metadata, change.updates)
    places = places_of(metadata.location, metadata.properties)
    for update in change.updates:
        if isinstance(update, AddSnapshotUpdate):
            check_path(update.snapshot.manifest_list, "manifest list", places)
    location = next_metadata_location(
        metadata.location, metadata.properties, base.metadata_location if base else None
    )
    added = [u.snapshot for u in change.updates if isinstance(u, AddSnapshotUpdate)]
    spans = tuple(span for snapshot in added for span in snapshot_spans(snapshot))
    rows = snapshots_rows(added)
    json = metadata_json(metadata)
    previous = named_places(current.metadata.location, current.metadata.properties) if current else None
    return Staged(
        change.ident,
        base,
        metadata,
        json,
        location,
        True,
        change.updates,
        spans,
        rows,
        previous,
        change.job,
    )


def _created_by_updates(change: TableChange) -> TableMetadata:
    try:
        metadata = apply_updates(empty_table_metadata(), change.updates, None)
        if metadata is None:
            raise ValueError("A create by updates needs updates")
        # Validated whole, as PyIceberg's own catalogs validate a create.
        metadata = as_v3(type(metadata).model_validate(metadata.model_dump()))
    except (StopIteration, LookupError, AttributeError, TypeError) as exc:
        # PyIceberg's machinery assumes a complete create (a schema, a spec, a location).
        raise ValueError(f"Incomplete create by updates: {type(exc).__name__} {exc}".strip()) from exc
    if not metadata.location:
        raise ValueError("A create by updates needs a set-location update")
    return metadata


def check_path(path: str, what: str, places: tuple[str, ...] = ()) -> None:
    """A path metadata carries must have one spelling (catalog/locations.py), and lie under one of
    the table's `places` when given: 400 otherwise."""
    try:
        found = normalized(path)
        roots = [normalized(place) for place in places]
    except LocationNotAllowedError as exc:
        raise ValueError(f"Invalid {what} path: {exc}") from exc
    if places and not any(inside(found, root) and found != root for root in roots):
        raise ValueError(f"The {what} {path!r} is outside the table's places: {', '.join(roots)}")


def check_carried_paths(metadata: TableMetadata) -> None:
    """Every path of whole metadata (a register): manifest lists and statistics inside the table's
    places (the server reads and deletes them), previous metadata files of one spelling."""
    places = places_of(metadata.location, metadata.properties)
    for snapshot in metadata.snapshots:
        check_path(snapshot.manifest_list, "manifest list", places)
    for entry in metadata.metadata_log:
        check_path(entry.metadata_file, "previous metadata file")
    for statistics in (*metadata.statistics, *metadata.partition_statistics):
        check_path(statistics.statistics_path, "statistics", places)


def _check_statistics(metadata: TableMetadata, updates: tuple[AnyTableUpdate, ...]) -> None:
    """Statistics files a change adds must belong to one of the table's snapshots and lie inside its
    location: a purge deletes them."""
    root = normalized(metadata.location)
    for update in updates:
        found: StatisticsFile | PartitionStatisticsFile
        if isinstance(update, SetStatisticsUpdate):
            found, what = update.statistics, "statistics"
        elif isinstance(update, SetPartitionStatisticsUpdate):
            found, what = update.partition_statistics, "partition statistics"
        else:
            continue
        if metadata.snapshot_by_id(found.snapshot_id) is None:
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
        job=staged.job,
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
