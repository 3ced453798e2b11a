"""Decoded manifest lists and manifests, kept by location for server-side scan planning and for the
appends the catalog makes again.

Iceberg never rewrites a manifest or a manifest list in place (a new one gets a new name), so a
file's location names its content: a plan reads each manifest once, not once per plan. The bound
is in bytes, estimated from each manifest's size on disk (`DECODED_PER_BYTE`), least recently used
first out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from isbre.catalog.lru import Lru
from isbre.catalog.manifest_entries import inherit_first_row_ids, read_entries
from isbre.catalog.manifest_lists import first_row_id, read_manifests
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestEntry, ManifestFile

# What a decoded manifest takes in memory per byte of its Avro file (9.4 to 10.7 measured with
# tracemalloc on PyIceberg-written manifests of 2 and 12 columns; rounded up, so the bound holds).
DECODED_PER_BYTE = 11
# What one manifest of a decoded manifest list (with its partition summaries) takes, in bytes.
LISTED_MANIFEST_BYTES = 1200
# Manifests whose paths are remembered as checked, per table.
CHECKED = 1 << 16


@dataclass(frozen=True)
class _Held:
    decoded: tuple[Any, ...]
    weight: int


def _listed(manifests: tuple[ManifestFile, ...]) -> _Held:
    return _Held(manifests, len(manifests) * LISTED_MANIFEST_BYTES)


class ManifestCache:
    """Every decoded manifest list and manifest a process reads: scan plans' and the appends the
    catalog makes again (catalog/rebase.py), which also keeps the lists it writes."""

    def __init__(self, capacity_bytes: int) -> None:
        self._files: Lru[tuple[str, int], _Held] = Lru(capacity_bytes, weigh=lambda held: held.weight)
        self._checked: Lru[tuple[str, int, str], bool] = Lru(CHECKED)
        self._counts = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def weight(self) -> int:
        """The bytes the cache holds, as estimated."""
        return self._files.weight

    def manifests(self, io: FileIO, manifest_list: str, format_version: int) -> tuple[ManifestFile, ...]:
        """The manifests a manifest list names, in its order (on a v3 table with the row id each
        manifest's first data file inherits)."""

        def read() -> _Held:
            return _listed(tuple(read_manifests(io, manifest_list, format_version)))

        return self._held((manifest_list, -format_version), read)

    def keep(self, manifest_list: str, format_version: int, manifests: tuple[ManifestFile, ...]) -> None:
        """A manifest list this process has just written, kept so that it is not read back."""
        self._files.put((manifest_list, -format_version), _listed(manifests))

    def entries(
        self,
        io: FileIO,
        manifest: ManifestFile,
        owner: str,
        check: Callable[[str], object],
        format_version: int,
        deleted: bool = False,
    ) -> tuple[ManifestEntry, ...]:
        """The manifest's live entries (added or existing; deleted ones too with `deleted`), read in the
        table's format version (v3's fields kept, each data file's first row id inherited as the
        spec says), once its own path and every file it names have passed `check` for the table
        `owner` (each raises what it refuses). A manifest is checked once per table that names
        it, not once per plan: the check resolves every path on disk."""

        def read() -> _Held:
            entries = read_entries(io, manifest, format_version, discard_deleted=not deleted)
            if format_version >= 3:
                inherit_first_row_ids(entries, first_row_id(manifest))
            return _Held(tuple(entries), manifest.manifest_length * DECODED_PER_BYTE)

        key = (manifest.manifest_path, (manifest.manifest_length * 10 + format_version) * 2 + deleted)
        checked = (*key, owner)
        if self._checked.peek(checked) is not None:
            return self._held(key, read)
        check(manifest.manifest_path)
        entries = self._held(key, read)
        for entry in entries:
            check(entry.data_file.file_path)
        self._checked.put(checked, True)
        return entries

    def _held(self, key: tuple[str, int], read: Callable[[], _Held]) -> Any:
        held = self._files.peek(key)
        with self._counts:
            if held is None:
                self.misses += 1
            else:
                self.hits += 1
        if held is None:
            held = read()
            self._files.put(key, held)
        return held.decoded
