"""What a sink's commit did with the rows it was given, counted by disposition and reason.

A sink declares the counts of each commit in its snapshot summary (`isbre.sink.rows`, a JSON
object of counts), beside the spans it covers, and only for rows its table did not hold yet: a
replay counts nothing twice. The catalog adds them to the table's running totals in the same
transaction as the commit, as it does the spans.

The names are `accepted`, `annotated` (landed, flagged by a failed rule), and
`quarantined.<reason>` and `shed.<reason>` (diverted to the quarantine; of those, dropped by a
quarantine that could not keep up), reasons being `decode`, `contract`, `dq` and
`retry-exhausted`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from isbre.catalog.coverage import declared

if TYPE_CHECKING:
    from pyiceberg.table.snapshots import Snapshot

ROWS_PROPERTY = "isbre.sink.rows"
ACCEPTED = "accepted"
ANNOTATED = "annotated"
REASONS = ("decode", "contract", "dq", "retry-exhausted")
DISPOSITIONS = (ACCEPTED, ANNOTATED, *(f"{kind}.{r}" for kind in ("quarantined", "shed") for r in REASONS))


def encode_rows(rows: Mapping[str, int]) -> str:
    return json.dumps({name: count for name, count in sorted(rows.items()) if count}, separators=(",", ":"))


def rows_from_summary(summary: Mapping[str, str] | None) -> dict[str, int]:
    """The counts a snapshot summary declares; ValueError if the declaration is malformed."""
    counts: dict[str, int] = declared(summary, ROWS_PROPERTY, dict, "object of row counts") or {}
    for name, count in counts.items():
        if name not in DISPOSITIONS:
            raise ValueError(f"{ROWS_PROPERTY}: {name!r} is not one of {', '.join(DISPOSITIONS)}")
        if type(count) is not int or not 0 <= count < 1 << 63:
            raise ValueError(f"{ROWS_PROPERTY}: the count of {name!r} must be an integer in [0, 2^63)")
    return counts


def snapshots_rows(snapshots: Iterable[Snapshot]) -> dict[str, int]:
    """The counts `snapshots` declare, summed."""
    summed: Counter[str] = Counter()
    for snapshot in snapshots:
        summed.update(rows_from_summary(snapshot.summary.additional_properties if snapshot.summary else None))
    return dict(summed)


@dataclass(frozen=True)
class SinkRows:
    """A sink table's running totals, under the name it had at its latest commit that declared
    counts (a table renamed since keeps its old name here until its sink commits again)."""

    table_uuid: str
    warehouse: str
    table: str  # namespace and name, dotted
    rows: dict[str, int]

    def plus(self, later: SinkRows) -> SinkRows:
        summed = Counter(self.rows)
        summed.update(later.rows)
        return SinkRows(self.table_uuid, later.warehouse, later.table, dict(sorted(summed.items())))

    def to_json(self) -> bytes:
        return json.dumps(
            {"warehouse": self.warehouse, "table": self.table, "rows": self.rows}, separators=(",", ":")
        ).encode()

    @classmethod
    def from_json(cls, table_uuid: str, raw: bytes | str) -> SinkRows:
        found = json.loads(raw)
        return cls(table_uuid, found["warehouse"], found["table"], found["rows"])
