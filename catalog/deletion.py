"""The one way isbre reaches a table's files to delete (and, for its jobs, to read and write) them:
confined to the table's own places.

Every path a purge deletes comes from metadata a client wrote, so each is turned, once, into the
exact thing that is removed (a path below a trusted root, or a bucket and key) and that same value
is judged and used. On local disk a table's place must lie below a root where tables may live (a
warehouse, an allowed location), which is resolved once, and away from the store's files; a file
is then reached from the root's handle one folder at a time without following any symbolic link
(catalog/table_handles.py), so nothing the kernel resolves can lead out of the table, even if a
folder is swapped for a link after a check. A link planted as a file is removed itself, never
what it points at.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from isbre.catalog.file_uris import file_uri
from isbre.catalog.locations import LocationNotAllowedError, inside, normalized
from isbre.catalog.object_storage import ObjectStorageIO
from isbre.catalog.s3_options import s3_object
from isbre.catalog.table_handles import (
    OutsideTableError,
    TrustedRoots,
    directory,
    files_below,
    local_place,
    remove_empty_below,
    unlink_below,
)
from pyiceberg.io import FileIO

__all__ = ["OutsideTableError", "TableFiles", "delete_each"]


# A local file of a table: the resolved root it lies below, and the folders and name down to it.
Reached = tuple[Path, tuple[str, ...]]


@dataclass(frozen=True)
class _Place:
    location: str  # normalized
    local: Path | None  # its path as written, on local disk
    root: Path | None  # the resolved root it lies below, on local disk
    parts: tuple[str, ...] = ()  # the folders from that root down to it


class TableFiles:
    """Reaches files of one table, and nothing else.

    `places`: where the table's files go (its location, and its `write.metadata.path` if set);
    `roots`: where tables may live (normalized locations); `protected`: the store's own files;
    `claimed_by_other(location)`: whether another table or view holds that place."""

    def __init__(
        self,
        io: FileIO,
        places: Iterable[str],
        roots: Iterable[str],
        protected: Iterable[str] = (),
        claimed_by_other: Callable[[str], bool] = lambda _: False,
    ) -> None:
        self._io = io
        self._claimed_by_other = claimed_by_other
        self._roots = TrustedRoots(roots)
        guarded = [Path(os.path.realpath(p)) for p in map(local_place, protected) if p is not None]
        self._places = [self._judged(place, guarded) for place in places]
        self.location = self._places[0].location
        self._claimed_directories: dict[str, bool] = {}

    def _judged(self, location: str, protected: list[Path]) -> _Place:
        found = normalized(location)
        local = local_place(found)
        if local is None:
            if not found.startswith("s3://") or not isinstance(self._io, ObjectStorageIO):
                raise OutsideTableError(f"isbre deletes files on local disk and S3 only, not at {location!r}")
            return _Place(found, None, None)
        below = self._roots.reach(local)
        if below is None:
            raise OutsideTableError(f"The table's place {location!r} lies outside the warehouse")
        root, parts = below
        reached = root.joinpath(*parts)
        for place in protected:
            if reached == place or place in reached.parents or reached in place.parents:
                raise OutsideTableError(f"The table's place {location!r} is in or around the store")
        return _Place(found, local, root, parts)

    def place_of(self, path: str, remembered: bool = False) -> tuple[_Place, str]:
        """The place of the table that `path` lies under, and `path` normalized; OutsideTableError
        if it is not the table's (outside its places, another table's or view's, or spelled so that
        some reader could take it for another place). `remembered`: whether another object holds
        the file's directory may be answered from an earlier look at the same directory (a job
        reading thousands of files of a few directories asks the store once for each)."""
        try:
            found = normalized(path, literal_percent=True)
        except LocationNotAllowedError as exc:
            raise OutsideTableError(str(exc)) from exc
        place = next((p for p in self._places if inside(found, p.location) and found != p.location), None)
        if place is None or self._claimed(found, remembered):
            raise OutsideTableError(f"{path!r} is not under the table's places ({self.location}, ...)")
        if place.root is None:
            bucket, key = s3_object(found)
            root_bucket, root_key = s3_object(place.location)
            if bucket != root_bucket or not key.startswith(root_key + "/"):
                raise OutsideTableError(f"{path!r} is not under the table's location {place.location}")
        return place, found

    def _claimed(self, found: str, remembered: bool) -> bool:
        # Another object holds a file when its place is the file's directory or above it: the same
        # answer for every file of one directory.
        directory = found.rsplit("/", 1)[0]
        if not remembered or directory not in self._claimed_directories:
            self._claimed_directories[directory] = self._claimed_by_other(found)
        return self._claimed_directories[directory]

    def reach(self, path: str, remembered: bool = True) -> Reached | None:
        """The root a local file of the table is reached from, and the folders and name down to it
        (None on S3); OutsideTableError if `path` is not the table's."""
        place, found = self.place_of(path, remembered)
        if place.root is None:
            return None
        local = local_place(found, literal_percent=True)
        assert local is not None and place.local is not None
        return place.root, place.parts + local.relative_to(place.local).parts

    def check(self, path: str) -> str:
        """`path` if the table's job may read or write it: under one of its places, and on local disk
        through no link as far as its folders exist. OutsideTableError if not."""
        below = self.reach(path)
        if below is not None:
            try:
                with directory(below[0], below[1][:-1], path):
                    pass
            except FileNotFoundError:
                pass  # a folder a write will make
        return path

    def delete(self, path: str) -> None:
        """Delete `path` if it is the table's: OutsideTableError if not, FileNotFoundError if gone."""
        below = self.reach(path, remembered=False)
        if below is None:
            assert isinstance(self._io, ObjectStorageIO)
            self._io.delete_key(*s3_object(normalized(path)))
            return
        unlink_below(*below, path)

    def names_in(self, folder: str) -> list[str]:
        """The names in the table's local folder `folder` (a place or below one)."""
        below = self.reach(f"{folder.rstrip('/')}/listed")  # a name in it: the folder is its parent
        if below is None:
            raise OutsideTableError(f"listing {folder} is not supported: only local warehouses are listed")
        with directory(below[0], below[1][:-1], folder) as handle:
            return os.listdir(handle)

    def files(self, place: str) -> Iterator[tuple[str, float]]:
        """Every file under one of the table's local places, and its modification time; a folder
        that is a link is not entered (and a link planted as a file is listed as one)."""
        found = next((p for p in self._places if p.location == normalized(place)), None)
        if found is None or found.root is None or found.local is None:
            raise OutsideTableError(f"listing {place} is not supported: only local warehouses are listed")
        for parts, mtime in files_below(found.root, found.parts, place):
            yield file_uri(found.local.joinpath(*parts)), mtime

    def remove_empty_directories(self) -> None:
        """Remove the empty directories under each of the table's places, and the places themselves
        if they are empty then; on S3 the zero-byte "directory" objects that no longer hold anything."""
        for place in self._places:
            if place.root is None:
                assert isinstance(self._io, ObjectStorageIO)
                self._io.remove_empty_markers(place.location)
                continue
            try:
                remove_empty_below(place.root, place.parts, place.location)
            except (FileNotFoundError, OutsideTableError):
                continue  # gone, or a link now: nothing of the table's to remove there


@dataclass
class Deletions:
    """What deleting a list of files did: how many went, which were not the table's to delete,
    and which could not be read or deleted (with why)."""

    deleted: int = 0
    skipped: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def delete_each(files: TableFiles | None, named: Iterable[tuple[str, str]]) -> Deletions:
    """Delete each (path, what it is) through `files` (None: nothing may be deleted, all is skipped).
    A file already gone counts as neither: an earlier run deleted it and stopped before saying so."""
    done = Deletions()
    for path, kind in named:
        if files is None:
            done.skipped.append(path)
            continue
        try:
            files.delete(path)
            done.deleted += 1
        except OutsideTableError:
            done.skipped.append(path)
        except FileNotFoundError:
            continue
        except Exception as exc:
            done.problems.append(f"{kind} {path}: {type(exc).__name__}: {exc}"[:300])
    return done
