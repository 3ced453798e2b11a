"""Scan plans on the wire: content files, file scan tasks and filters as the REST spec writes them,
and the plan ids and plan tasks that carry a resolved scan between requests.

Values go in the spec's single-value JSON form (PyIceberg's `conversions.to_json`); filters in its
expression JSON (PyIceberg's serializable expressions), so that PyIceberg's and Java's clients read
them back as they wrote them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from typing import Any

import pydantic
from isbre.catalog.change_plans import ChangeTask
from isbre.catalog.manifest_entries import content_range, first_row_id, referenced_data_file
from isbre.catalog.plans import Rewrite
from isbre.catalog.scan_planning import PlannedTask, RowFilter, Scan
from pyiceberg.conversions import from_bytes, to_json
from pyiceberg.expressions import BooleanExpression, SerializableBooleanExpression
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import IcebergType, PrimitiveType, StructType

_EXPRESSION: pydantic.TypeAdapter[BooleanExpression] = pydantic.TypeAdapter(SerializableBooleanExpression)
_CONTENT = {
    DataFileContent.DATA: "data",
    DataFileContent.POSITION_DELETES: "position-deletes",
    DataFileContent.EQUALITY_DELETES: "equality-deletes",
}
# The statistics a data file carries for the fields a plan request names in `stats-fields`.
_COUNTS = (
    ("column-sizes", "column_sizes"),
    ("value-counts", "value_counts"),
    ("null-value-counts", "null_value_counts"),
    ("nan-value-counts", "nan_value_counts"),
)
_BOUNDS = (("lower-bounds", "lower_bounds"), ("upper-bounds", "upper_bounds"))


class PlanTokenError(LookupError):
    """A plan id or plan task this server did not make (or made for another table)."""


class NoSuchPlanIdError(PlanTokenError):
    pass


class NoSuchPlanTaskError(PlanTokenError):
    pass


def expression_json(expression: BooleanExpression) -> Any:
    """`expression` in the spec's JSON: PyIceberg writes a set predicate's values as `literals`,
    the spec's SetExpression names them `values` (which PyIceberg reads too)."""
    return _spec_sets(_EXPRESSION.dump_python(expression, mode="json"))


def _spec_sets(found: Any) -> Any:
    if isinstance(found, dict):
        return {("values" if key == "literals" else key): _spec_sets(value) for key, value in found.items()}
    return found


def parse_expression(raw: Any) -> BooleanExpression:
    return _EXPRESSION.validate_python(raw)


# A plan id or plan task carries its whole scan, so that any worker or replica serves it; it is
# signed with the store's key (`ServiceCore.key`), and only a token whose signature holds is
# parsed: a client can neither forge one nor make the server parse what it did not write.
PLAN_TOKEN_KEY = "plan-tokens"
_SIGNATURE_BYTES = 16
# What a token may be: the scan a plan request can ask for, filter bounds included (see models.py).
MAX_TOKEN_CHARS = 4 << 20


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _signature(key: bytes, payload: str) -> str:
    return _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest()[:_SIGNATURE_BYTES])


def _encode(what: dict[str, Any], key: bytes) -> str:
    payload = _b64(json.dumps(what, separators=(",", ":")).encode())
    return f"{payload}.{_signature(key, payload)}"


def _decode(token: str, kind: str, key: bytes) -> dict[str, Any]:
    payload, _, signature = token.partition(".")
    if len(token) > MAX_TOKEN_CHARS or not hmac.compare_digest(signature, _signature(key, payload)):
        raise _missing(kind)
    try:
        found = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        if not isinstance(found, dict) or found.get("k") != kind:
            raise ValueError(kind)
        return found
    except (ValueError, TypeError) as exc:
        raise _missing(kind) from exc


def _missing(kind: str) -> PlanTokenError:
    if kind == "plan":
        return NoSuchPlanIdError("No such plan id: not one this server made, or not for this table")
    return NoSuchPlanTaskError("No such plan task: not one this server made, or not for this table")


def _scan_fields(scan: Scan) -> dict[str, Any]:
    return {
        "t": scan.table_uuid,
        "e": scan.end_snapshot_id,
        "i": scan.incremental,
        "s": scan.start_snapshot_id,
        "f": expression_json(scan.rows.expression),
        "c": scan.rows.case_sensitive,
        "u": scan.rows.snapshot_schema,
    }


def _scan_of(found: dict[str, Any], kind: str) -> Scan:
    try:
        return Scan(
            str(found["t"]),
            _optional_int(found["e"]),
            bool(found["i"]),
            _optional_int(found["s"]),
            RowFilter(parse_expression(found["f"]), bool(found["c"]), bool(found["u"])),
        )
    except (KeyError, TypeError, ValueError, pydantic.ValidationError) as exc:
        raise _missing(kind) from exc


def _optional_int(value: Any) -> int | None:
    if value is not None and not isinstance(value, int):
        raise TypeError(value)
    return value


@dataclass(frozen=True)
class PlanTask:
    """A page of a plan: a range of the scan's data manifests, and the statistics asked for."""

    scan: Scan
    first: int
    end: int
    stats_fields: tuple[int, ...]

    def token(self, key: bytes) -> str:
        return _encode(
            {
                "k": "task",
                **_scan_fields(self.scan),
                "m": [self.first, self.end],
                "st": list(self.stats_fields),
            },
            key,
        )

    @staticmethod
    def missing() -> PlanTokenError:
        return _missing("task")

    @classmethod
    def of(cls, token: str, key: bytes) -> PlanTask:
        found = _decode(token, "task", key)
        try:
            first, end = (int(n) for n in found["m"])
            stats = tuple(int(n) for n in found["st"])
        except (KeyError, TypeError, ValueError) as exc:
            raise _missing("task") from exc
        return cls(_scan_of(found, "task"), first, end, stats)


@dataclass(frozen=True)
class PlanId:
    """A submitted plan: its scan, what its answer carries besides tasks, and a nonce of its own
    (a cancel ends one submission, not every plan of the same scan)."""

    scan: Scan
    stats_fields: tuple[int, ...]
    commit_seq: int | None
    nonce: str

    @classmethod
    def new(cls, scan: Scan, stats_fields: tuple[int, ...], commit_seq: int | None) -> PlanId:
        return cls(scan, stats_fields, commit_seq, os.urandom(8).hex())

    def token(self, key: bytes) -> str:
        return _encode(
            {
                "k": "plan",
                **_scan_fields(self.scan),
                "st": list(self.stats_fields),
                "cs": self.commit_seq,
                "n": self.nonce,
            },
            key,
        )

    @classmethod
    def of(cls, token: str, key: bytes) -> PlanId:
        found = _decode(token, "plan", key)
        try:
            stats = tuple(int(n) for n in found["st"])
            commit_seq = _optional_int(found["cs"])
            nonce = str(found["n"])
        except (KeyError, TypeError, ValueError) as exc:
            raise _missing("plan") from exc
        return cls(_scan_of(found, "plan"), stats, commit_seq, nonce)


def pages(counts: list[int], page_size: int) -> list[tuple[int, int]]:
    """Ranges of consecutive manifests holding about `page_size` files each (a manifest of more
    files is a page of its own)."""
    found: list[tuple[int, int]] = []
    first, held = 0, 0
    for position, count in enumerate(counts):
        if position > first and held + count > page_size:
            found.append((first, position))
            first, held = position, 0
        held += count
    if first < len(counts):
        found.append((first, len(counts)))
    return found


class TaskWriter:
    """File scan tasks and their delete files as a ScanTasks answer, for one table's metadata."""

    def __init__(self, metadata: TableMetadata, stats_fields: tuple[int, ...]) -> None:
        self._metadata = metadata
        self._schema: Schema = metadata.schema()
        self._specs = metadata.specs()
        self._partition_types: dict[int, StructType] = {}
        self._stats_fields = stats_fields

    def scan_tasks(self, tasks: list[PlannedTask]) -> dict[str, Any]:
        delete_files = _DeleteFiles(self)
        file_scan_tasks = []
        for task in tasks:
            found: dict[str, Any] = {"data-file": self.content_file(task.data_file)}
            if task.deletes:
                found["delete-file-references"] = delete_files.references(task.deletes)
            found["residual-filter"] = expression_json(task.residual)
            file_scan_tasks.append(found)
        return {"delete-files": delete_files.listed, "file-scan-tasks": file_scan_tasks}

    def change_tasks(self, tasks: list[ChangeTask]) -> dict[str, Any]:
        """isbre extension: a change plan's tasks, each a file scan task with `isbre-change` (what
        its rows are to the commit that made them; docs/rest-api.md)."""
        delete_files = _DeleteFiles(self)
        file_scan_tasks = []
        for task in tasks:
            change: dict[str, Any] = {
                "type": task.kind,
                "commit-seq": task.commit_seq,
                "snapshot-id": task.snapshot_id,
            }
            if task.kind == "deleted-rows":
                change["existing-delete-file-references"] = delete_files.references(task.existing)
            if task.carried_included:
                change["carried-rows-included"] = True
            found: dict[str, Any] = {"data-file": self.content_file(task.data_file)}
            if task.deletes:
                found["delete-file-references"] = delete_files.references(task.deletes)
            found["residual-filter"] = expression_json(task.residual)
            found["isbre-change"] = change
            file_scan_tasks.append(found)
        return {"delete-files": delete_files.listed, "file-scan-tasks": file_scan_tasks}

    def rewrite(self, rewrite: Rewrite) -> dict[str, Any]:
        """isbre extension: a snapshot after a cursor that rewrote rows."""
        summary = rewrite.snapshot.summary
        return {
            "snapshot-id": rewrite.snapshot.snapshot_id,
            "operation": summary.operation.value if summary is not None else None,
            "commit-seq": rewrite.commit_seq,
            "summary": dict(summary.additional_properties) if summary is not None else {},
            "delete-files": [self.content_file(d) for d in rewrite.delete_files],
        }

    def content_file(self, data_file: DataFile) -> dict[str, Any]:
        partition_type = self._partition_types.get(data_file.spec_id)
        if partition_type is None:
            partition_type = self._partition_type(data_file.spec_id)
            self._partition_types[data_file.spec_id] = partition_type
        found: dict[str, Any] = {
            "spec-id": data_file.spec_id,
            "partition": [
                _value(field.field_type, data_file.partition[position])
                for position, field in enumerate(partition_type.fields)
            ],
            "content": _CONTENT[data_file.content],
            "file-path": data_file.file_path,
            "file-format": data_file.file_format.name.lower(),
            "file-size-in-bytes": data_file.file_size_in_bytes,
            "record-count": data_file.record_count,
        }
        if data_file.key_metadata:
            found["key-metadata"] = data_file.key_metadata.hex()
        if data_file.split_offsets:
            found["split-offsets"] = list(data_file.split_offsets)
        if data_file.sort_order_id is not None:
            found["sort-order-id"] = data_file.sort_order_id
        if data_file.content == DataFileContent.DATA:
            # A v3 data file's, its own or inherited from its manifest (catalog/manifest_entries.py).
            if (row_id := first_row_id(data_file)) is not None:
                found["first-row-id"] = row_id
            found.update(self._statistics(data_file))
        elif data_file.content == DataFileContent.POSITION_DELETES:
            if (referenced := referenced_data_file(data_file)) is not None:
                found["referenced-data-file"] = referenced
            if (at := content_range(data_file)) is not None:  # a deletion vector's blob
                found["content-offset"], found["content-size-in-bytes"] = at
        elif data_file.equality_ids:
            found["equality-ids"] = list(data_file.equality_ids)
        return found

    def _partition_type(self, spec_id: int) -> StructType:
        """The spec's partition type, its fields' types taken from the newest schema that still has
        every source column (as Java types an older spec whose source was dropped since)."""
        spec = self._specs[spec_id]
        sources = {field.source_id for field in spec.fields}
        for schema in (self._schema, *reversed(self._metadata.schemas)):
            if all(_has_field(schema, source) for source in sources):
                return spec.partition_type(schema)
        return spec.partition_type(self._schema)

    def _statistics(self, data_file: DataFile) -> dict[str, Any]:
        if not self._stats_fields:
            return {}
        found: dict[str, Any] = {}
        for key, name in _COUNTS:
            counts = getattr(data_file, name) or {}
            kept = [field_id for field_id in self._stats_fields if field_id in counts]
            if kept:
                found[key] = {"keys": kept, "values": [counts[field_id] for field_id in kept]}
        for key, name in _BOUNDS:
            bounds = getattr(data_file, name) or {}
            kept = [field_id for field_id in self._stats_fields if field_id in bounds]
            if kept:
                values = [self._bound(field_id, bounds[field_id]) for field_id in kept]
                found[key] = {"keys": kept, "values": values}
        return found

    def _bound(self, field_id: int, raw: bytes) -> Any:
        field_type = self._schema.find_type(field_id)
        assert isinstance(field_type, PrimitiveType)
        return _value(field_type, from_bytes(field_type, raw))


class _DeleteFiles:
    """The delete files of an answer, each listed once, and the tasks' references to them."""

    def __init__(self, writer: TaskWriter) -> None:
        self._writer = writer
        self.listed: list[dict[str, Any]] = []
        self._positions: dict[str, int] = {}

    def references(self, delete_files: tuple[DataFile, ...]) -> list[int]:
        found = []
        for delete_file in delete_files:
            if delete_file.file_path not in self._positions:
                self._positions[delete_file.file_path] = len(self.listed)
                self.listed.append(self._writer.content_file(delete_file))
            found.append(self._positions[delete_file.file_path])
        return found


def _has_field(schema: Schema, field_id: int) -> bool:
    try:
        schema.find_field(field_id)
    except ValueError:
        return False
    return True


def _value(field_type: IcebergType, value: Any) -> Any:
    """A value in the spec's single-value JSON form (partition values and bounds are primitives)."""
    if value is None:
        return None
    assert isinstance(field_type, PrimitiveType)
    return to_json(field_type, value)


def isbre_fields(
    scan: Scan, commit_seq: int | None, rewrites: list[Rewrite], writer: TaskWriter
) -> dict[str, Any]:
    """isbre's extension fields of a completed plan: the snapshot it read up to, the commit cursor to
    plan from next, and (for an incremental scan) the snapshots that rewrote rows."""
    found: dict[str, Any] = {}
    if scan.end_snapshot_id is not None:
        found["isbre-snapshot-id"] = scan.end_snapshot_id
    if commit_seq is not None:
        found["isbre-commit-seq"] = commit_seq
    if scan.incremental:
        found["isbre-rewrites"] = [writer.rewrite(each) for each in rewrites]
    return found
