"""A commit's rows netted and paired (events/change_rows.py), against a model: the multiset
difference of the rows it deleted and inserted, each row taken once."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from isbre.catalog.change_types import CHANGE_TYPE
from isbre.events.change_rows import commit_changes, net


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=30))
def test_netting_leaves_the_multiset_difference_each_row_once(read: list[tuple[int, bool]]) -> None:
    rows = pa.table({"v": [value for value, _ in read]}, schema=pa.schema([("v", pa.int64())]))
    inserted = np.array([flag for _, flag in read], dtype=bool)
    deleted, added = net(rows, inserted)
    assert len(set(deleted.tolist())) == len(deleted) and len(set(added.tolist())) == len(added)
    assert not inserted[deleted].any() and inserted[added].all()
    before = Counter(value for value, flag in read if not flag)
    after = Counter(value for value, flag in read if flag)
    assert Counter(rows["v"].take(pa.array(deleted)).to_pylist()) == before - after
    assert Counter(rows["v"].take(pa.array(added)).to_pylist()) == after - before


def test_a_row_id_pairs_an_update_among_equal_rows() -> None:
    """Two equal rows deleted (ids 5 and 6) and the row of id 6 inserted changed: the update is
    the row of id 6, the row of id 5 a delete."""
    rows = pa.table({"v": [1, 1, 2], "_row_id": [5, 6, 6]})
    changes = commit_changes(rows, np.array([False, False, True]), 7, key=[])
    assert [(row["v"], row[CHANGE_TYPE]) for row in changes.to_pylist()] == [
        (1, "delete"),
        (1, "update_before"),
        (2, "update_after"),
    ]
