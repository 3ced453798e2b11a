"""A commit record as a CloudEvent (CloudEvents 1.0, JSON, structured mode): what the relays send.

The event's `id` is the catalog's id and the commit's `commit_seq`: the same on every try of a
delivery and after a restart, so a receiver (or JetStream's duplicate window) recognizes a message
it already has. `data` is the record as the SSE stream carries it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from isbre.catalog.records import CommitRecord

CONTENT_TYPE = "application/cloudevents+json"
SPEC_VERSION = "1.0"


@dataclass(frozen=True)
class EventSource:
    """Who a catalog's events come from: the store's id, and the name of its first warehouse (the
    records written before a store held several warehouses carry none)."""

    catalog_id: str
    default_warehouse: str

    def event_id(self, commit_seq: int) -> str:
        return f"{self.catalog_id}-{commit_seq}"

    def commit_of(self, event_id: str) -> int | None:
        """The commit_seq an event id of this catalog names; None for another catalog's."""
        catalog, _, seq = event_id.rpartition("-")
        return int(seq) if catalog == self.catalog_id and seq.isdigit() else None

    def cloud_event(self, record: CommitRecord) -> bytes:
        warehouse = record.warehouse or self.default_warehouse
        subject = ".".join([*record.namespace, *([record.name] if record.name is not None else [])])
        envelope = {
            "specversion": SPEC_VERSION,
            "id": self.event_id(record.commit_seq),
            "source": f"urn:isbre:{self.catalog_id}:{warehouse}",
            "type": f"isbre.{record.kind}",
            "subject": subject,
            "time": datetime.fromtimestamp(record.ts / 1e6, UTC).isoformat().replace("+00:00", "Z"),
            "datacontenttype": "application/json",
            "commitseq": record.commit_seq,
        }
        # The record's JSON as it is kept (made once per record), not decoded and made again.
        return (
            json.dumps(envelope, separators=(",", ":")).encode()[:-1] + b',"data":' + record.to_json() + b"}"
        )
