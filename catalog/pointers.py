"""What the store keeps for each table and view: the pointer to its current metadata."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Pointer:
    """What the store keeps for a table or view: where its current metadata is."""

    metadata_location: str
    uuid: str

    def to_json(self) -> bytes:
        return json.dumps({"metadata-location": self.metadata_location, "uuid": self.uuid}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Pointer:
        value = json.loads(raw)
        return cls(value["metadata-location"], value["uuid"])
