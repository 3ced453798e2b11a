"""What the store keeps of a metadata file written but not yet synced."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PendingFile:
    """A metadata file written but not yet synced, kept in the store by the commit that names it
    until it is (catalog/file_settling.py): `owner` is its table's uuid, `data` its bytes."""

    location: str
    owner: str
    data: bytes
