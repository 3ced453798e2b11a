"""A table-to-table hop: the rows a feed hands over (`isbre.events.TableFeed`), through a transform,
into an isbre sink, each source row exactly once across a crash at any point.

The sink's own coverage index carries where the hop is: the rows a batch of source commits
(after `a`, up to `b`) appended are pushed under the offsets of one block per commit,
`[(a + 1) * BLOCK, (b + 1) * BLOCK)`, which the sink commits with the rows. The feed's cursor is
stored after that. A hop that dies between the two finds, on its next start, that the sink already
holds up to `b`, and moves the cursor there instead of handing the rows over again.

A change feed's rows go to a keyed sink as what they are: inserts and updates' new rows pushed,
deletes and updates' old rows deleted by key, in order, each at its offset.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from isbre.catalog.change_types import CHANGE_TYPE, COMMIT_SEQ, DELETE, UPDATE_BEFORE
from isbre.catalog.coverage import SpanKey
from isbre.sinks.contract import OffsetSpan
from isbre.sinks.iceberg import IcebergSink
from pyiceberg.exceptions import NoSuchTableError

# Offsets of one source commit's rows: a block this large per commit (so a commit may carry up to
# 16,777,216 rows into one hop; commit numbers up to 2**39 fit an offset).
BLOCK = 1 << 24
TOPIC = "commits"
# The snapshot properties OpenLineage's mapping reads (docs/lineage.md).
INPUTS = "isbre.lineage.inputs"
COLUMN_LINEAGE = "isbre.lineage.column-lineage"


class Feed(Protocol):
    """What a hop needs of a feed (`TableFeed` is one)."""

    table: str
    position: int
    changes: bool  # each row one change, with its _change_type (events/change_rows.py)

    @property
    def table_uuid(self) -> str: ...

    def read(self, timeout: float | None = None) -> pa.Table: ...

    def commit(self) -> None: ...


class Transform(Protocol):
    """Rows in, rows out; `column_lineage()`: each output column's input columns (None: unknown)."""

    def apply(self, rows: pa.Table) -> pa.Table: ...

    def column_lineage(self) -> dict[str, list[str]] | None: ...


@dataclass(frozen=True)
class Unchanged:
    """The transform that passes every row on as it is."""

    def apply(self, rows: pa.Table) -> pa.Table:
        return rows

    def column_lineage(self) -> dict[str, list[str]] | None:
        return None


class HopTooLargeError(ValueError):
    """A batch of source commits gave more rows than their offsets can number."""


def pipe(
    feed: Feed,
    transform: Transform | None,
    sink: IcebergSink,
    *,
    until: Callable[[], bool] = lambda: False,
    timeout: float = 1.0,
) -> None:
    """Hand every row the feed reads, transformed, to the sink, until `until()` is true. Each sink
    commit names the source table as its OpenLineage input, with the transform's column lineage."""
    transform = transform or Unchanged()
    _declare_lineage(feed, transform, sink)
    key = SpanKey(feed.table_uuid, TOPIC, 0)
    while not until():
        held = _held(sink, key)
        if held > feed.position:  # the sink has it: the last hop died before storing the cursor
            feed.position = held
            feed.commit()
        start = feed.position
        rows = feed.read(timeout)
        if feed.position == start:
            continue
        out = transform.apply(rows) if rows.num_rows else rows
        first, end = (start + 1) * BLOCK, (feed.position + 1) * BLOCK
        if out.num_rows > end - first:
            raise HopTooLargeError(
                f"{out.num_rows} rows from commits {start + 1} to {feed.position}: too many"
            )
        if out.num_rows and (
            _changes(sink, out, key, first, end) if feed.changes else _rows(sink, out, key, first, end)
        ):
            sink.finish()
        feed.commit()


def _rows(sink: IcebergSink, out: pa.Table, key: SpanKey, first: int, end: int) -> bool:
    batch = out.combine_chunks().to_batches()[0]
    offsets = np.arange(first, first + out.num_rows, dtype=np.int64)
    sink.push(batch, OffsetSpan(key.source_id, TOPIC, 0, first, end), offsets=offsets)
    return True


def _changes(sink: IcebergSink, out: pa.Table, key: SpanKey, first: int, end: int) -> bool:
    """Hand a change feed's rows over in order: inserts and updates' new rows pushed, deletes and
    updates' old rows deleted by key, each at its offset; whether anything was handed over (a
    delete before the target exists deletes nothing)."""
    keyed = sink.writer.keyed
    if keyed is None:
        raise ValueError(f"a change feed's rows go to a keyed sink (key=[...]), not {sink.writer.identifier}")
    if CHANGE_TYPE not in out.column_names:
        raise ValueError(f"the transform of a change feed's rows keeps their {CHANGE_TYPE} column")
    removing = pc.is_in(out[CHANGE_TYPE], pa.array([DELETE, UPDATE_BEFORE])).to_numpy(zero_copy_only=False)
    rows = out.drop_columns([c for c in (CHANGE_TYPE, COMMIT_SEQ) if c in out.column_names]).combine_chunks()
    if not _exists(sink):
        # Nothing to delete from: each key ends as its last change leaves it.
        keys = list(zip(*(rows[name].to_pylist() for name in keyed.key), strict=True))
        last = {found: position for position, found in enumerate(keys)}
        kept = np.array(sorted(i for i in last.values() if not removing[i]), dtype=np.int64)
        if not len(kept):
            return False
        span = OffsetSpan(key.source_id, TOPIC, 0, first, end)
        sink.push(rows.take(kept).to_batches()[0], span, offsets=first + kept)
        return True
    cuts = [0, *(np.flatnonzero(removing[1:] != removing[:-1]) + 1).tolist(), len(removing)]
    for i, j in itertools.pairwise(cuts):
        span = OffsetSpan(key.source_id, TOPIC, 0, first + i, end if j == len(removing) else first + j)
        offsets = np.arange(first + i, first + j, dtype=np.int64)
        if removing[i]:
            sink.delete(rows.slice(i, j - i).select(list(keyed.key)), span, offsets=offsets)
        else:
            sink.push(rows.slice(i, j - i).to_batches()[0], span, offsets=offsets)
    return True


def _exists(sink: IcebergSink) -> bool:
    try:
        sink.writer.coverage()
    except NoSuchTableError:
        return False
    return True


def _held(sink: IcebergSink, key: SpanKey) -> int:
    """The last source commit whose rows the sink holds (-1: none)."""
    try:
        ranges = sink.writer.coverage().of(key)
    except NoSuchTableError:  # the sink makes its table with its first rows
        return -1
    return max((end for _, end in ranges), default=0) // BLOCK - 1


def _declare_lineage(feed: Feed, transform: Transform, sink: IcebergSink) -> None:
    properties = sink.writer.snapshot_properties
    properties[INPUTS] = json.dumps([feed.table])
    columns = transform.column_lineage()
    if columns is not None:
        declared = {
            out: [{"table": feed.table, "field": name} for name in names] for out, names in columns.items()
        }
        properties[COLUMN_LINEAGE] = json.dumps(declared)
