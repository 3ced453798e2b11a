"""Table metadata the Java reference's `TableMetadata` (and its builder) refuses, refused here too.

PyIceberg's models accept values no Java engine loads: field ids past a Java int, a `next-row-id`
below zero, a default of the wrong type, a snapshot older than the metadata log. A commit that
would write such metadata, or a register of such a file, is refused (400) with the reference's
wording where it has one. `check_change` looks at what one commit adds (every commit pays for it,
so it reads only the new parts); `check_registered` at a whole metadata file.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any

from isbre.catalog.format_v3 import AddEncryptionKeyUpdate, AnyTableUpdate, TableMetadataV3
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import AddSchemaUpdate, AddSnapshotUpdate, SetPropertiesUpdate
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

# Ids are Java ints.
MAX_ID = 2**31 - 1
# The reference's tolerance for clocks of different machines.
ONE_MINUTE_MS = 60_000
# Table properties that are metadata, not properties (the reference's RESERVED_PROPERTIES).
RESERVED_PROPERTIES = frozenset(
    {
        "format-version",
        "uuid",
        "snapshot-count",
        "current-snapshot-id",
        "current-snapshot-summary",
        "current-snapshot-timestamp-ms",
        "current-schema",
        "default-partition-spec",
        "default-sort-order",
    }
)
_INTEGERS = {IntegerType(): (-(2**31), 2**31 - 1), LongType(): (-(2**63), 2**63 - 1)}


def check_reserved(keys: Iterable[str]) -> None:
    reserved = sorted(set(keys) & RESERVED_PROPERTIES)
    if reserved:
        raise ValueError(
            f"Table properties should not contain reserved properties, but got {reserved}: "
            "format-version changes with upgrade-format-version, the rest are read-only"
        )


def check_change(metadata: TableMetadata, updates: Iterable[AnyTableUpdate]) -> None:
    """The parts of `metadata` (the result of a commit) that `updates` added or moved."""
    for update in updates:
        if isinstance(update, SetPropertiesUpdate):
            check_reserved(update.updates)
        elif isinstance(update, AddSchemaUpdate):
            _check_schema(update.schema_)
        elif isinstance(update, AddSnapshotUpdate):
            _check_snapshot(update.snapshot)
        elif isinstance(update, AddEncryptionKeyUpdate):
            _check_key(update.encryption_key.key_id, update.encryption_key.encrypted_key_metadata)
    _check_counters(metadata)
    _check_log_order(metadata)


def check_registered(metadata: TableMetadata, raw: bytes) -> None:
    """A whole metadata file to register; `raw`: its bytes as read (the model fills in what a v3
    file may not leave out)."""
    found: Mapping[str, Any] = json.loads(raw)
    if metadata.format_version >= 3 and "next-row-id" not in found:
        raise ValueError("Invalid table metadata: a format version 3 table needs next-row-id")
    check_reserved(metadata.properties)
    for schema in metadata.schemas:
        _check_schema(schema)
    for snapshot in metadata.snapshots:
        _check_snapshot(snapshot)
    if isinstance(metadata, TableMetadataV3):
        for key in metadata.encryption_keys:
            _check_key(key.key_id, key.encrypted_key_metadata)
    current = metadata.current_snapshot_id
    if current is not None and current != -1 and metadata.snapshot_by_id(current) is None:
        raise ValueError(f"Invalid table metadata: current-snapshot-id {current} names no snapshot")
    _check_counters(metadata)
    _check_log_order(metadata)


def _check_counters(metadata: TableMetadata) -> None:
    if not 0 <= metadata.last_column_id <= MAX_ID:
        raise ValueError(f"Invalid last-column-id {metadata.last_column_id}: ids are 0 to {MAX_ID}")
    next_row_id = getattr(metadata, "next_row_id", None)
    if next_row_id is not None and next_row_id < 0:
        raise ValueError(f"Invalid next-row-id {next_row_id}: row ids start at 0")


def _check_log_order(metadata: TableMetadata) -> None:
    if not metadata.metadata_log:
        return
    last = metadata.metadata_log[-1].timestamp_ms
    if metadata.last_updated_ms - last < -ONE_MINUTE_MS:
        raise ValueError(
            f"Invalid update timestamp {metadata.last_updated_ms}: before the latest metadata log entry "
            f"timestamp {last}"
        )


def _check_snapshot(snapshot: Snapshot) -> None:
    for name, value in (("first-row-id", snapshot.first_row_id), ("added-rows", snapshot.added_rows)):
        if value is not None and value < 0:
            raise ValueError(f"Invalid snapshot {snapshot.snapshot_id}: {name} {value} is negative")


def _check_key(key_id: str, encrypted: str) -> None:
    try:
        base64.b64decode(encrypted, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"Invalid encryption key {key_id!r}: encrypted-key-metadata is not base64") from exc


def _check_schema(schema: Schema) -> None:
    for field in _fields(schema.fields):
        if not 0 <= field.field_id <= MAX_ID:
            raise ValueError(f"Invalid field id {field.field_id} of {field.name!r}: ids are 0 to {MAX_ID}")
        for what, value in (
            ("initial-default", field.initial_default),
            ("write-default", field.write_default),
        ):
            if value is not None and not _fits(value, field.field_type):
                raise ValueError(
                    f"Invalid {what} {value!r} of {field.name!r}: not a value of type {field.field_type}"
                )


def _fields(fields: Iterable[NestedField]) -> Iterable[NestedField]:
    for field in fields:
        yield field
        kind = field.field_type
        if isinstance(kind, StructType):
            yield from _fields(kind.fields)
        elif isinstance(kind, ListType):
            yield from _fields([kind.element_field])
        elif isinstance(kind, MapType):
            yield from _fields([kind.key_field, kind.value_field])


def _fits(value: Any, kind: IcebergType) -> bool:
    """Whether a default, as PyIceberg parsed it from the spec's single-value JSON, is of `kind`."""
    if isinstance(kind, BooleanType):
        return isinstance(value, bool)
    if isinstance(kind, IntegerType | LongType):
        low, high = _INTEGERS[kind]
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    if isinstance(kind, FloatType | DoubleType):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(kind, StringType):
        return isinstance(value, str)
    if isinstance(kind, BinaryType | FixedType):
        return isinstance(value, bytes | str)
    if isinstance(kind, StructType | ListType | MapType):
        return isinstance(value, dict | list)
    # Strings, and the types PyIceberg keeps as parsed values (dates, times, decimals, uuids).
    return not isinstance(value, bool | dict | list)
