"""What a table writer holds between taking rows and committing them, and the offset arithmetic
it decides with: which offsets a span's coverage already holds, which spans a commit carries."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from isbre.catalog.coverage import Span, SpanKey
from isbre.sinks.contract import OffsetSpan, SourceFields


@dataclass(frozen=True)
class Prepared:
    """Rows taken for the next commit, stamped when their file is written: those of `batch` that
    `keep` selects (all with None), one offset each; the copy a selection makes is left to the
    write thread, which has a core of its own."""

    batch: pa.RecordBatch
    keep: pa.Array | None
    span: OffsetSpan
    offsets: np.ndarray
    source: SourceFields | None
    received: pa.Scalar
    to_json: list[str]

    @property
    def rows(self) -> int:
        return len(self.offsets)

    @property
    def nbytes(self) -> int:
        """About the Arrow bytes of the rows taken."""
        return self.batch.nbytes * self.rows // max(1, self.batch.num_rows)

    def selected(self) -> tuple[pa.RecordBatch, SourceFields | None]:
        if self.keep is None:
            return self.batch, self.source
        return self.batch.filter(self.keep), self.source.filter(self.keep) if self.source else None


def covered_offsets(ranges: Sequence[tuple[int, int]], offsets: np.ndarray) -> np.ndarray:
    """Per offset, whether one of the sorted, disjoint `ranges` holds it."""
    if not ranges:
        return np.zeros(len(offsets), dtype=bool)
    starts = np.array([r[0] for r in ranges], dtype=np.int64)
    ends = np.array([r[1] for r in ranges], dtype=np.int64)
    index = np.searchsorted(starts, offsets, side="right") - 1
    return (index >= 0) & (offsets < ends[np.maximum(index, 0)])


def broken_rows(errors: np.ndarray, offsets: np.ndarray) -> str:
    """What `contract_errors` found, one clause per error with how many rows and their offsets."""
    said = []
    for error in dict.fromkeys(e for e in errors if e is not None):
        at = offsets[errors == error]
        shown = ", ".join(map(str, at[:5])) + (", ..." if len(at) > 5 else "")
        said.append(f"{error}: {len(at)} rows (offsets {shown})")
    return "; ".join(said)


def spans_of(key: SpanKey, ranges: Iterable[tuple[int, int]]) -> list[Span]:
    return [Span(key, s, e) for s, e in ranges]


def inside(ranges: Sequence[tuple[int, int]], start: int, end: int) -> bool:
    return start == end or any(s <= start and end <= e for s, e in ranges)
