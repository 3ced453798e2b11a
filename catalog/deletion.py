"""The one way isbre deletes a table's files: confined to the table's own resolved location.

Every path a purge deletes comes from metadata a client wrote, so each is
turned, once, into the exact thing that is removed (a path on disk, or a
bucket and key) and that same value is judged and used. On local disk the
table's root is resolved (symlinks and all) and must lie inside a resolved
warehouse root, away from the store's files; a file is then reached from the
root's directory descriptor one component at a time without following any
symbolic link, so nothing the kernel resolves can lead out of the table, even
if a directory is swapped for a link meanwhile. A link planted as a file is
removed itself, never what it points at.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from isbre.catalog.file_uris import local_path
from isbre.catalog.locations import LocationNotAllowedError, inside, normalized
from isbre.catalog.object_storage import ObjectStorageIO, s3_object
from pyiceberg.io import FileIO

_WALK = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class OutsideTableError(LocationNotAllowedError):
    """A path that is not the table's to delete."""


def _resolved(location: str) -> Path | None:
    path = local_path(normalized(location))
    return Path(os.path.realpath(path)) if path is not None else None


@dataclass(frozen=True)
class _Place:
    location: str  # normalized
    local: Path | None  # its path as written, on local disk
    resolved: Path | None  # that path resolved, judged to lie in the warehouse


class TableFiles:
    """Deletes files of one table, and nothing else.

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
        resolved_roots = [r for r in (_resolved(each) for each in roots) if r is not None]
        guarded = [p for p in (_resolved(each) for each in protected) if p is not None]
        self._places = [self._judged(place, resolved_roots, guarded) for place in places]
        self.location = self._places[0].location
        self._claimed_directories: dict[str, bool] = {}

    def _judged(self, location: str, roots: list[Path], protected: list[Path]) -> _Place:
        found = normalized(location)
        local = local_path(found)
        if local is None:
            if not found.startswith("s3://") or not isinstance(self._io, ObjectStorageIO):
                raise OutsideTableError(f"isbre deletes files on local disk and S3 only, not at {location!r}")
            return _Place(found, None, None)
        resolved = Path(os.path.realpath(local))
        if not any(resolved == r or r in resolved.parents for r in roots):
            raise OutsideTableError(f"The table's place {location!r} resolves outside the warehouse")
        for place in protected:
            if resolved == place or place in resolved.parents or resolved in place.parents:
                raise OutsideTableError(f"The table's place {location!r} is in or around the store")
        return _Place(found, Path(os.path.normpath(local)), resolved)

    def place_of(self, path: str, remembered: bool = False) -> tuple[_Place, str]:
        """The place of the table that `path` lies under, and `path` normalized; OutsideTableError
        if it is not the table's (outside its places, another table's or view's, or spelled so that
        some reader could take it for another place). `remembered`: whether another object holds
        the file's directory may be answered from an earlier look at the same directory (a job
        reading thousands of files of a few directories asks the store once for each)."""
        try:
            found = normalized(path)
        except LocationNotAllowedError as exc:
            raise OutsideTableError(str(exc)) from exc
        place = next((p for p in self._places if inside(found, p.location) and found != p.location), None)
        if place is None or self._claimed(found, remembered):
            raise OutsideTableError(f"{path!r} is not under the table's places ({self.location}, ...)")
        if place.resolved is None:
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

    def check(self, path: str) -> str:
        """`path` if the table's job may read or write it: under one of its places, and on local disk
        reaching no further than the place once links are followed. OutsideTableError if not."""
        place, found = self.place_of(path, remembered=True)
        local = local_path(found)
        if local is not None and place.resolved is not None:
            resolved = Path(os.path.realpath(local))
            if resolved != place.resolved and place.resolved not in resolved.parents:
                raise OutsideTableError(f"{path!r} leads outside the table's place {place.location}")
        return path

    def delete(self, path: str) -> None:
        """Delete `path` if it is the table's: OutsideTableError if not, FileNotFoundError if gone."""
        place, found = self.place_of(path)
        if place.resolved is None:
            assert isinstance(self._io, ObjectStorageIO)
            self._io.delete_key(*s3_object(found))
            return
        found_path = local_path(found)
        assert found_path is not None and place.local is not None
        _unlink_below(place.resolved, found_path.relative_to(place.local).parts, path)

    def remove_empty_directories(self) -> None:
        """Remove the empty directories under each of the table's places, and the places themselves
        if they are empty then; on S3 the zero-byte "directory" objects that no longer hold anything."""
        for place in self._places:
            if place.resolved is None:
                assert isinstance(self._io, ObjectStorageIO)
                self._io.remove_empty_markers(place.location)
                continue
            if not place.resolved.is_dir():
                continue
            for _, directories, _, parent in os.fwalk(place.resolved, topdown=False, follow_symlinks=False):
                for name in directories:
                    with contextlib.suppress(OSError):
                        os.rmdir(name, dir_fd=parent)  # only empty ones go; a link is no directory here
            with contextlib.suppress(OSError):
                place.resolved.rmdir()


def _unlink_below(root: Path, parts: tuple[str, ...], path: str) -> None:
    """Unlink `root/parts...` reaching it from `root`'s descriptor, following no link on the way."""
    directory = os.open(root, _WALK)
    try:
        for part in parts[:-1]:
            try:
                below = os.open(part, _WALK, dir_fd=directory)
            except FileNotFoundError:
                raise
            except OSError as exc:  # ELOOP or ENOTDIR: a symbolic link or a file, not a directory
                raise OutsideTableError(f"{path!r} passes through a link or a file: {part!r}") from exc
            os.close(directory)
            directory = below
        os.unlink(parts[-1], dir_fd=directory)
    finally:
        os.close(directory)


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
