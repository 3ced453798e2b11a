"""A warehouse as configured: its name, its storage root and settings, and where its store is by
default. Read by the server, its helper processes and the job processes alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from isbre.catalog.file_uris import local_path
from isbre.catalog.s3_options import S3Options

STORE_NAME = "isbre.lmdb"


@dataclass(frozen=True)
class Warehouse:
    name: str
    root: str  # a directory path, a file: URI, or s3://bucket/prefix
    s3: S3Options | None = None
    # Properties a new table gets under its own, by namespace (`()`: the whole warehouse).
    table_defaults: Mapping[tuple[str, ...], Mapping[str, str]] = field(default_factory=dict)

    @property
    def on_object_storage(self) -> bool:
        return self.root.startswith("s3://")

    def local_root(self) -> Path | None:
        if self.on_object_storage:
            return None
        return (local_path(self.root) or Path(self.root)).resolve()

    def for_helper(self) -> dict[str, Any]:
        """What a helper process (lineage worker, job process) needs to read and write the
        warehouse's files, as JSON: its name, root and storage settings. Table defaults are for
        creating tables, which helpers never do."""
        return {"name": self.name, "root": self.root, "s3": asdict(self.s3) if self.s3 else None}

    @classmethod
    def in_helper(cls, found: Mapping[str, Any]) -> Warehouse:
        return cls(found["name"], found["root"], S3Options(**(found["s3"] or {})))


def default_store(first: Warehouse) -> Path:
    """`isbre.lmdb` inside a local warehouse, `./isbre.lmdb` when the warehouse is on object storage."""
    root = first.local_root()
    return (root / STORE_NAME) if root is not None else Path(STORE_NAME).resolve()
