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
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from isbre.catalog.file_uris import local_path
from isbre.catalog.locations import LocationNotAllowedError, normalized

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO does not block the open
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC  # O_EXCL: not even through a link
_LINK_ERRORS = (errno.ELOOP, errno.ENOTDIR)


class OutsideTableError(LocationNotAllowedError):
    """A path that is not the table's to read, write or delete."""


def local_place(location: str, literal_percent: bool = False) -> Path | None:
    """`location` on local disk, normalized (no `.` or `..` left), or None elsewhere."""
    path = local_path(normalized(location, literal_percent))
    return Path(os.path.normpath(path)) if path is not None else None


class TrustedRoots:
    """The local roots tables may live under (the warehouses, the allowed locations), each resolved
    once, when the server starts: the only paths it ever resolves through links."""

    def __init__(self, locations: Iterable[str]) -> None:
        written = {path for location in locations if (path := local_place(location)) is not None}
        # Deepest first: a file is reached from the nearest root it lies below.
        self._roots = [
            (root, Path(os.path.realpath(root))) for root in sorted(written, key=lambda p: -len(p.parts))
        ]

    def reach(self, path: Path) -> tuple[Path, tuple[str, ...]] | None:
        """The resolved root `path` lies below, and the folders and name from it down to `path`;
        None when it lies below none."""
        path = Path(os.path.normpath(path))
        for written, resolved in self._roots:
            if written in path.parents:
                return resolved, path.relative_to(written).parts
        return None


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
def directory(
    root: Path, parts: Sequence[str], path: str, create: bool = False, made: list[int] | None = None
) -> Iterator[int]:
    """The handle of `root/parts...`, reached from `root` without following a link; `create`: the
    folders missing on the way are made (and with `made`, each synced into the folder above it and
    its depth appended). FileNotFoundError when one is missing (and not made)."""
    handle = os.open(root, _DIRECTORY)
    try:
        for depth, part in enumerate(parts):
            try:
                below = _open_folder(part, handle, path)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=handle)
                    if made is not None:
                        made.append(depth)
                        os.fsync(handle)
                except FileExistsError:  # made meanwhile by a writer of the table
                    pass
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


def create_below(root: Path, parts: Sequence[str], path: str, data: bytes, sync: bool) -> None:
    """Create the regular file `root/parts...` holding `data`, never replacing a file (or a link),
    the folders on the way made and synced into theirs; with `sync`, the file and its folder's
    entry synced too. A failure leaves neither the file nor the folders it made."""
    made: list[int] = []
    try:
        with directory(root, parts[:-1], path, create=True, made=made) as folder:
            descriptor = os.open(parts[-1], _CREATE, 0o644, dir_fd=folder)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(descriptor, view) :]
                if sync:
                    os.fsync(descriptor)
            except BaseException:
                os.unlink(parts[-1], dir_fd=folder)
                raise
            finally:
                os.close(descriptor)
            if sync:
                os.fsync(folder)
    except BaseException:
        for depth in reversed(made):  # innermost first, each only if nothing else went in
            with contextlib.suppress(OSError), directory(root, parts[:depth], path) as above:
                os.rmdir(parts[depth], dir_fd=above)
        raise


def replace_below(root: Path, parts: Sequence[str], path: str, data: bytes, sync: bool) -> None:
    """Write `root/parts...` whole or not at all: `data` goes to a new file beside it (`create_below`),
    which is then renamed over it, so that a reader sees the old file or the new one, never a part."""
    temporary = (*parts[:-1], f".{parts[-1]}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    create_below(root, temporary, path, data, sync)
    with directory(root, parts[:-1], path) as folder:
        try:
            os.replace(temporary[-1], parts[-1], src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary[-1], dir_fd=folder)
            raise


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
