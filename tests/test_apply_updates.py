"""isbre's copy-free update path gives exactly what PyIceberg's update_table_metadata gives."""

from __future__ import annotations

import pytest
from isbre.catalog.metadata_updates import apply_updates
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AddPartitionSpecUpdate,
    AddSchemaUpdate,
    AddSnapshotUpdate,
    RemovePropertiesUpdate,
    SetCurrentSchemaUpdate,
    SetDefaultSpecUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    update_table_metadata,
)
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import LongType, NestedField, StringType

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "s", StringType()))
LOCATION = "file:///w/t/metadata/00003-0b9c1a52-3b83-4f5c-8d6e-4f2a2c3d9e11.metadata.json"
SNAPSHOT = Snapshot(
    snapshot_id=7,
    sequence_number=1,
    timestamp_ms=1_700_000_000_000,
    manifest_list="file:///w/t/metadata/snap-7.avro",
    summary=Summary(Operation.APPEND, **{"added-records": "3"}),
    schema_id=0,
)

CASES = {
    "properties": (SetPropertiesUpdate(updates={"a": "1"}), RemovePropertiesUpdate(removals=["owner"])),
    "schema": (
        AddSchemaUpdate(schema=Schema(*SCHEMA.fields, NestedField(3, "n", LongType()), schema_id=1)),
        SetCurrentSchemaUpdate(schema_id=-1),
    ),
    "spec": (
        AddPartitionSpecUpdate(
            spec=PartitionSpec(PartitionField(1, 1000, BucketTransform(4), "id_bucket"), spec_id=1)
        ),
        SetDefaultSpecUpdate(spec_id=-1),
    ),
    "snapshot": (
        AddSnapshotUpdate(snapshot=SNAPSHOT),
        SetSnapshotRefUpdate(ref_name="main", type=SnapshotRefType.BRANCH, snapshot_id=7),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_same_result_as_pyiceberg(name: str) -> None:
    base = new_table_metadata(
        SCHEMA,
        UNPARTITIONED_PARTITION_SPEC,
        UNSORTED_SORT_ORDER,
        "file:///w/t",
        {"owner": "x", "format-version": "2"},
    )
    base = base.model_copy(update={"last_updated_ms": 1_600_000_000_000})
    ours = apply_updates(base, CASES[name], LOCATION)
    theirs = update_table_metadata(base, CASES[name], metadata_location=LOCATION)
    assert ours is not None
    # last-updated-ms is "now" on both sides; everything else must match exactly.
    assert ours.model_copy(update={"last_updated_ms": 0}) == theirs.model_copy(update={"last_updated_ms": 0})
    assert ours.last_updated_ms >= base.last_updated_ms


def test_no_change_is_none() -> None:
    base = new_table_metadata(SCHEMA, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, "file:///w/t", {})
    assert apply_updates(base, (SetPropertiesUpdate(updates={}),), LOCATION) is None
    assert apply_updates(base, (), LOCATION) is None
