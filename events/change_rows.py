"""A change feed's rows: what each commit inserted and deleted, netted and paired.

A commit's tasks read rows it inserted and rows it deleted; a copy-on-write rewrite reads most
rows on both sides (the file it removed and the file it wrote hold them alike). The rows equal on
both sides are netted out, as a multiset: what is left is exactly the difference between the
table before the commit and after it. On a table with identifier fields a key deleted and
inserted by one commit is an update: `update_before` then `update_after`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from isbre.catalog.change_types import (
    CHANGE_TYPE,
    COMMIT_SEQ,
    DELETE,
    INSERT,
    UPDATE_AFTER,
    UPDATE_BEFORE,
)


def change_schema(schema: pa.Schema) -> pa.Schema:
    """A table's columns, then the change's type and its commit."""
    return schema.append(pa.field(CHANGE_TYPE, pa.string(), nullable=False)).append(
        pa.field(COMMIT_SEQ, pa.int64(), nullable=False)
    )


def _groupable(column: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    """`column`, or where Arrow cannot group by its type (lists, structs, maps) a text that is equal
    exactly where its values are."""
    if not pa.types.is_nested(column.type) and not pa.types.is_dictionary(column.type):
        return column
    return pa.array([json.dumps(v, default=str, sort_keys=True) for v in column.to_pylist()], pa.string())


def net(rows: pa.Table, inserted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the positions of `rows` deleted, of those inserted) once equal rows deleted and inserted
    cancel out; `inserted` says of each row whether it was inserted (else deleted)."""
    if not rows.num_rows:
        empty = np.zeros(0, np.int64)
        return empty, empty
    keys = {f"k{number}": _groupable(column) for number, column in enumerate(rows.columns)}
    weights = np.where(inserted, 1, -1).astype(np.int64)
    keyed = pa.table({**keys, "w": weights, "i": np.arange(rows.num_rows, dtype=np.int64)})
    grouped = keyed.group_by(list(keys), use_threads=False).aggregate([("w", "sum"), ("i", "min")])
    weight, first = grouped["w_sum"].to_numpy(), grouped["i_min"].to_numpy()
    deleted = np.sort(np.repeat(first[weight < 0], -weight[weight < 0]))
    added = np.sort(np.repeat(first[weight > 0], weight[weight > 0]))
    return deleted, added


def _pairs(
    rows: pa.Table, deleted: np.ndarray, added: np.ndarray, key: Sequence[str]
) -> list[tuple[int, int]]:
    """Deleted and inserted rows of one key, in order (each row in one pair at most)."""
    if not key or not len(deleted) or not len(added):
        return []

    def keys_of(positions: np.ndarray) -> list[tuple[object, ...]]:
        taken = rows.take(positions)
        return list(zip(*(taken[name].to_pylist() for name in key), strict=True))

    waiting: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for position, found in zip(deleted.tolist(), keys_of(deleted), strict=True):
        waiting[found].append(position)
    pairs = []
    for position, found in zip(added.tolist(), keys_of(added), strict=True):
        if waiting.get(found):
            pairs.append((waiting[found].pop(0), position))
    return pairs


def commit_changes(rows: pa.Table, inserted: np.ndarray, commit_seq: int, key: Sequence[str]) -> pa.Table:
    """The changes of one commit whose tasks read `rows` (inserted or deleted as `inserted` says):
    deletes, then updates (each `update_before` followed by its `update_after`), then inserts."""
    deleted, added = net(rows, inserted)
    pairs = _pairs(rows, deleted, added, key)
    paired = {position for pair in pairs for position in pair}
    order: list[int] = []
    kinds: list[str] = []
    for position in deleted.tolist():
        if position not in paired:
            order.append(position)
            kinds.append(DELETE)
    for before, after in pairs:
        order += [before, after]
        kinds += [UPDATE_BEFORE, UPDATE_AFTER]
    for position in added.tolist():
        if position not in paired:
            order.append(position)
            kinds.append(INSERT)
    return with_change(rows.take(pa.array(order, pa.int64())), kinds, commit_seq)


def with_change(rows: pa.Table, kinds: str | list[str], commit_seq: int) -> pa.Table:
    """`rows` with their change type (one for all, or one each) and commit."""
    count = rows.num_rows
    kind = pa.array([kinds] * count if isinstance(kinds, str) else kinds, pa.string())
    seq = pa.array(np.full(count, commit_seq, dtype=np.int64))
    schema = change_schema(rows.schema)
    return pa.Table.from_arrays([*rows.columns, kind, seq], schema=schema)
