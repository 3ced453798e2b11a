"""Keyed sinks: a row pushed replaces the row of its key, a key deleted leaves none.

A keyed sink (`IcebergSink(catalog, "ns.t", key=["id"])`) commits, beside the rows of a commit, one
equality delete file holding every key the commit touched. Iceberg applies an equality delete to
the rows of earlier commits only (a data sequence number below its own), so the commit's rows
replace the older rows of their keys and a deleted key keeps none, for every reader that applies
equality deletes (Spark, Flink, Trino, DuckDB; PyIceberg 0.12 reads none). Within one commit the
last change of a key wins: a row pushed and then deleted is not written, a row deleted and then
pushed is, and of two rows of one key the later stays.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from isbre.catalog.table_properties import location_provider
from isbre.sinks.contract import SinkError
from isbre.sinks.pending import Prepared
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.typedef import Record
from pyiceberg.types import DoubleType, FloatType, PrimitiveType

# The rank of a change within a commit: not a column of the table.
_ORDER = "__isbre_change_order"


class KeyedChanges:
    """The changes of one commit of a keyed sink, in the order they were pushed."""

    def __init__(self, key: Sequence[str]) -> None:
        if isinstance(key, str) or not key or len(set(key)) != len(key):
            raise ValueError(f"key is a list of distinct column names, not {key!r}")
        self.key = tuple(key)
        self._keys: list[pa.Table] = []  # per change, the keys of its rows
        self._rows: list[Prepared | None] = []  # per change, its rows (None: a delete)
        self._schema: pa.Schema | None = None  # of the rows of this commit

    def __bool__(self) -> bool:
        return bool(self._keys)

    def field_ids(self, table: Table) -> list[int]:
        """The key's field ids in `table`, whose rows it must name (SinkError for a key it cannot)."""
        if table.metadata.format_version != 2:
            raise SinkError(
                f"a keyed sink writes equality deletes to format version 2 tables; "
                f"{table.name()} is version {table.metadata.format_version}"
            )
        if not table.metadata.spec().is_unpartitioned():
            raise SinkError(f"a keyed sink writes to unpartitioned tables; {table.name()} is partitioned")
        schema, ids = table.schema(), []
        for name in self.key:
            field = schema.find_field(name)  # ValueError naming it when there is none
            kind = field.field_type
            if not isinstance(kind, PrimitiveType) or isinstance(kind, FloatType | DoubleType):
                raise SinkError(f"key column {name!r} is {kind}: a key is of a primitive, not floating, type")
            ids.append(field.field_id)
        return ids

    def create(
        self, catalog: Catalog, identifier: str, schema: pa.Schema, properties: dict[str, str]
    ) -> Table:
        """The keyed sink's new table, its key its identifier fields (as Flink's upsert tables and
        Spark's merges read a row's identity): required columns, in the create's one commit."""
        required = pa.schema([f.with_nullable(False) if f.name in self.key else f for f in schema])
        transaction = catalog.create_table_transaction(identifier, schema=required, properties=properties)
        with transaction.update_schema() as update:
            update.set_identifier_fields(*self.key)
        transaction.commit_transaction()
        # Loaded, not the transaction's staged table: a staged table cannot be refreshed, so the
        # first commit after this one that loses a race would fail instead of being made again.
        return catalog.load_table(identifier)

    def upsert(self, prepared: Prepared) -> None:
        if self._schema is None:
            self._schema = prepared.batch.schema
        elif self._schema != prepared.batch.schema:
            raise SinkError("a keyed sink takes rows of one schema per commit: finish() before new columns")
        rows, _ = prepared.selected()
        self._take(pa.Table.from_batches([rows]), prepared)

    def delete(self, keys: pa.Table | pa.RecordBatch, taken: np.ndarray) -> None:
        """The keys `taken` selects of `keys` (those whose offsets were not covered yet)."""
        if taken.any():
            table = pa.Table.from_batches([keys]) if isinstance(keys, pa.RecordBatch) else keys
            self._take(table.filter(pa.array(taken)), None)

    def _take(self, rows: pa.Table, prepared: Prepared | None) -> None:
        missing = [name for name in self.key if name not in rows.column_names]
        if missing:
            raise SinkError(f"rows of a keyed sink carry its key; these lack {missing}")
        keys = rows.select(list(self.key))
        keys = pa.table(keys.columns, names=list(self.key))  # of any nullability, to concatenate
        if any(column.null_count for column in keys.columns):
            raise SinkError(f"a key ({', '.join(self.key)}) is null: a keyed sink cannot match it")
        self._keys.append(keys)
        self._rows.append(prepared)

    def settle(self) -> tuple[list[Prepared], pa.Table]:
        """The rows to write (of each key, its last change when that is a row) and the distinct
        keys to delete from earlier commits; the changes are forgotten."""
        sizes = [keys.num_rows for keys in self._keys]
        starts = np.concatenate([[0], np.cumsum(sizes)])
        ranked = pa.concat_tables(self._keys, promote_options="permissive")
        ranked = ranked.append_column(_ORDER, pa.array(np.arange(starts[-1])))
        last = ranked.group_by(list(self.key)).aggregate([(_ORDER, "max")])
        winners = last.column(f"{_ORDER}_max")
        written = []
        for start, size, prepared in zip(starts, sizes, self._rows, strict=False):
            if prepared is None:
                continue
            wins = pc.is_in(pa.array(np.arange(start, start + size)), value_set=winners)
            if (kept := _narrowed(prepared, np.asarray(wins, dtype=bool))) is not None:
                written.append(kept)
        self.clear()
        return written, last.drop_columns([f"{_ORDER}_max"])

    def clear(self) -> None:
        self._keys, self._rows, self._schema = [], [], None


def _narrowed(prepared: Prepared, wins: np.ndarray) -> Prepared | None:
    """`prepared` with only the rows `wins` selects of those it took; None when none are left."""
    if wins.all():
        return prepared
    if not wins.any():
        return None
    taken = np.asarray(prepared.keep, dtype=bool) if prepared.keep is not None else None
    rows = np.flatnonzero(taken) if taken is not None else np.arange(prepared.batch.num_rows)
    keep = np.zeros(prepared.batch.num_rows, dtype=bool)
    keep[rows[wins]] = True
    return Prepared(
        prepared.batch,
        pa.array(keep),
        prepared.span,
        prepared.offsets[wins],
        prepared.source,
        prepared.received,
        prepared.to_json,
    )


def equality_delete_file(table: Table, keys: pa.Table, field_ids: Sequence[int]) -> DataFile:
    """An equality delete file in the table's data folder deleting every row whose key is one of
    `keys` (columns named as the key, each carrying its field id as Parquet's field_id)."""
    columns = table.schema().as_arrow()
    fields = [
        pa.field(name, columns.field(name).type, False, {b"PARQUET:field_id": str(field_id).encode()})
        for name, field_id in zip(keys.column_names, field_ids, strict=True)
    ]
    metadata = table.metadata
    location = location_provider(metadata.location, metadata.properties).new_data_location(
        data_file_name=f"00000-0-{uuid.uuid4()}-deletes.parquet"
    )
    output = table.io.new_output(location)
    with output.create(overwrite=True) as stream:
        pq.write_table(keys.cast(pa.schema(fields)), stream)
    found = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=keys.num_rows,
        file_size_in_bytes=len(output),
        equality_ids=list(field_ids),
        sort_order_id=None,
        key_metadata=None,
    )
    found.spec_id = metadata.default_spec_id
    return found
