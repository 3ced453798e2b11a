"""Netting rows deleted and inserted by one commit: equal rows on both sides cancel out.

A copy-on-write rewrite removes a file and writes one that holds most of its rows again; the rows
equal on both sides, as a multiset, are not changes. What is left is exactly the difference
between the table before the commit and after it.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _groupable(column: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    """`column`, or where Arrow cannot group by its type (lists, structs, maps) a text that is equal
    exactly where its values are."""
    if not pa.types.is_nested(column.type) and not pa.types.is_dictionary(column.type):
        return column
    return pa.array([json.dumps(v, default=str, sort_keys=True) for v in column.to_pylist()], pa.string())


def net(rows: pa.Table, inserted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the positions of `rows` deleted, of those inserted) once equal rows deleted and inserted
    cancel out; `inserted` says of each row whether it was inserted (else deleted). Of equal rows
    the ones left are the first of the side that had more, each position once."""
    if not rows.num_rows:
        empty = np.zeros(0, np.int64)
        return empty, empty
    keys = {f"k{number}": _groupable(column) for number, column in enumerate(rows.columns)}
    keyed = pa.table({**keys, "i": np.arange(rows.num_rows, dtype=np.int64)})
    members = keyed.group_by(list(keys), use_threads=False).aggregate([("i", "list")])["i_list"]
    lengths = pc.list_value_length(members).to_numpy()
    position = pc.list_flatten(members).to_numpy()
    group = np.repeat(np.arange(len(lengths)), lengths)
    side = np.where(inserted[position], 1, -1)
    weight = np.bincount(group, weights=side, minlength=len(lengths)).astype(np.int64)[group]
    # The rows on the side that had more, by group then position; the first |weight| of each.
    winning = (weight != 0) & (side == np.sign(weight))
    order = np.lexsort((position[winning], group[winning]))
    position, group, weight = position[winning][order], group[winning][order], weight[winning][order]
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if len(group) else np.zeros(0, np.int64)
    rank = np.arange(len(group)) - np.repeat(starts, np.diff(np.r_[starts, len(group)]))
    kept = rank < np.abs(weight)
    return np.sort(position[kept & (weight < 0)]), np.sort(position[kept & (weight > 0)])
