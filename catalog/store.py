"""The catalog's durable state behind a small interface.

`Store` is what the writer and the readers need; `LmdbStore` (in lmdb_store.py)
is the embedded implementation, `PostgresStore` (in postgres/) the one
that several servers share. `open_store` (in stores.py) picks one by location.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

from isbre.catalog.coverage import Coverage, Span
from isbre.catalog.identifiers import Identifier
from isbre.catalog.pending_files import PendingFile
from isbre.catalog.pointers import Pointer
from isbre.catalog.records import CommitRecord
from isbre.catalog.sink_rows import SinkRows
from isbre.catalog.store_entries import Entry

T = TypeVar("T")


class StoreGrowthError(Exception):
    """The store was full and could not make room; the transaction that needed it was refused."""


class StoreUnavailableError(Exception):
    """The store cannot be reached (its database is down or unreachable): nothing was done, or, where
    `maybe_committed`, a transaction was lost as it ended and its outcome is unknown; the same
    request can be tried again shortly."""

    def __init__(self, message: str, maybe_committed: bool = False) -> None:
        super().__init__(message)
        self.maybe_committed = maybe_committed


class CommitStateUnknownError(Exception):
    """The store was lost while a commit's transaction ended, and could not be asked afterwards
    whether it committed: the commit may or may not have landed (nothing it wrote is removed)."""


# The kinds of object a pointer names.
TABLE, VIEW = "table", "view"
# The scope of the store's first warehouse (a store made before it held several has only this one).
FIRST_WAREHOUSE = ""


def check_scope(opened: frozenset[str], warehouse: str) -> None:
    """A store reads and writes only the warehouses it was opened with."""
    if warehouse not in opened:
        raise KeyError(f"the store was not opened with warehouse {warehouse!r}")


class ReadView(ABC):
    """A consistent snapshot of the catalog.

    Namespaces, tables and views belong to a warehouse: a view sees those of one warehouse (see
    `scoped`); the log, the location index, coverage, cursors and idempotent responses are shared.
    """

    @abstractmethod
    def scoped(self, warehouse: str) -> WriteView:
        """The same transaction, seeing warehouse `warehouse`'s namespaces, tables and views
        (FIRST_WAREHOUSE: the store's first); KeyError for one the store was not opened with."""

    @abstractmethod
    def namespace(self, namespace: tuple[str, ...]) -> dict[str, str] | None: ...

    @abstractmethod
    def namespaces(
        self, parent: tuple[str, ...], after: tuple[str, ...] | None, limit: int | None
    ) -> list[tuple[str, ...]]:
        """Direct children of `parent` (top level for `()`), in key order, after `after`."""

    @abstractmethod
    def is_empty(self, namespace: tuple[str, ...]) -> bool:
        """True if the namespace holds no table, view or nested namespace."""

    @abstractmethod
    def pointer(self, kind: str, ident: Identifier) -> Pointer | None:
        """`kind` is "table" or "view"."""

    @abstractmethod
    def identifiers(
        self, kind: str, namespace: tuple[str, ...], after: str | None, limit: int | None
    ) -> list[Identifier]: ...

    @abstractmethod
    def commit_seq(self) -> int:
        """The highest `commit_seq` in the log (0 for an empty catalog)."""

    @abstractmethod
    def records(self, after: int, limit: int) -> list[CommitRecord]:
        """Records with `commit_seq > after`, in order."""

    @abstractmethod
    def cursors(self) -> dict[str, int]:
        """Durable positions of the log's consumers (the lineage outbox, …), by name."""

    @abstractmethod
    def idempotent_response(self, key: str) -> dict[str, Any] | None:
        """The finalized response stored under an Idempotency-Key, if any."""

    @abstractmethod
    def overlapping(self, location: str) -> list[tuple[str, str]]:
        """Indexed table and view locations that are `location`, above it or under it, with the uuid
        of the object at each (locations are normalized: see catalog/locations.py)."""

    @abstractmethod
    def placed(self, owner: str) -> str | None:
        """The location indexed as `owner`'s (a table's or view's uuid, for its location), if any."""

    @abstractmethod
    def key(self, purpose: str) -> bytes | None:
        """The random key the store keeps for `purpose` (signing plan ids), if one was made."""

    @abstractmethod
    def marker(self, name: str) -> bool:
        """Whether a one-time step (a migration) named `name` has been done."""

    @abstractmethod
    def log_floor(self) -> int:
        """The lowest `commit_seq` still in the log (high-water + 1 when it is empty)."""

    @abstractmethod
    def coverage(self, table_uuid: str) -> Coverage:
        """The source offsets the table's commits have declared, merged per stream."""

    @abstractmethod
    def snapshot_commit(self, table_uuid: str, snapshot_id: int) -> int | None:
        """The `commit_seq` of the commit that added `snapshot_id` to the table (None for a snapshot
        added before the store kept this, or registered with its table)."""

    @abstractmethod
    def sink_rows(self, table_uuid: str | None) -> list[SinkRows]:
        """The running row counts of the table (None: of every table) whose sinks declared them."""

    @abstractmethod
    def pending_files(self, limit: int, with_data: bool = True) -> list[PendingFile]:
        """Up to `limit` of the metadata files kept until they are synced, in no given order;
        without their bytes (`data` empty) unless `with_data`."""

    @abstractmethod
    def pending_count(self) -> int:
        """How many metadata files are kept until they are synced."""

    @abstractmethod
    def holds_anything(self) -> bool:
        """Whether the store holds a catalog: a log, a namespace or an object in any warehouse."""


class WriteView(ReadView):
    """A write transaction: everything in it becomes durable together, or not at all."""

    @abstractmethod
    def put_namespace(self, namespace: tuple[str, ...], properties: dict[str, str]) -> None: ...

    @abstractmethod
    def delete_namespace(self, namespace: tuple[str, ...]) -> None: ...

    @abstractmethod
    def put_pointer(self, kind: str, ident: Identifier, pointer: Pointer) -> None: ...

    @abstractmethod
    def delete_pointer(self, kind: str, ident: Identifier) -> None: ...

    @abstractmethod
    def append(self, record: CommitRecord) -> None:
        """Add a stamped record to the log."""

    @abstractmethod
    def put_cursor(self, name: str, commit_seq: int) -> None: ...

    @abstractmethod
    def delete_cursor(self, name: str) -> None:
        """Forget a cursor (nothing when there is none)."""

    @abstractmethod
    def add_coverage(
        self, table_uuid: str, spans: list[Span], snapshot_id: int | None, commit_seq: int
    ) -> None:
        """Union-merge `spans` into the table's coverage (never shrinks it), and remember which
        `commit_seq` committed `snapshot_id`."""

    @abstractmethod
    def drop_coverage(self, table_uuid: str) -> None:
        """Forget the table's coverage and its row counts."""

    @abstractmethod
    def put_sink_rows(self, totals: SinkRows) -> None:
        """Store a table's running row counts, replacing what it had."""

    def add_sink_rows(self, added: SinkRows) -> None:
        """Add one commit's row counts to its table's totals."""
        found = self.sink_rows(added.table_uuid)
        self.put_sink_rows(found[0].plus(added) if found else added)

    @abstractmethod
    def put_idempotent_response(self, key: str, response: dict[str, Any]) -> None: ...

    @abstractmethod
    def trim_idempotency(self, older_than_us: int, limit: int) -> int:
        """Delete up to `limit` stored outcomes kept before `older_than_us` (their `ts`), oldest
        first, reading no others; returns how many went."""

    @abstractmethod
    def place(self, owner: str, location: str) -> None:
        """Index the (normalized) location of the table or view with uuid `owner`, replacing the one
        it had."""

    @abstractmethod
    def unplace(self, owner: str) -> None:
        """Forget where `owner` lives (it was dropped)."""

    @abstractmethod
    def set_marker(self, name: str) -> None: ...

    @abstractmethod
    def put_key(self, purpose: str, key: bytes) -> None:
        """Keep `key` for `purpose`: every process of the catalog signs and checks with it."""

    @abstractmethod
    def clear_markers(self) -> None:
        """Forget every one-time step done (a load brings the loaded catalog's)."""

    @abstractmethod
    def set_high_water(self, commit_seq: int) -> None:
        """Where the log goes on: the next record appended is `commit_seq + 1` (for a load)."""

    @abstractmethod
    def trim_log(self, keep_after: int, older_than_us: int, ceiling: int, limit: int) -> int:
        """Delete up to `limit` of the oldest records that have `commit_seq <= keep_after` or
        `ts < older_than_us`, but none above `ceiling`; returns how many went."""

    @abstractmethod
    def put_pending_file(self, pending: PendingFile) -> None:
        """Keep a metadata file's bytes with the commit that names it, until it is synced."""

    @abstractmethod
    def delete_pending_files(self, locations: list[str]) -> None:
        """Forget kept files (synced now); a location not kept is no error."""

    @abstractmethod
    def savepoint(self) -> AbstractContextManager[WriteView]:
        """A nested transaction: undone on its own if the block raises."""

    def prefetch(self, kind: str, idents: list[tuple[str, Identifier]]) -> None:
        """A hint: `pointer(kind, …)` is about to be asked for each (warehouse, ident)."""


class Lease:
    """The right to be the one process doing something for a store (delivering lineage, running
    maintenance). This one is always held: a store without leases has one process."""

    def held(self) -> bool:
        """Still held; once False, the holder must stop: another process may take it."""
        return True

    def release(self) -> None:
        pass


class Store(ABC):
    # Whether a read is answered from memory this process maps, in microseconds, so that an event
    # loop may read the store itself; False: a read waits on another process (a database), however
    # long that takes, and must not hold up a loop's other requests.
    reads_in_process = False

    @abstractmethod
    def read(self, warehouse: str = "", snapshot: bool = True) -> AbstractContextManager[ReadView]:
        """A read of warehouse `warehouse`'s state (KeyError: not opened with it, as `scoped`).
        With `snapshot` (the default) every read in the block sees one consistent state; without
        it each may see the latest (for a block of one read, or of reads that need not agree: a
        database then saves a round trip or two)."""

    @abstractmethod
    def write(self) -> AbstractContextManager[WriteView]:
        """The one write transaction; commits (durably) when the block ends cleanly. One attempt:
        the writer uses `transact`, which may make room and try again."""

    @abstractmethod
    def transact(self, work: Callable[[WriteView], T]) -> T:
        """`work(view)` in the one write transaction, committed durably; returns what it returns.
        The store may abort it and run `work` again from the start (LMDB grows its map first), so
        `work` must have no effect but on the view. StoreGrowthError: no room could be made."""

    @abstractmethod
    def capacity(self) -> int:
        """Bytes the store takes on its disk or reserves there (LMDB: its map; PostgreSQL: its
        database)."""

    @abstractmethod
    def close(self) -> None: ...

    def local_dir(self) -> Path | None:
        """The directory on this host the store keeps its files in (None: a database elsewhere)."""
        return None

    def on_commit(self, callback: Callable[[int | None], None]) -> bool:
        """Have `callback(commit_seq)` called (on some thread) soon after another process (another
        open store) commits to this store, with the high-water that commit made (None: unknown,
        look; a store that cannot tell whose commit it was says None after its own too); False
        when the store cannot tell, and its readers must poll."""
        return False

    def try_lease(self, name: str) -> Lease | None:
        """Take the lease `name`, held until released or the process ends; None when another holds it."""
        return Lease()

    def catch_up(self) -> None:
        """Make every durable commit visible to this process's reads (for a plan that must start
        from the latest state). A no-op where reads always see it."""
        return None

    @abstractmethod
    def export(self) -> Iterator[Entry]:
        """Everything the store holds, read in one snapshot, as `store_copy.load_store` takes it."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What /health says about the store besides its log (asking it nothing)."""

    def scan_log(self, after: int, batch: int = 1000) -> Iterator[CommitRecord]:
        while True:
            with self.read() as view:
                records = view.records(after, batch)
            yield from records
            if len(records) < batch:
                return
            after = records[-1].commit_seq
