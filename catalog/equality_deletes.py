"""Equality deletes applied to rows, as the spec says: a row is deleted when its values of a delete
file's columns equal those of one of the file's rows, a null equal to a null.

PyIceberg 0.12 applies position deletes and deletion vectors and refuses equality deletes; tables
an upsert sink writes hold them. A change feed (events/change_reads.py) and compaction
(catalog/compaction_files.py) read such tables with these.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from isbre.catalog.lru import Lru
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema

FIELD_ID = b"PARQUET:field_id"


def deleted_keys(io: FileIO, schema: Schema, path: str, equality_ids: Sequence[int]) -> pa.Table:
    """The equality delete file's rows, its columns named as `schema` names their fields."""
    with io.new_input(path).open() as stream:
        found = pq.read_table(stream)
    columns, names = [], []
    for number, field in enumerate(found.schema):
        field_id = int((field.metadata or {}).get(FIELD_ID, b"-1"))
        if field_id in equality_ids:
            columns.append(found.column(number))
            names.append(schema.find_column_name(field_id))
    if len(names) != len(equality_ids) or None in names:
        raise ValueError(f"{path}: its columns are not the fields its equality ids name")
    return pa.Table.from_arrays(columns, names=names)


# What the delete files' rows kept by one DeletedKeys may take in memory, Arrow's count.
KEPT_KEYS_BYTES = 64 << 20


class DeletedKeys:
    """Equality delete files' rows, each file read once while it is kept (by path: a file never
    changes; least recently used out past `capacity` bytes), in the names `schema` gives their
    fields."""

    def __init__(self, io: FileIO, schema: Schema, capacity: int = KEPT_KEYS_BYTES) -> None:
        self.io = io  # a feed gives each plan's: credentials vended with a table may expire
        self._schema = schema
        self._read: Lru[str, pa.Table] = Lru(capacity, weigh=lambda keys: keys.nbytes)

    @property
    def schema_id(self) -> int:
        return self._schema.schema_id

    def matched(self, rows: pa.Table, files: Sequence[tuple[str, Sequence[int]]]) -> np.ndarray:
        """Which of `rows` one of the equality delete `files` (path, equality ids) deletes."""
        by_columns: dict[tuple[str, ...], list[pa.Table]] = {}
        for path, equality_ids in files:
            found = self._read.peek(path)
            if found is None:
                found = deleted_keys(self.io, self._schema, path, equality_ids)
                self._read.put(path, found)
            by_columns.setdefault(tuple(found.column_names), []).append(found)
        hit = np.zeros(rows.num_rows, dtype=bool)
        for tables in by_columns.values():
            hit |= _matched(rows, pa.concat_tables(tables, promote_options="permissive"))
        return hit


def _matched(rows: pa.Table, keys: pa.Table) -> np.ndarray:
    """Which of `rows` hold values of `keys`' columns equal to one of its rows (null equals null)."""
    if not rows.num_rows or not keys.num_rows:
        return np.zeros(rows.num_rows, dtype=bool)
    if keys.num_columns == 1:
        name = keys.column_names[0]
        deleted = keys.column(0).cast(rows.schema.field(name).type)
        found = pc.is_in(rows[name], value_set=pa.concat_arrays(deleted.chunks), skip_nulls=False)
        return found.to_numpy(zero_copy_only=False)
    gone = set(zip(*(keys[name].to_pylist() for name in keys.column_names), strict=True))
    values = zip(*(rows[name].to_pylist() for name in keys.column_names), strict=True)
    return np.array([each in gone for each in values], dtype=bool)
