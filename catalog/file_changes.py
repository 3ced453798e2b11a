"""Being told that a file was written to, by any process, instead of looking every few milliseconds.

LMDB cannot notify its readers of another process's commit; what a commit does on disk is write
the store's data file. Linux's inotify reports such writes from every process, so a thread that
waits on it is woken by commits only, and an idle server does no work at all. Where inotify is not
there (another system, or its per-user limit of instances is reached), `watch` returns None and the
caller polls as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

IN_MODIFY = 0x00000002
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
# A busy file is reported at most this often: a reader that looks once per interval sees every
# commit all the same.
MIN_INTERVAL_S = 0.01
# After the last write, reported every MIN_INTERVAL_S for this long: a commit writes its pages and
# its meta page before its syncs end and readers can see it, so the write itself comes too early.
SETTLE_S = 0.5


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    return libc if hasattr(libc, "inotify_init1") else None


class FileChanges:
    """Calls `changed()` on a thread of its own soon after a file is written to, and every
    MIN_INTERVAL_S for SETTLE_S after the last write; `close()` stops it."""

    def __init__(self, descriptor: int, changed: Callable[[], None]) -> None:
        self._descriptor = descriptor
        self._changed = changed
        self._stop_read, self._stop_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="isbre-file-changes", daemon=True)
        self._thread.start()

    def close(self) -> None:
        os.write(self._stop_write, b"x")
        self._thread.join()
        for descriptor in (self._descriptor, self._stop_read, self._stop_write):
            os.close(descriptor)

    def _run(self) -> None:
        settled_at = 0.0
        while True:
            wait = None if time.monotonic() >= settled_at else 0  # idle: sleep until a write
            ready, _, _ = select.select([self._descriptor, self._stop_read], [], [], wait)
            if self._stop_read in ready:
                return
            if self._descriptor in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._descriptor, 4096):  # the events say only "written": drop them
                        pass
                settled_at = time.monotonic() + SETTLE_S
            try:
                self._changed()
            except Exception:
                log.exception("file change callback %r failed", self._changed)
            time.sleep(MIN_INTERVAL_S)


def watch(path: Path, changed: Callable[[], None]) -> FileChanges | None:
    """Watch `path` for writes; None where this system cannot tell (the caller must poll)."""
    libc = _libc()
    if libc is None:
        return None
    descriptor = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if descriptor < 0:
        log.info("cannot watch %s (inotify: %s); polling instead", path, os.strerror(ctypes.get_errno()))
        return None
    if libc.inotify_add_watch(descriptor, os.fsencode(path), IN_MODIFY) < 0:
        log.info("cannot watch %s (inotify: %s); polling instead", path, os.strerror(ctypes.get_errno()))
        os.close(descriptor)
        return None
    return FileChanges(descriptor, changed)
