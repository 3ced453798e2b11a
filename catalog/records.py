"""The commit record: one per durable mutation, numbered by `commit_seq`.

A record carries what a consumer of the log (events, lineage, audits) needs
without loading table metadata.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Any

# Every kind of record the log holds (the events, their filters, lineage and the console go by it).
TABLE_KINDS = ("table.create", "table.commit", "table.register", "table.drop", "table.rename")
# A purge that left files behind says what it left.
PURGE_INCOMPLETE = "table.purge-incomplete"
VIEW_KINDS = ("view.create", "view.replace", "view.register", "view.drop", "view.rename")
NAMESPACE_KINDS = ("namespace.create", "namespace.update", "namespace.drop")
RECORD_KINDS = (*TABLE_KINDS, PURGE_INCOMPLETE, *VIEW_KINDS, *NAMESPACE_KINDS)

# Snapshot-summary counters copied into a record, under snake_case names.
SUMMARY_COUNTERS = (
    "added-data-files",
    "deleted-data-files",
    "added-delete-files",
    "removed-delete-files",
    "added-records",
    "deleted-records",
    "added-files-size",
    "removed-files-size",
    "total-records",
    "total-data-files",
    "total-files-size",
)


def new_run_id(ts_us: int) -> str:
    """A UUIDv7 (time-ordered, as OpenLineage recommends for run ids) for a commit at `ts_us`."""
    value = (ts_us // 1000) << 80 | int.from_bytes(os.urandom(10)) & ((1 << 80) - 1)
    value = value & ~(0xF << 76) | (0x7 << 76)  # version 7
    value = value & ~(0x3 << 62) | (0x2 << 62)  # RFC 4122 variant
    return str(uuid.UUID(int=value))


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass
class CommitRecord:
    kind: str
    namespace: list[str]
    name: str | None = None
    table_uuid: str | None = None
    metadata_location: str | None = None
    previous_metadata_location: str | None = None
    snapshot_id: int | None = None
    parent_snapshot_id: int | None = None
    operation: str | None = None
    schema_id: int | None = None
    summary: dict[str, int] | None = None
    previous: dict[str, Any] | None = None
    properties: dict[str, Any] | None = None
    txn: str | None = None
    txn_size: int | None = None
    warehouse: str | None = None
    actor: str | None = None  # the authenticated principal that asked for it
    job: str | None = None  # the maintenance job that made this commit (catalog/maintenance.py)
    # Stamped by the writer when the record enters the log.
    commit_seq: int = 0
    ts: int = 0
    run_id: str = field(default="")
    # A stamped record never changes, so its JSON is made (or read) once and reused:
    # replaying the log would otherwise spend most of its time re-encoding.
    _json: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def stamp(self, commit_seq: int, ts_us: int) -> None:
        self.commit_seq = commit_seq
        self.ts = ts_us
        self.run_id = new_run_id(ts_us)

    def to_json(self) -> bytes:
        if self._json is None:
            # The fields as they are: dataclasses.asdict would deep-copy them first (a third of
            # what encoding a record cost).
            values = {name: value for name in _RECORD_FIELDS if (value := getattr(self, name)) is not None}
            self._json = json.dumps(values, separators=(",", ":")).encode()
        return self._json

    @classmethod
    def from_json(cls, raw: bytes) -> CommitRecord:
        record = cls(**json.loads(raw))
        record._json = bytes(raw)
        return record


_RECORD_FIELDS = tuple(f.name for f in fields(CommitRecord) if f.name != "_json")


def summary_counters(summary: dict[str, str]) -> dict[str, int]:
    counters = {}
    for key in SUMMARY_COUNTERS:
        if key in summary:
            try:
                counters[key.replace("-", "_")] = int(summary[key])
            except ValueError:
                continue  # a writer put a non-number there; the record just leaves it out
    return counters
