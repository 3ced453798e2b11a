"""Making the table fit the batches: create, add columns, widen on request, refuse the rest.

The plan is computed first (what the batch needs that the table lacks) and
applied as one schema commit, so a refused batch changes nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import pyarrow as pa
from isbre.catalog.maintenance_policy import SINK_MANAGED
from isbre.catalog.pyiceberg_internals import arrow_schema_without_ids
from isbre.sinks.contract import SchemaDriftError
from isbre.sinks.policies import DEFAULT_POLICY, EARLIER_POLICY
from pyiceberg.schema import Schema
from pyiceberg.table import Transaction
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

MANAGED_PROPERTY = SINK_MANAGED
PREFIX_PROPERTY = "isbre.sink.prefix"
POLICY_PROPERTY = "isbre.sink.metadata-policy"
COMMENT_HASH_PROPERTY = "isbre.sink.comment-hash"
DOC_KEYS = (b"comment", b"description", b"doc")


def _documented(f: pa.Field) -> pa.Field:
    kind = f.type
    if pa.types.is_struct(kind):
        f = f.with_type(pa.struct([_documented(kind.field(i)) for i in range(kind.num_fields)]))
    elif pa.types.is_map(kind):
        f = f.with_type(pa.map_(_documented(kind.key_field), _documented(kind.item_field)))
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        element = _documented(kind.value_field)
        f = f.with_type(pa.list_(element) if pa.types.is_list(kind) else pa.large_list(element))
    metadata = f.metadata or {}
    doc = next((metadata[k] for k in DOC_KEYS if k in metadata), None)
    return f.with_metadata({**metadata, b"doc": doc}) if doc is not None else f


def with_docs(schema: pa.Schema) -> pa.Schema:
    """Arrow fields documented under `comment` or `description`, at any depth, carry it as `doc`,
    which PyIceberg reads."""
    return pa.schema([_documented(f) for f in schema], metadata=schema.metadata)


def lossless(narrow: IcebergType, wide: IcebergType) -> bool:
    """Iceberg's lossless type promotions."""
    if isinstance(narrow, IntegerType) and isinstance(wide, LongType):
        return True
    if isinstance(narrow, FloatType) and isinstance(wide, DoubleType):
        return True
    return (
        isinstance(narrow, DecimalType)
        and isinstance(wide, DecimalType)
        and narrow.scale == wide.scale
        and narrow.precision <= wide.precision
    )


def _shape(kind: IcebergType) -> object:
    """A type without its field ids, which differ between a batch's schema and the table's."""
    if isinstance(kind, StructType):
        return ("struct", tuple((f.name, _shape(f.field_type)) for f in kind.fields))
    if isinstance(kind, ListType):
        return ("list", _shape(kind.element_type))
    if isinstance(kind, MapType):
        return ("map", _shape(kind.key_type), _shape(kind.value_type))
    return kind


def _is_nested(kind: IcebergType) -> bool:
    return isinstance(kind, StructType | ListType | MapType)


@dataclass
class Plan:
    # Column paths: a top-level column's name alone; a nested field's names from the top, with
    # "element" and "value" for a list's element and a map's value.
    add: list[tuple[tuple[str, ...], IcebergType, str | None]] = field(default_factory=list)
    widen: list[tuple[tuple[str, ...], IcebergType]] = field(default_factory=list)
    docs: dict[str, str] = field(default_factory=dict)  # existing columns whose doc must change
    to_json: list[str] = field(default_factory=list)  # batch columns to write as JSON text
    # Integer batch columns written to the table's float or double column: whole numbers are, as
    # long as the type holds each exactly.
    exact: dict[str, pa.DataType] = field(default_factory=dict)
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def changes_schema(self) -> bool:
        return bool(self.add or self.widen or self.docs)

    @property
    def changes_table(self) -> bool:
        return self.changes_schema or bool(self.properties)

    def stage(self, tx: Transaction) -> None:
        """Stage the plan's schema changes and properties on `tx`."""
        if self.changes_schema:
            with tx.update_schema() as update:
                for path, kind, doc in self.add:
                    update.add_column(path, kind, doc=doc)
                for path, kind in self.widen:
                    update.update_column(path, field_type=kind)
                for name, doc in self.docs.items():
                    update.update_column(name, doc=doc)
        if self.properties:
            tx.set_properties(self.properties)


def table_policy(properties: dict[str, str] | None, requested: str | None) -> str:
    """The metadata policy of a sink on a table with `properties` (None: no table yet), opened with
    `requested` (None: whatever the table has). The policy is fixed once the table exists: a
    sink-managed table that records none has every column (it was made before policies were)."""
    recorded = None
    if properties is not None:
        recorded = properties.get(POLICY_PROPERTY) or (
            EARLIER_POLICY if MANAGED_PROPERTY in properties else None
        )
    if recorded is not None and requested is not None and recorded != requested:
        raise SchemaDriftError(
            f"The table's metadata policy is {recorded!r}; a sink with metadata_policy={requested!r} "
            "cannot write to it (the policy is fixed once the table exists)"
        )
    return recorded or requested or DEFAULT_POLICY


def sink_properties(prefix: str, synced_comments: str, policy: str) -> dict[str, str]:
    """The table properties a sink-managed table carries."""
    return {
        MANAGED_PROPERTY: "true",
        PREFIX_PROPERTY: prefix,
        POLICY_PROPERTY: policy,
        COMMENT_HASH_PROPERTY: synced_comments,
        # Random ids have no useful bounds or counts; the writer skips their Parquet statistics too.
        **({f"write.metadata.metrics.column.{prefix}record_id": "none"} if policy != "none" else {}),
    }


def comment_hash(schema: Schema) -> str:
    docs = {f.name: f.doc for f in schema.fields if f.doc}
    return hashlib.sha256(json.dumps(docs, sort_keys=True).encode()).hexdigest()


def _named(path: tuple[str, ...]) -> str:
    return repr(".".join(path))


def _fit_fields(
    parent: tuple[str, ...],
    incoming: tuple[NestedField, ...],
    have: tuple[NestedField, ...],
    result: Plan,
    widen: bool,
    fill_missing: bool,
) -> None:
    """Plan what the fields `have` of the struct at `parent` need to take `incoming`."""
    for column in incoming:
        existing = next((f for f in have if f.name == column.name), None)
        path = (*parent, column.name)
        if existing is None:
            result.add.append((path, column.field_type, column.doc))
        else:
            _fit_type(path, column.field_type, existing.field_type, result, widen, fill_missing)
    for existing in have:
        if any(f.name == existing.name for f in incoming) or (fill_missing and not existing.required):
            continue
        raise SchemaDriftError(
            f"Column {_named((*parent, existing.name))} ({existing.field_type}) is in the table but not in "
            "the batch; the sink never drops columns (fill_missing writes nulls into optional ones)"
        )


def _fit_type(
    path: tuple[str, ...], kind: IcebergType, have: IcebergType, result: Plan, widen: bool, fill_missing: bool
) -> None:
    """Plan what the column or nested field at `path`, of type `have`, needs to take values of `kind`."""
    if isinstance(kind, StructType) and isinstance(have, StructType):
        _fit_fields(path, kind.fields, have.fields, result, widen, fill_missing)
        return
    if isinstance(kind, ListType) and isinstance(have, ListType):
        _fit_type((*path, "element"), kind.element_type, have.element_type, result, widen, fill_missing)
        return
    if isinstance(kind, MapType) and isinstance(have, MapType):
        if _shape(kind.key_type) != _shape(have.key_type):
            raise SchemaDriftError(
                f"Column {_named(path)}: the batch's map keys are {kind.key_type}, the table's are "
                f"{have.key_type}; map keys never change"
            )
        _fit_type((*path, "value"), kind.value_type, have.value_type, result, widen, fill_missing)
        return
    if _shape(kind) == _shape(have) or lossless(kind, have):
        return
    if {type(kind), type(have)} == {TimestampType, TimestamptzType}:
        aware = "time-zone-aware" if isinstance(kind, TimestamptzType) else "time-zone-naive"
        raise SchemaDriftError(
            f"Column {_named(path)}: the batch has a {aware} timestamp ({kind}) but the table column is "
            f"{have}; convert the values before they reach the sink"
        )
    if (
        len(path) == 1
        and isinstance(kind, IntegerType | LongType)
        and isinstance(have, FloatType | DoubleType)
    ):
        result.exact[path[0]] = pa.float32() if isinstance(have, FloatType) else pa.float64()
        return
    if lossless(have, kind):
        if widen:
            result.widen.append((path, kind))
            return
        raise SchemaDriftError(
            f"Column {_named(path)}: the batch has {kind}, the table column is {have}; writing would narrow "
            "the values (enable widening to promote the column)"
        )
    raise SchemaDriftError(
        f"Column {_named(path)}: the batch's {kind} cannot be written to the table's {have}"
    )


def fit_column(column: NestedField, have: NestedField, widen: bool) -> None:
    """Raise SchemaDriftError, naming why, when the table's top-level column `have` cannot take
    `column`'s values as they are."""
    _fit_type((column.name,), column.field_type, have.field_type, Plan(), widen, fill_missing=False)


def plan(
    table_schema: Schema,
    table_properties: dict[str, str],
    batch_schema: pa.Schema,
    prefix: str,
    policy: str,
    widen: bool,
    to_json: bool,
    fill_missing: bool,
) -> Plan:
    """What the table needs to take batches of `batch_schema` (payload and metadata columns)."""
    table_policy(table_properties, policy)  # made meanwhile by a sink of another policy: refused
    known = table_properties.get(PREFIX_PROPERTY)
    if known is not None and known != prefix:
        raise SchemaDriftError(
            f"The table's metadata columns use the prefix {known!r}; a sink with prefix {prefix!r} "
            "cannot write to it (the prefix is fixed once the table exists)"
        )
    incoming = arrow_schema_without_ids(with_docs(batch_schema))
    result = Plan()
    for column in incoming.fields:
        existing = next((f for f in table_schema.fields if f.name == column.name), None)
        if existing is None:
            continue
        if column.doc and column.doc != existing.doc:
            result.docs[column.name] = column.doc
        if isinstance(existing.field_type, StringType) and _is_nested(column.field_type):
            if to_json:
                result.to_json.append(column.name)
                continue
            raise SchemaDriftError(
                f"Column {column.name!r}: the batch has {column.field_type}, the table column is "
                f"{existing.field_type}; serialize it to JSON upstream or enable the sink's to_json "
                "projection"
            )
    fields, have = (
        tuple(f for f in s.fields if f.name not in result.to_json) for s in (incoming, table_schema)
    )
    _fit_fields((), fields, have, result, widen, fill_missing)
    # Docs are re-synced only when the batch's docs changed since the last sync: a no-op re-sync
    # commits nothing, and a doc edited by hand in the catalog stays until the source's doc changes.
    synced = comment_hash(incoming)
    if table_properties.get(COMMENT_HASH_PROPERTY) == synced:
        result.docs = {}
    wanted = sink_properties(prefix, synced, policy)
    result.properties = {k: v for k, v in wanted.items() if table_properties.get(k) != v}
    return result
