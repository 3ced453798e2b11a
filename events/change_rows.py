"""A change feed's rows: what each commit inserted and deleted, netted and paired.

A commit's tasks read rows it inserted and rows it deleted; a copy-on-write rewrite reads most
rows on both sides (the file it removed and the file it wrote hold them alike). The rows equal on
both sides are netted out, as a multiset: what is left is exactly the difference between the
table before the commit and after it. A row deleted and inserted by one commit under one identity
is an update, `update_before` then `update_after`: on format v3 its `_row_id` (row lineage, where
the writer kept it), then the table's identifier fields.
"""

from __future__ import annotations

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
from isbre.catalog.row_lineage import ROW_ID
from isbre.catalog.row_netting import net


def change_schema(schema: pa.Schema) -> pa.Schema:
    """A table's columns, then the change's type and its commit."""
    return schema.append(pa.field(CHANGE_TYPE, pa.string(), nullable=False)).append(
        pa.field(COMMIT_SEQ, pa.int64(), nullable=False)
    )


def _pairs(
    rows: pa.Table, deleted: np.ndarray, added: np.ndarray, key: Sequence[str]
) -> list[tuple[int, int]]:
    """Deleted and inserted rows of one key, in order (each row in one pair at most; a key with
    a null in it pairs nothing)."""
    if not key or not len(deleted) or not len(added):
        return []

    def keys_of(positions: np.ndarray) -> list[tuple[object, ...]]:
        taken = rows.take(positions)
        return list(zip(*(taken[name].to_pylist() for name in key), strict=True))

    waiting: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for position, found in zip(deleted.tolist(), keys_of(deleted), strict=True):
        if None not in found:
            waiting[found].append(position)
    pairs = []
    for position, found in zip(added.tolist(), keys_of(added), strict=True):
        if waiting.get(found):
            pairs.append((waiting[found].pop(0), position))
    return pairs


def commit_changes(rows: pa.Table, inserted: np.ndarray, commit_seq: int, key: Sequence[str]) -> pa.Table:
    """The changes of one commit whose tasks read `rows` (inserted or deleted as `inserted` says):
    deletes, then updates (each `update_before` followed by its `update_after`), then inserts.
    Where `rows` carry their `_row_id` (format v3 row lineage), a row deleted and inserted under
    one id is an update first; the identifier fields `key` pair the rows left."""
    lineage = rows.select([ROW_ID.name]) if ROW_ID.name in rows.column_names else None
    if lineage is not None:
        rows = rows.drop_columns([ROW_ID.name])
    deleted, added = net(rows, inserted)
    pairs = _pairs(lineage, deleted, added, [ROW_ID.name]) if lineage is not None else []
    paired = {position for pair in pairs for position in pair}
    pairs += _pairs(
        rows,
        np.array([p for p in deleted.tolist() if p not in paired], np.int64),
        np.array([p for p in added.tolist() if p not in paired], np.int64),
        key,
    )
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
