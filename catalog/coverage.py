"""Offset coverage: which source offsets a table already holds.

A sink commits the offsets it wrote in the snapshot summary of the very commit
that carries the rows (`isbre.sink.spans`, a JSON list), so rows and offsets
land or fail together. The catalog indexes those spans per table into
union-merged, gap-aware ranges in the same transaction as the commit; a sink
that writes through another catalog derives the same ranges from the
snapshot summaries with the functions here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyiceberg.table.snapshots import Snapshot

SPANS_PROPERTY = "isbre.sink.spans"

Range = tuple[int, int]


@dataclass(frozen=True, order=True)
class SpanKey:
    """The stream a span of offsets belongs to."""

    source_id: str
    topic: str
    partition: int


@dataclass(frozen=True)
class Span:
    key: SpanKey
    start: int
    end: int  # exclusive

    def to_json(self) -> dict[str, object]:
        return {
            "source-id": self.key.source_id,
            "topic": self.key.topic,
            "partition": self.key.partition,
            "start": self.start,
            "end": self.end,
        }


def check_span(source_id: str, topic: str, partition: int, start: int, end: int) -> None:
    for name, text in (("source id", source_id), ("topic", topic)):
        if not isinstance(text, str) or "\x00" in text:
            raise ValueError(f"A span's {name} must be a string without NUL characters: {text!r}")
    for name, number in (("partition", partition), ("start", start), ("end", end)):
        if type(number) is not int or not 0 <= number < 1 << 63:
            raise ValueError(f"A span's {name} must be an integer in [0, 2^63): {number!r}")
    if end < start:
        raise ValueError(f"A span's end ({end}) is before its start ({start})")


def encode_spans(spans: Iterable[Span]) -> str:
    return json.dumps([span.to_json() for span in spans], separators=(",", ":"))


def declared(summary: Mapping[str, str] | None, name: str, kind: type, what: str) -> Any:
    """The JSON value of a sink's declaration `name` in a snapshot summary (None when absent);
    ValueError unless it is a `kind` (`what` says of what)."""
    raw = (summary or {}).get(name)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is not JSON: {e}") from None
    if not isinstance(value, kind):
        raise ValueError(f"{name} must be a JSON {what}")
    return value


def spans_from_summary(summary: Mapping[str, str] | None) -> list[Span]:
    """The spans a snapshot summary declares; ValueError if the declaration is malformed."""
    entries = declared(summary, SPANS_PROPERTY, list, "list of spans") or []
    spans = []
    for entry in entries:
        try:
            values = (entry["source-id"], entry["topic"], entry["partition"], entry["start"], entry["end"])
        except (TypeError, KeyError) as e:
            raise ValueError(f"{SPANS_PROPERTY}: a span lacks {e}") from None
        check_span(*values)
        spans.append(Span(SpanKey(*values[:3]), values[3], values[4]))
    return spans


def snapshot_spans(snapshot: Snapshot) -> list[Span]:
    return spans_from_summary(snapshot.summary.additional_properties if snapshot.summary else None)


def merge(ranges: Iterable[Range]) -> list[Range]:
    """Union of half-open ranges, sorted; touching ranges join, empty ones vanish."""
    merged: list[list[int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def gaps(ranges: list[Range]) -> list[Range]:
    """What is missing between the covered ranges (not before the first or after the last)."""
    return [(ranges[i][1], ranges[i + 1][0]) for i in range(len(ranges) - 1)]


class Coverage:
    """Covered ranges per stream, as a plain in-memory map."""

    def __init__(self, ranges: Mapping[SpanKey, list[Range]] | None = None) -> None:
        self.ranges: dict[SpanKey, list[Range]] = {k: merge(v) for k, v in (ranges or {}).items()}

    def add(self, span: Span) -> None:
        self.ranges[span.key] = merge([*self.ranges.get(span.key, []), (span.start, span.end)])

    @classmethod
    def from_summaries(cls, summaries: Iterable[Mapping[str, str] | None]) -> Coverage:
        coverage = cls()
        for summary in summaries:
            for span in spans_from_summary(summary):
                coverage.add(span)
        return coverage

    def of(self, key: SpanKey) -> list[Range]:
        return self.ranges.get(key, [])

    def overlaps(self, span: Span) -> bool:
        """Whether any offset of `span` is covered already."""
        return any(start < span.end and span.start < end for start, end in self.of(span.key))

    def to_json(self) -> list[dict[str, object]]:
        return [
            {
                "source-id": key.source_id,
                "topic": key.topic,
                "partition": key.partition,
                "ranges": [list(r) for r in ranges],
                "gaps": [list(g) for g in gaps(ranges)],
            }
            for key, ranges in sorted(self.ranges.items())
        ]

    @classmethod
    def from_json(cls, entries: list[dict[str, Any]]) -> Coverage:
        return cls(
            {
                SpanKey(e["source-id"], e["topic"], e["partition"]): [tuple(r) for r in e["ranges"]]
                for e in entries
            }
        )
