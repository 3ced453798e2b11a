"""Table and view metadata files: durable writes and a cache of parsed reads.

A metadata file is written under a fresh name before the pointer that names it
can commit: synced, with its directory (`write_durably`), or, for a table's,
unsynced with its bytes kept in the commit's own transaction until a group of
them is synced (`write_unsynced`, catalog/file_settling.py). Either way a crash
leaves at worst an unreferenced file, never a pointer to a file that cannot be
had whole. Files never change once written, so reads are cached by location.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from isbre.catalog.file_uris import local_path
from isbre.catalog.format_v3 import TableMetadataV3, as_v3
from isbre.catalog.limits import InsufficientStorageError, is_disk_full
from isbre.catalog.lru import Lru
from isbre.catalog.metadata_encoding import table_metadata_json
from isbre.catalog.object_storage import ObjectStorageIO
from isbre.catalog.table_handles import OutsideTableError, TrustedRoots, create_below, unlink_below
from pyiceberg.io import FileIO
from pyiceberg.serializers import Compressor
from pyiceberg.table.metadata import TableMetadata, TableMetadataWrapper
from pyiceberg.view.metadata import ViewMetadata

M = TypeVar("M", TableMetadata, ViewMetadata)
_FORMAT_V3 = re.compile(rb'"format-version"\s*:\s*3\b')


def _fsync(path: Path, flags: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    _fsync(path, os.O_DIRECTORY)


def sync_file(path: Path) -> None:
    """Flush a file another writer (PyArrow) created, and its directory entry, to disk."""
    _fsync(path)
    _fsync_dir(path.parent)


def sync_directories(path: Path, root: Path, synced: set[Path]) -> None:
    """Sync the directory entries from `path`'s directory up to `root`, for directories another
    writer (PyArrow) may have created; each directory once per `synced` set."""
    directory = path.parent
    while directory != root and root in directory.parents and directory not in synced:
        _fsync_dir(directory.parent)
        synced.add(directory)
        directory = directory.parent


def publish_durably(temporary: Path, final: Path) -> None:
    """Sync `temporary`, then rename it to `final` and sync the rename: `final` is whole or absent."""
    _fsync(temporary)
    os.replace(temporary, final)
    _fsync_dir(final.parent)


def make_dirs_durably(directory: Path) -> None:
    """Create `directory` and any missing parents, each synced into its parent: a crash cannot lose
    a directory that a synced file inside it needs."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for new in reversed(missing):
        try:
            new.mkdir()
        except FileExistsError:
            continue  # made meanwhile by another writer; it syncs it
        _fsync_dir(new.parent)


def write_durably(io: FileIO, roots: TrustedRoots, location: str, data: bytes) -> None:
    """Create `location` with `data`, never replacing a file or object; on local disk, synced (file and
    new directories) before returning, reached from the trusted root it lies below through no link
    (catalog/table_handles.py: a table's writer may swap its folders for links to another's);
    on object storage, a conditional PUT.

    Fails with InsufficientStorageError when the disk is full, leaving neither the file nor the
    directories it made; with OutsideTableError where the way passes through a link.
    """
    _write_new(io, roots, location, data, sync=True)


def write_unsynced(io: FileIO, roots: TrustedRoots, location: str, data: bytes) -> bool:
    """`write_durably`, but on local disk without syncing the file (the directories it makes are
    synced): True when the file was left so, and its bytes must be kept until it is synced
    (catalog/file_settling.py); False on object storage, where the PUT is durable."""
    return _write_new(io, roots, location, data, sync=False)


def _write_new(io: FileIO, roots: TrustedRoots, location: str, data: bytes, sync: bool) -> bool:
    path = local_path(location)
    if path is None:
        if isinstance(io, ObjectStorageIO):
            io.create_exclusively(location, data)
            return False
        with io.new_output(location).create(overwrite=False) as stream:
            stream.write(data)
        return False
    reached = roots.reach(path)
    if reached is None:
        raise OutsideTableError(f"{location!r} is under no warehouse or allowed location")
    root, parts = reached
    try:
        make_dirs_durably(root)  # a configured root, trusted: made by name where it is not there yet
        create_below(root, parts, location, data, sync)
    except OSError as exc:
        if is_disk_full(exc):
            raise InsufficientStorageError(
                f"No room left on the warehouse's disk to write {location}"
            ) from exc
        raise
    return not sync


def remove_quietly(io: FileIO, roots: TrustedRoots, location: str) -> None:
    """Best-effort removal of a file that never became reachable (an orphan); on local disk through
    no link, as it was written."""
    with contextlib.suppress(Exception):
        path = local_path(location)
        reached = roots.reach(path) if path is not None else None
        if reached is not None:
            unlink_below(*reached, location)
        elif path is None:
            io.delete(location)


def metadata_json(metadata: TableMetadata | ViewMetadata) -> bytes:
    if isinstance(metadata, ViewMetadata):
        return metadata.model_dump_json(exclude_none=True).encode()
    return table_metadata_json(metadata)


@dataclass(frozen=True)
class Loaded(Generic[M]):
    metadata: M
    json: bytes


class UnreadableMetadataError(Exception):
    """A metadata file the catalog points at is not metadata any more (damaged outside isbre):
    the catalog's failure, not the request's."""


class MetadataCache(Lru[str, Loaded[M]]):
    """Parsed metadata files, keyed by location."""

    def __init__(self, io: FileIO, parse: Callable[[FileIO, str], M], capacity: int = 1024) -> None:
        super().__init__(capacity)
        self._io = io
        self._parse: Callable[[FileIO, str], M] = parse

    def get(self, location: str) -> Loaded[M]:
        entry = self.peek(location)
        if entry is not None:
            return entry
        try:
            metadata = self._parse(self._io, location)
        except ValueError as exc:  # not JSON, or not metadata (pydantic's errors are ValueErrors)
            raise UnreadableMetadataError(
                f"The metadata file {location} cannot be read as metadata ({type(exc).__name__}): it was "
                "damaged outside the catalog"
            ) from exc
        entry = Loaded(metadata, metadata_json(metadata))
        self.put(location, entry)
        return entry


def read_table_metadata(io: FileIO, location: str) -> bytes:
    """A table metadata file's JSON as written (decompressed)."""
    input_file = io.new_input(location)
    with input_file.open() as stream, Compressor.get_compressor(location).stream_decompressor(stream) as raw:
        return raw.read()


def parse_table_metadata(io: FileIO, location: str) -> TableMetadata:
    text = read_table_metadata(io, location)
    if _FORMAT_V3.search(text):  # PyIceberg parses v3 into a model that cannot be written
        return as_v3(TableMetadataV3.model_validate_json(text))
    return TableMetadataWrapper.model_validate_json(text).root


def parse_view_metadata(io: FileIO, location: str) -> ViewMetadata:
    with io.new_input(location).open() as stream:
        raw: Any = json.loads(stream.read())
    return ViewMetadata.model_validate(raw)
