"""A commit's updates applied to table metadata, with ids assigned as the Java reference builder does.

PyIceberg's own update functions do the work (`apply_table_update`); before
each one runs, isbre settles what the reference builder (Iceberg core's
`TableMetadata.Builder`) settles and PyIceberg does not:

- a schema, partition spec or sort order identical to one the table has
  already reuses that one's id; a new one whose requested id is taken gets the
  next free id (one more than the highest), so two writers adding the same
  order concurrently, or a client reusing an id, never leave two entries with
  one id, which no Java engine can load;
- `-1` in `set-current-schema`, `set-default-spec` and `set-default-sort-order`
  is the one the last `add-*` of the same request resolved to;
- format version 3: upgrades from 2, `next-row-id` starting at 0, and each
  added snapshot's `first-row-id` and `added-rows` (the table's `next-row-id`
  then advances by `added-rows`).

Whatever is written is checked once more for unique ids (`check_unique_ids`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from isbre.catalog.format_v3 import (
    AddEncryptionKeyUpdate,
    AnyTableUpdate,
    RemoveEncryptionKeyUpdate,
    TableMetadataV3,
    apply_encryption_update,
    as_v3,
)
from isbre.catalog.pyiceberg_internals import UpdateContext, add_to_metadata_log, apply_table_update
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.sorting import SortOrder
from pyiceberg.table.update import (
    AddPartitionSpecUpdate,
    AddSchemaUpdate,
    AddSnapshotUpdate,
    AddSortOrderUpdate,
    AssignUUIDUpdate,
    SetCurrentSchemaUpdate,
    SetDefaultSortOrderUpdate,
    SetDefaultSpecUpdate,
    TableUpdate,
    UpgradeFormatVersionUpdate,
)
from pyiceberg.utils.datetime import datetime_to_millis

# The highest table format version isbre reads and writes.
MAX_FORMAT_VERSION = 3
# The Java reference numbers sort orders from 1; 0 is the unsorted order.
UNSORTED_ORDER_ID = 0


@dataclass
class _LastAdded:
    """The ids the request's add-* updates resolved to: what -1 names."""

    schema: int | None = None
    spec: int | None = None
    order: int | None = None


def _next_free(requested: int, taken: set[int], lowest: int = 0) -> int:
    if requested not in taken and requested >= lowest:
        return requested
    return max(taken | {lowest - 1}) + 1


def _same_spec(a: PartitionSpec, b: PartitionSpec) -> bool:
    """The reference's `compatibleWith`: the same fields in order (source, transform, name)."""
    return len(a.fields) == len(b.fields) and all(
        (x.source_id, str(x.transform), x.name) == (y.source_id, str(y.transform), y.name)
        for x, y in zip(a.fields, b.fields, strict=True)
    )


def _check_spec_fields(spec: PartitionSpec) -> None:
    ids = [field.field_id for field in spec.fields]
    names = [field.name for field in spec.fields]
    if len(set(ids)) == len(ids) and len(set(names)) == len(names):
        return  # every commit checks every spec: the common case counts nothing
    for what, values in (("field id", ids), ("field name", names)):
        twice = sorted(str(v) for v, n in Counter[object](values).items() if n > 1)
        if twice:
            raise ValueError(f"Invalid partition spec: {what} {', '.join(twice)} used twice")


def _resolved(update: TableUpdate, metadata: TableMetadata, added: _LastAdded) -> TableUpdate | None:
    """`update` with the ids the reference builder would give it; None when it adds nothing new."""
    if isinstance(update, AddSchemaUpdate):
        given = update.schema_
        for schema in metadata.schemas:
            if schema.fields == given.fields and schema.identifier_field_ids == given.identifier_field_ids:
                added.schema = schema.schema_id
                return None
        new_id = _next_free(given.schema_id, {s.schema_id for s in metadata.schemas})
        added.schema = new_id
        return update if new_id == given.schema_id else AddSchemaUpdate(schema_=_with_id(given, new_id))
    if isinstance(update, AddPartitionSpecUpdate):
        _check_spec_fields(update.spec)
        for spec in metadata.partition_specs:
            if _same_spec(spec, update.spec):
                added.spec = spec.spec_id
                return None
        new_id = _next_free(update.spec.spec_id, {s.spec_id for s in metadata.partition_specs})
        added.spec = new_id
        if new_id == update.spec.spec_id:
            return update
        return AddPartitionSpecUpdate(spec=update.spec.model_copy(update={"spec_id": new_id}))
    if isinstance(update, AddSortOrderUpdate):
        order = update.sort_order
        for existing in metadata.sort_orders:
            if existing.fields == order.fields:
                added.order = existing.order_id
                return None
        if not order.fields:  # the unsorted order always has id 0
            new_id = UNSORTED_ORDER_ID
        else:
            taken = {o.order_id for o in metadata.sort_orders} | {UNSORTED_ORDER_ID}
            new_id = _next_free(order.order_id, taken, lowest=1)
        added.order = new_id
        return (
            update
            if new_id == order.order_id
            else AddSortOrderUpdate(sort_order=_order_with_id(order, new_id))
        )
    if isinstance(update, SetCurrentSchemaUpdate) and update.schema_id == -1:
        return SetCurrentSchemaUpdate(schema_id=_last(added.schema, "schema"))
    if isinstance(update, SetDefaultSpecUpdate) and update.spec_id == -1:
        return SetDefaultSpecUpdate(spec_id=_last(added.spec, "partition spec"))
    if isinstance(update, SetDefaultSortOrderUpdate) and update.sort_order_id == -1:
        return SetDefaultSortOrderUpdate(sort_order_id=_last(added.order, "sort order"))
    if isinstance(update, AddSnapshotUpdate) and metadata.format_version >= 3:
        snapshot = update.snapshot
        if snapshot.first_row_id is None or snapshot.added_rows is None:
            raise ValueError(
                "Cannot add a snapshot to a format version 3 table without first-row-id and added-rows"
            )
    return update


def _last(found: int | None, what: str) -> int:
    if found is None:
        raise ValueError(f"Cannot set the last added {what} (-1): no {what} has been added")
    return found


def _with_id(schema: Schema, schema_id: int) -> Schema:
    return Schema(*schema.fields, schema_id=schema_id, identifier_field_ids=schema.identifier_field_ids)


def _order_with_id(order: SortOrder, order_id: int) -> SortOrder:
    return SortOrder(*order.fields, order_id=order_id)


def _upgraded(
    update: UpgradeFormatVersionUpdate, metadata: TableMetadata, context: UpdateContext
) -> TableMetadata:
    """An upgrade PyIceberg does not make itself: to format version 3, whose row ids start at 0."""
    if update.format_version > MAX_FORMAT_VERSION:
        raise ValueError(f"Unsupported table format version: {update.format_version} (isbre writes 1 to 3)")
    if update.format_version < 3 or metadata.format_version >= 3:
        return apply_table_update(update, metadata, context)
    if metadata.format_version < 2:
        metadata = apply_table_update(UpgradeFormatVersionUpdate(format_version=2), metadata, context)
    for schema in metadata.schemas:
        schema.check_format_version_compatibility(3)
    context.add_update(update)
    return as_v3(TableMetadataV3.model_construct(**{**dict(metadata), "format_version": 3}))


def apply_updates(
    base: TableMetadata, updates: tuple[AnyTableUpdate, ...], location: str | None
) -> TableMetadata | None:
    """`updates` applied to `base` by PyIceberg's own functions, ids settled first (see above);
    `location`: the metadata file `base` was read from (None for a create). None when nothing
    changes.

    PyIceberg's `update_table_metadata` deep-copies its result, to guard callers that
    mutate metadata in place; isbre never does (cached metadata is shared read-only), and the
    copy was a quarter of a commit's CPU."""
    context = UpdateContext()
    added = _LastAdded()
    metadata = base
    for update in updates:
        if isinstance(update, AssignUUIDUpdate) and location is not None and update.uuid != base.table_uuid:
            # The Java reference refuses it too: consumers, coverage and locations are the uuid's.
            raise ValueError(f"Cannot reassign uuid: the table's is {base.table_uuid}, not {update.uuid}")
        if isinstance(update, UpgradeFormatVersionUpdate):
            metadata = _upgraded(update, metadata, context)
            continue
        if isinstance(update, AddEncryptionKeyUpdate | RemoveEncryptionKeyUpdate):
            metadata = apply_encryption_update(update, metadata, context)
            continue
        resolved = _resolved(update, metadata, added)
        if resolved is not None:
            metadata = apply_table_update(resolved, metadata, context)
    if not context.has_changes():
        return None
    if location is not None:
        metadata = add_to_metadata_log(metadata, location, base.last_updated_ms)
    if metadata.last_updated_ms == base.last_updated_ms:
        metadata = metadata.model_copy(
            update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())}
        )
    return as_v3(metadata)


def check_unique_ids(metadata: TableMetadata) -> None:
    """Metadata with two schemas, specs or sort orders of one id, or a spec naming one field id
    twice, is never written: no Java engine can load it (400)."""
    for what, ids in (
        ("schema", [s.schema_id for s in metadata.schemas]),
        ("partition spec", [s.spec_id for s in metadata.partition_specs]),
        ("sort order", [o.order_id for o in metadata.sort_orders]),
    ):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"Invalid table metadata: {what} id {', '.join(map(str, twice))} used twice")
    for spec in metadata.partition_specs:
        _check_spec_fields(spec)
