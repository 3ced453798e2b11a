"""A commit's requirements, checked with the Java reference server's wording.

PyIceberg's requirement classes say the same things in other words; clients
(Iceberg's REST Compatibility Kit, the Java client's retry logic, people
reading logs) match on the reference's phrases, such as
`Requirement failed: current schema changed: expected id 1 != 2`.
"""

from __future__ import annotations

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    AssertCreate,
    AssertCurrentSchemaId,
    AssertDefaultSortOrderId,
    AssertDefaultSpecId,
    AssertLastAssignedFieldId,
    AssertLastAssignedPartitionId,
    AssertRefSnapshotId,
    AssertTableUUID,
    TableRequirement,
)


def _failed(message: str) -> CommitFailedException:
    return CommitFailedException(f"Requirement failed: {message}")


def _ref(requirement: AssertRefSnapshotId, base: TableMetadata) -> None:
    ref = base.refs.get(requirement.ref)
    if ref is not None:
        kind = ref.snapshot_ref_type.value
        if requirement.snapshot_id is None:
            raise _failed(f"{kind} {requirement.ref} was created concurrently")
        if requirement.snapshot_id != ref.snapshot_id:
            expected = requirement.snapshot_id
            raise _failed(
                f"{kind} {requirement.ref} has changed: expected id {expected} != {ref.snapshot_id}"
            )
    elif requirement.snapshot_id is not None:
        raise _failed(f"branch or tag {requirement.ref} is missing, expected {requirement.snapshot_id}")


def _changed(what: str, expected: object, found: object) -> None:
    if expected != found:
        raise _failed(f"{what} changed: expected id {expected} != {found}")


def _uuid(requirement: AssertTableUUID, base: TableMetadata) -> None:
    if str(requirement.uuid).lower() != str(base.table_uuid).lower():
        raise _failed(f"UUID does not match: expected {base.table_uuid} != {requirement.uuid}")


def check_requirement(requirement: TableRequirement, base: TableMetadata | None) -> None:
    """CommitFailedException (409) when `requirement` does not hold for `base` (None: no table)."""
    if isinstance(requirement, AssertCreate):
        if base is not None:
            raise _failed("table already exists")
        return
    if base is None:
        raise _failed("the table does not exist")
    match requirement:
        case AssertTableUUID():
            _uuid(requirement, base)
        case AssertRefSnapshotId():
            _ref(requirement, base)
        case AssertLastAssignedFieldId():
            _changed("last assigned field id", requirement.last_assigned_field_id, base.last_column_id)
        case AssertCurrentSchemaId():
            _changed("current schema", requirement.current_schema_id, base.current_schema_id)
        case AssertLastAssignedPartitionId():
            _changed(
                "last assigned partition id", requirement.last_assigned_partition_id, base.last_partition_id
            )
        case AssertDefaultSpecId():
            _changed("default partition spec", requirement.default_spec_id, base.default_spec_id)
        case AssertDefaultSortOrderId():
            _changed("default sort order", requirement.default_sort_order_id, base.default_sort_order_id)
        case _:  # a requirement this table does not know: PyIceberg's own check
            requirement.validate(base)
