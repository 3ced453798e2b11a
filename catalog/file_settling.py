"""Table metadata files made durable in groups rather than one by one.

A table commit writes its next metadata file without syncing it and keeps the file's bytes in its
own store transaction (`PendingFile`): the commit is durable when that transaction is, with no sync
of its own. A settler in each process that commits syncs every kept file in one call per
filesystem (`syncfs`), then forgets their bytes in one transaction, once a second by default. On
start it first looks at every file still kept: one that a system crash left missing or torn is
written again from the kept bytes, if the place it lies in is still its table's (a dropped table's
file, or one under a place the table has left, is not brought back), through folder handles from a
trusted root, never through a link.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from isbre.catalog.file_uris import local_path
from isbre.catalog.locations import normalized
from isbre.catalog.metadata_files import sync_file
from isbre.catalog.places import object_of
from isbre.catalog.store import PendingFile, ReadView, Store
from isbre.catalog.table_handles import OutsideTableError, TrustedRoots, open_below, replace_below
from isbre.catalog.writer import Batch, Writer

log = logging.getLogger(__name__)

# How many kept files one round syncs and forgets in one transaction (restoring, with their bytes:
# at most 64 MiB of them at once).
SETTLE_BATCH = 256
# A larger file is synced by its commit: kept, its bytes would be written to disk twice (the store's
# pages, then the file), and the sync of that much data costs more than the call saved.
KEPT_FILE_MAX_BYTES = 256 << 10
_libc = ctypes.CDLL(None, use_errno=True)
_syncfs: Callable[[int], int] | None = getattr(_libc, "syncfs", None)


def sync_filesystems(paths: Iterable[Path]) -> None:
    """Make the files at `paths`, and their directory entries, durable: one `syncfs` per
    filesystem they lie on where the system has it (Linux), each file and directory synced
    otherwise. A path no longer there (its table was dropped since) needs nothing."""
    first_by_device: dict[int, Path] = {}
    for path in paths:
        try:
            device = path.stat().st_dev
        except FileNotFoundError:
            continue
        if _syncfs is None:
            sync_file(path)
        first_by_device.setdefault(device, path)
    if _syncfs is None:
        return
    for path in first_by_device.values():
        fd = os.open(path, os.O_RDONLY)
        try:
            if _syncfs(fd) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"syncfs under {path}: {os.strerror(error)}")
        finally:
            os.close(fd)


def _whole(root: Path, parts: tuple[str, ...], pending: PendingFile) -> bool:
    try:
        descriptor = open_below(root, parts, pending.location)
    except FileNotFoundError:
        return False
    with os.fdopen(descriptor, "rb") as file:
        return file.read(len(pending.data) + 1) == pending.data


def _still_its_tables(view: ReadView, pending: PendingFile) -> bool:
    """Whether the place the file lies in is indexed as its table's, and no other object's."""
    location = normalized(pending.location, literal_percent=True)
    holders = [
        object_of(holder)
        for place, holder in view.overlapping(location)
        if location == place or location.startswith(place + "/")
    ]
    return bool(holders) and set(holders) == {pending.owner}


def restore(view: ReadView, pending: PendingFile, roots: TrustedRoots) -> bool:
    """Write a kept file again where a crash left it missing or torn, if its table still holds its
    place; reached from a trusted root through no link, as the server reaches a table's files
    (catalog/table_handles.py). True when it was written."""
    path = local_path(pending.location)
    if path is None:
        return False
    reached = roots.reach(path)
    try:
        if reached is None:
            raise OutsideTableError(f"{pending.location!r} is under no warehouse or allowed location")
        root, parts = reached
        if _whole(root, parts, pending):
            return False
        if not _still_its_tables(view, pending):
            raise OutsideTableError("its table no longer holds that place")
        replace_below(root, parts, pending.location, pending.data, sync=False)  # the round syncs it
    except OutsideTableError as exc:
        log.warning("not restoring %s, lost in a crash: %s", pending.location, exc)
        return False
    log.warning("restored metadata file %s, which a crash had left torn or missing", pending.location)
    return True


class FileSettler:
    """Syncs, in groups, the metadata files this process's commits leave unsynced (`written`)."""

    def __init__(self, store: Store, writer: Writer, interval_s: float) -> None:
        """Settles every `interval_s` seconds, once started, while this process has written
        anything since (0: commits sync their own files, and `grouping` is False)."""
        self._store = store
        self._writer = writer
        self._interval_s = interval_s
        self.grouping = interval_s > 0
        self._roots = TrustedRoots(())
        self._written = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="isbre-file-settler", daemon=True)

    def start(self, roots: Iterable[str]) -> None:
        """Restore what a crash lost (`settle(restoring=True)`), reaching files from `roots` (every
        warehouse's and allowed location), then start the rounds."""
        self._roots = TrustedRoots(roots)
        self.settle(restoring=True)
        if self.grouping:
            self._thread.start()

    def keeps(self, data: bytes) -> bool:
        """Whether a commit's metadata file of `data` is left unsynced, its bytes kept in the store."""
        return self.grouping and len(data) <= KEPT_FILE_MAX_BYTES

    def written(self) -> None:
        """A commit of this process kept a file: the next round has something to settle."""
        self._written.set()

    def settle(self, restoring: bool = False) -> int:
        """Sync every kept file (those of every process of the store), then forget them; with
        `restoring`, first write again each one a crash lost. Returns how many were settled."""
        settled = 0
        while True:
            with self._store.read(snapshot=False) as view:
                pending = view.pending_files(SETTLE_BATCH, with_data=restoring)
                if restoring:
                    for each in pending:
                        restore(view, each, self._roots)
            if not pending:
                return settled
            sync_filesystems(path for each in pending if (path := local_path(each.location)) is not None)
            locations = [each.location for each in pending]

            def forget(batch: Batch, locations: list[str] = locations) -> None:
                batch.view.delete_pending_files(locations)

            self._writer.execute(forget)
            settled += len(pending)
            if len(pending) < SETTLE_BATCH:
                return settled

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            if not self._written.is_set():
                continue
            self._written.clear()
            try:
                self.settle()
            except Exception:
                self._written.set()  # try again next round; the files stay kept meanwhile
                log.exception("could not sync the metadata files of recent commits; trying again")

    def close(self) -> None:
        """Stop, settling what is kept (before the writer closes)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self.settle()
        except Exception:
            log.exception("could not sync the metadata files of recent commits; the next start will")
