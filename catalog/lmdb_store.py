"""The embedded store: one LMDB environment with a named database per kind of state."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import lmdb
from isbre.catalog.file_changes import FileChanges, watch
from isbre.catalog.limits import InsufficientStorageError
from isbre.catalog.lmdb_layout import (
    DATABASES,
    FORMAT_VERSION,
    PER_WAREHOUSE,
    export_entries,
    index_idempotency_by_time,
)
from isbre.catalog.lmdb_view import LmdbView, MapFullError
from isbre.catalog.store import (
    FIRST_WAREHOUSE,
    Lease,
    ReadView,
    Store,
    StoreGrowthError,
    WriteView,
)
from isbre.catalog.store_entries import Entry

T = TypeVar("T")
log = logging.getLogger(__name__)


class _FileLease(Lease):
    def __init__(self, descriptor: int) -> None:
        self._descriptor: int | None = descriptor

    def held(self) -> bool:
        return self._descriptor is not None

    def release(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)  # the lock goes with the descriptor
            self._descriptor = None


class _ResizeGate:
    """LMDB may only be remapped while this process has no open transaction."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open = 0
        self._resizing = False

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._open += 1
        try:
            yield
        finally:
            with self._cond:
                self._open -= 1
                if not self._open:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            while self._open:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


class LmdbStore(Store):
    reads_in_process = True

    def __init__(self, path: Path, map_size: int = 256 << 20, warehouses: tuple[str, ...] = ()) -> None:
        """`warehouses`: the scopes, besides the first (unnamed) one, that this process will use."""
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        names = [*DATABASES, *(f"{w}/{name}" for w in warehouses for name in PER_WAREHOUSE)]
        self.env = lmdb.open(
            str(path), map_size=map_size, max_dbs=len(names), subdir=True, sync=True, metasync=True
        )
        self._gate = _ResizeGate()
        self._listeners: list[Callable[[int | None], None]] = []
        self._listeners_lock = threading.Lock()
        self._changes: FileChanges | None = None
        self.map_was_full = False
        self.opened_scopes = frozenset({FIRST_WAREHOUSE, *warehouses})
        with self.env.begin(write=True) as txn:
            self.dbs = {name: self.env.open_db(name.encode(), txn=txn) for name in names}
            version = txn.get(b"format", db=self.dbs["meta"])
            if version is None:
                txn.put(b"format", FORMAT_VERSION, db=self.dbs["meta"])
                # A new store indexes every location it is given: nothing to index later.
                txn.put(b"marker:locations", b"", db=self.dbs["meta"])
            elif version != FORMAT_VERSION:
                raise RuntimeError(
                    f"{path} holds store format {version!r}; this isbre reads {FORMAT_VERSION!r}"
                )
            index_idempotency_by_time(txn, self.dbs)

    @contextmanager
    def _begin(self, write: bool) -> Iterator[lmdb.Transaction]:
        while True:
            with self._gate.transaction():
                try:
                    txn = self.env.begin(write=write)
                except lmdb.MapResizedError:
                    pass  # another process grew the map; adopt its size below
                else:
                    try:
                        yield txn
                    except BaseException:
                        txn.abort()
                        raise
                    try:
                        txn.commit()
                    except lmdb.MapFullError as exc:
                        self.map_was_full = True
                        raise MapFullError(str(exc)) from exc
                    except lmdb.Error as exc:
                        if "No space left" in str(exc) or "quota" in str(exc).lower():
                            raise InsufficientStorageError(
                                f"No room left on the store's disk: {exc}"
                            ) from exc
                        raise
                    return
            with self._gate.exclusive():
                self.env.set_mapsize(0)

    @contextmanager
    def read(self, warehouse: str = "", snapshot: bool = True) -> Iterator[ReadView]:
        with self._begin(write=False) as txn:
            yield LmdbView(self, txn).scoped(warehouse)

    @contextmanager
    def write(self) -> Iterator[WriteView]:
        """One attempt: a full map raises MapFullError (`transact` grows the map and runs again)."""
        with self._begin(write=True) as txn:
            yield LmdbView(self, txn)

    def catch_up(self) -> None:
        # A writer killed while it synced its commit's meta page leaves the commit durable but
        # unannounced: LMDB publishes it (to readers) when the next writer takes the lock that the
        # dead one held. Taking the lock and letting it go is that next writer.
        with self._gate.transaction():
            self.env.begin(write=True).abort()

    def transact(self, work: Callable[[WriteView], T]) -> T:
        while True:
            self.map_was_full = False
            try:
                with self.write() as view:
                    result = work(view)
                    if self.map_was_full:  # `work` went on past a full map: its transaction is void
                        raise MapFullError("the LMDB map filled up during the transaction")
                return result
            except MapFullError:
                try:
                    self.grow()
                except Exception as exc:
                    log.error("the LMDB map is full and could not grow: %s", exc)
                    raise StoreGrowthError(f"the store is full and could not make room: {exc}") from exc

    def grow(self) -> None:
        """Double the map (every process of the store adopts the new size on its next transaction)."""
        with self._gate.exclusive():
            size = self.env.info()["map_size"] * 2
            log.warning("LMDB map is full; growing it to %d MiB", size >> 20)
            self.env.set_mapsize(size)

    def capacity(self) -> int:
        return self.env.info()["map_size"]

    def describe(self) -> dict[str, Any]:
        return {"kind": "lmdb", "path": str(self.path)}

    def local_dir(self) -> Path:
        return self.path

    def on_commit(self, callback: Callable[[int | None], None]) -> bool:
        """Where the system reports writes to the store's data file (Linux), `callback(None)` after
        any process's commits, this one's included (a write does not say whose it was)."""
        with self._listeners_lock:
            if self._changes is None:
                self._changes = watch(self.path / "data.mdb", self._written)
                if self._changes is None:
                    return False
            self._listeners.append(callback)
        return True

    def _written(self) -> None:
        for callback in list(self._listeners):
            callback(None)

    def try_lease(self, name: str) -> Lease | None:
        """A lock on a file beside the store: one holder among the processes of this host (the
        workers of one server each run what only one of them may)."""
        descriptor = os.open(self.path / f"lease-{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return None
        return _FileLease(descriptor)

    def scopes(self) -> list[str]:
        """Every warehouse scope the store holds ("" first), whether or not this process opened it."""
        with self.env.begin() as txn, txn.cursor() as cursor:
            named = [key.decode() for key, _ in cursor]
        return [
            "",
            *sorted(name.removesuffix("/namespaces") for name in named if name.endswith("/namespaces")),
        ]

    def export(self) -> Iterator[Entry]:
        return export_entries(self.env, self.dbs, self.scopes())

    def close(self) -> None:
        if self._changes is not None:
            self._changes.close()
        self.env.close()
