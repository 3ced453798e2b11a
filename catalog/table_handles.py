"""A table's files on local disk, reached through directory handles.

The engines that write a local table write its folders directly, and may replace any folder of
their own table with a symbolic link to someone else's between the moment the server checks a
path and the moment it uses it. So the server never opens a table's file by name: it opens the
trusted root it resolved once (a warehouse, an allowed location), then each folder below it from
the handle of the one above, refusing a link at every step (`O_NOFOLLOW | O_DIRECTORY`), and
opens, lists or unlinks the file from the last handle. A folder swapped for a link after any
check leads nowhere: the walk stops with `OutsideTableError`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from isbre.catalog.locations import LocationNotAllowedError

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO does not block the open
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_LINK_ERRORS = (errno.ELOOP, errno.ENOTDIR)


class OutsideTableError(LocationNotAllowedError):
    """A path that is not the table's to read, write or delete."""


def _refused(path: str, part: str) -> OutsideTableError:
    return OutsideTableError(f"{path!r} passes through a link or a file: {part!r}")


def _open_folder(part: str, handle: int, path: str) -> int:
    try:
        return os.open(part, _DIRECTORY, dir_fd=handle)
    except OSError as exc:
        if exc.errno in _LINK_ERRORS:
            raise _refused(path, part) from exc
        raise


@contextlib.contextmanager
def directory(root: Path, parts: Sequence[str], path: str, create: bool = False) -> Iterator[int]:
    """The handle of `root/parts...`, reached from `root` without following a link; `create`: the
    folders missing on the way are made. FileNotFoundError when one is missing (and not made)."""
    handle = os.open(root, _DIRECTORY)
    try:
        for part in parts:
            try:
                below = _open_folder(part, handle, path)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # made meanwhile by a writer of the table
                    os.mkdir(part, 0o777, dir_fd=handle)
                below = _open_folder(part, handle, path)
            os.close(handle)
            handle = below
        yield handle
    finally:
        os.close(handle)


def open_below(root: Path, parts: Sequence[str], path: str, write: bool = False) -> int:
    """A descriptor of the regular file `root/parts...`, for reading, or (`write`) created or
    truncated for writing with the folders on the way made; never through a link."""
    with directory(root, parts[:-1], path, create=write) as folder:
        try:
            found = os.open(parts[-1], _WRITE if write else _READ, 0o666, dir_fd=folder)
        except OSError as exc:
            if exc.errno in _LINK_ERRORS:
                raise _refused(path, parts[-1]) from exc
            raise
    if not stat.S_ISREG(os.fstat(found).st_mode):
        os.close(found)
        raise OutsideTableError(f"{path!r} is not a regular file")
    os.set_blocking(found, True)
    return found


def stat_below(root: Path, parts: Sequence[str], path: str) -> os.stat_result:
    """What `root/parts...` is (a link itself, not what it points at)."""
    with directory(root, parts[:-1], path) as folder:
        return os.stat(parts[-1], dir_fd=folder, follow_symlinks=False)


def unlink_below(root: Path, parts: Sequence[str], path: str) -> None:
    """Unlink `root/parts...` (a link planted as a file is removed itself, never what it names)."""
    with directory(root, parts[:-1], path) as folder:
        os.unlink(parts[-1], dir_fd=folder)


def files_below(root: Path, parts: Sequence[str], path: str) -> Iterator[tuple[tuple[str, ...], float]]:
    """Every file under `root/parts...` (links included, as files; no linked folder entered), as its
    parts below that folder and its modification time."""
    with directory(root, parts, path) as top:
        for where, _, names, folder in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            below = Path(where).parts  # "." is (), "./a/b" is ("a", "b")
            for name in names:
                with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                    yield (*below, name), os.stat(name, dir_fd=folder, follow_symlinks=False).st_mtime


def remove_empty_below(root: Path, parts: Sequence[str], path: str) -> None:
    """Remove the empty folders under `root/parts...`, and it too if it is empty then."""
    with directory(root, parts, path) as top:
        for _, folders, _, parent in os.fwalk(".", dir_fd=top, topdown=False, follow_symlinks=False):
            for name in folders:
                with contextlib.suppress(OSError):  # only empty ones go; a link is no folder here
                    os.rmdir(name, dir_fd=parent)
    if parts:
        with directory(root, parts[:-1], path) as parent_folder, contextlib.suppress(OSError):
            os.rmdir(parts[-1], dir_fd=parent_folder)
