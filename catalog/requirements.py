"""A commit's requirements, checked with the Java reference server's wording.

PyIceberg's requirement classes say the same things in other words; clients
(Iceberg's REST Compatibility Kit, the Java client's retry logic, people
reading logs) match on the reference's phrases, such as
`Requirement failed: current schema changed: expected id 1 != 2`.
"""

from __future__ import annotations

from collections.abc import Callable

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


_CHECKS: dict[type[TableRequirement], Callable[[TableRequirement, TableMetadata], None]] = {
    AssertTableUUID: _uuid,  # type: ignore[dict-item]
    AssertRefSnapshotId: _ref,  # type: ignore[dict-item]
    AssertLastAssignedFieldId: lambda r, base: _changed(
        "last assigned field id", r.last_assigned_field_id, base.last_column_id
    ),
    AssertCurrentSchemaId: lambda r, base: _changed(
        "current schema", r.current_schema_id, base.current_schema_id
    ),
    AssertLastAssignedPartitionId: lambda r, base: _changed(
        "last assigned partition id", r.last_assigned_partition_id, base.last_partition_id
    ),
    AssertDefaultSpecId: lambda r, base: _changed(
        "default partition spec", r.default_spec_id, base.default_spec_id
    ),
    AssertDefaultSortOrderId: lambda r, base: _changed(
        "default sort order", r.default_sort_order_id, base.default_sort_order_id
    ),
}


def check_requirement(requirement: TableRequirement, base: TableMetadata | None) -> None:
    """CommitFailedException (409) when `requirement` does not hold for `base` (None: no table)."""
    if isinstance(requirement, AssertCreate):
        if base is not None:
            raise _failed("table already exists")
        return
    if base is None:
        raise _failed("the table does not exist")
    check = _CHECKS.get(type(requirement))
    if check is None:  # a requirement this table does not know: PyIceberg's own check
        requirement.validate(base)
        return
    check(requirement, base)
