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
from pathlib import Path

from pyiceberg.io import FileIO

from catalog.locations import LocationNotAllowedError, inside, normalized
from catalog.metadata_files import local_path
from catalog.object_storage import ObjectStorageIO, s3_object

_WALK = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class OutsideTableError(LocationNotAllowedError):
    """A path that is not the table's to delete."""


def _resolved(location: str) -> Path | None:
    path = local_path(location)
    return Path(os.path.realpath(path)) if path is not None else None


class TableFiles:
    """Deletes files of the table at `location`, and nothing else.

    `roots`: where tables may live (normalized locations); `protected`: the store's own files;
    `claimed_by_other(location)`: whether another table or view holds that place."""

    def __init__(
        self,
        io: FileIO,
        location: str,
        roots: Iterable[str],
        protected: Iterable[str] = (),
        claimed_by_other: Callable[[str], bool] = lambda _: False,
    ) -> None:
        self._io = io
        self._claimed_by_other = claimed_by_other
        self.location = normalized(location)
        self._local = local_path(self.location)
        self._root: Path | None = None  # the resolved local root, once judged
        if self._local is not None:
            root = Path(os.path.realpath(self._local))
            resolved_roots = [r for r in (_resolved(each) for each in roots) if r is not None]
            if not any(root == r or r in root.parents for r in resolved_roots):
                raise OutsideTableError(f"The table's location {location!r} resolves outside the warehouse")
            for place in (p for p in (_resolved(each) for each in protected) if p is not None):
                if root == place or place in root.parents or root in place.parents:
                    raise OutsideTableError(f"The table's location {location!r} is in or around the store")
            self._root = root
        elif not self.location.startswith("s3://") or not isinstance(io, ObjectStorageIO):
            raise OutsideTableError(f"isbre deletes files on local disk and S3 only, not at {location!r}")

    def delete(self, path: str) -> None:
        """Delete `path` if it is the table's: OutsideTableError if not, FileNotFoundError if gone."""
        try:
            found = normalized(path)
        except LocationNotAllowedError as exc:
            raise OutsideTableError(str(exc)) from exc
        if not inside(found, self.location) or found == self.location or self._claimed_by_other(found):
            raise OutsideTableError(f"{path!r} is not under the table's location {self.location}")
        if self._root is None:
            bucket, key = s3_object(found)
            root_bucket, root_key = s3_object(self.location)
            if bucket != root_bucket or not key.startswith(root_key + "/"):
                raise OutsideTableError(f"{path!r} is not under the table's location {self.location}")
            assert isinstance(self._io, ObjectStorageIO)
            self._io.delete_key(bucket, key)
            return
        found_path = local_path(found)
        assert found_path is not None and self._local is not None
        self._unlink_below_root(found_path.relative_to(os.path.normpath(self._local)).parts, path)

    def _unlink_below_root(self, parts: tuple[str, ...], path: str) -> None:
        assert self._root is not None
        directory = os.open(self._root, _WALK)
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

    def remove_empty_directories(self) -> None:
        """Remove the empty directories under the table's root, and the root if it is empty then;
        on S3 the zero-byte "directory" objects that no longer hold anything."""
        if self._root is None:
            assert isinstance(self._io, ObjectStorageIO)
            self._io.remove_empty_markers(self.location)
            return
        if not self._root.is_dir():
            return
        for _, directories, _, parent in os.fwalk(self._root, topdown=False, follow_symlinks=False):
            for name in directories:
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=parent)  # only empty ones go; a link is no directory here
        with contextlib.suppress(OSError):
            self._root.rmdir()
