"""The metadata isbre writes, assembled from each snapshot's kept JSON, is byte for byte what
PyIceberg's own serialization writes, after every kind of update and on every format version."""

from __future__ import annotations

import gc

import pytest
from isbre.catalog import metadata_encoding
from isbre.catalog.metadata_encoding import table_metadata_json
from isbre.catalog.metadata_updates import apply_updates
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortField, SortOrder
from pyiceberg.table.statistics import BlobMetadata, StatisticsFile
from pyiceberg.table.update import (
    AddPartitionSpecUpdate,
    AddSchemaUpdate,
    AddSnapshotUpdate,
    AddSortOrderUpdate,
    RemovePropertiesUpdate,
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    RemoveStatisticsUpdate,
    SetCurrentSchemaUpdate,
    SetDefaultSortOrderUpdate,
    SetDefaultSpecUpdate,
    SetLocationUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    SetStatisticsUpdate,
    TableUpdate,
    UpgradeFormatVersionUpdate,
)
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "s", StringType()))
ROOT = "file:///w/t"


def snapshot(snapshot_id: int, v3: bool = False) -> Snapshot:
    return Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=snapshot_id - 1 if snapshot_id > 1 else None,
        sequence_number=snapshot_id,
        timestamp_ms=1_700_000_000_000 + snapshot_id,
        manifest_list=f"{ROOT}/metadata/snap-{snapshot_id}.avro",
        summary=Summary(Operation.APPEND, **{"added-records": "3", "total-records": str(3 * snapshot_id)}),
        schema_id=0,
        **({"first-row-id": 3 * (snapshot_id - 1), "added-rows": 3} if v3 else {}),
    )


def appended(snapshot_id: int, v3: bool = False) -> tuple[TableUpdate, ...]:
    return (
        AddSnapshotUpdate(snapshot=snapshot(snapshot_id, v3)),
        SetSnapshotRefUpdate(ref_name="main", type=SnapshotRefType.BRANCH, snapshot_id=snapshot_id),
    )


STATISTICS = StatisticsFile(
    snapshot_id=2,
    statistics_path=f"{ROOT}/metadata/stats-2.puffin",
    file_size_in_bytes=100,
    file_footer_size_in_bytes=10,
    blob_metadata=[
        BlobMetadata(type="apache-datasketches-theta-v1", snapshot_id=2, sequence_number=2, fields=[1])
    ],
)

# One table's life, in the order it is applied: every kind of update a commit may carry.
STEPS: list[tuple[str, tuple[TableUpdate, ...]]] = [
    ("first append", appended(1)),
    ("appends", appended(2) + appended(3)),
    ("set-properties", (SetPropertiesUpdate(updates={"snapshots": "[]", "x": '"snapshots":[]'}),)),
    ("remove-properties", (RemovePropertiesUpdate(removals=["x"]),)),
    ("tag", (SetSnapshotRefUpdate(ref_name="v1", type=SnapshotRefType.TAG, snapshot_id=2),)),
    ("branch", (SetSnapshotRefUpdate(ref_name="b", type=SnapshotRefType.BRANCH, snapshot_id=1),)),
    (
        "add-schema",
        (
            AddSchemaUpdate(schema=Schema(*SCHEMA.fields, NestedField(3, "n", LongType()), schema_id=1)),
            SetCurrentSchemaUpdate(schema_id=-1),
        ),
    ),
    (
        "add-spec",
        (
            AddPartitionSpecUpdate(
                spec=PartitionSpec(PartitionField(1, 1000, BucketTransform(4), "id_bucket"), spec_id=1)
            ),
            SetDefaultSpecUpdate(spec_id=-1),
        ),
    ),
    (
        "add-sort-order",
        (
            AddSortOrderUpdate(sort_order=SortOrder(SortField(source_id=1, transform=IdentityTransform()))),
            SetDefaultSortOrderUpdate(sort_order_id=-1),
        ),
    ),
    ("set-statistics", (SetStatisticsUpdate(statistics=STATISTICS),)),
    ("remove-statistics", (RemoveStatisticsUpdate(snapshot_id=2),)),
    ("remove-ref", (RemoveSnapshotRefUpdate(ref_name="b"),)),
    ("remove-snapshots", (RemoveSnapshotsUpdate(snapshot_ids=[1]),)),
    ("set-location", (SetLocationUpdate(location=f"{ROOT}-moved"),)),
    ("upgrade to v3", (UpgradeFormatVersionUpdate(format_version=3),)),
    ("v3 append", appended(4, v3=True)),
]


def history() -> list[tuple[str, TableMetadata]]:
    metadata = new_table_metadata(
        SCHEMA, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, ROOT, {"format-version": "2"}
    )
    versions = [("created", metadata)]
    for n, (name, updates) in enumerate(STEPS):
        updated = apply_updates(metadata, updates, f"{ROOT}/metadata/{n:05}.metadata.json")
        assert updated is not None, name
        metadata = updated
        versions.append((name, metadata))
    return versions


@pytest.mark.parametrize("step", range(len(STEPS) + 1))
def test_same_bytes_as_pyiceberg(step: int) -> None:
    versions = history()
    for _, metadata in versions[: step + 1]:  # earlier versions first: their pieces are kept
        table_metadata_json(metadata)
    name, metadata = versions[step]
    assert table_metadata_json(metadata) == metadata.model_dump_json(exclude_none=True).encode(), name


def test_the_empty_list_spelled_in_a_property_is_left_alone() -> None:
    name, metadata = history()[3]
    assert metadata.properties["x"] == '"snapshots":[]' and metadata.snapshots, name
    assert table_metadata_json(metadata) == metadata.model_dump_json(exclude_none=True).encode()


def test_kept_pieces_leave_with_their_snapshots() -> None:
    metadata = apply_updates(
        new_table_metadata(SCHEMA, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, ROOT, {}),
        appended(1),
        None,
    )
    assert metadata is not None
    table_metadata_json(metadata)
    keys = id(metadata.snapshots[0]), id(metadata.snapshot_log[0])
    assert all(key in metadata_encoding._pieces for key in keys)
    del metadata
    gc.collect()
    assert not any(key in metadata_encoding._pieces or key in metadata_encoding._references for key in keys)
