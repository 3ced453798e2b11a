"""How a table commit goes, once its route has parsed it: one retry loop over one operations
object per table, as the Java reference's `CatalogHandlers.commit` loops over `TableOperations`.

Every table commit takes this way: the REST routes', the embedded catalog's and the catalog's
own (maintenance). An attempt stages each change on the table's pointer (`TableOperations.stage`:
requirements, updates, the next metadata file's bytes; catalog/table_staging.py), writes the new
metadata files durably, then has the writer swap the pointers in one store transaction if none
moved meanwhile (`TableCommits.swap`). A pointer that moved (another process committed first) makes
the attempt `Stale`, and the loop stages again on the store's head after a random part of a delay
that doubles (full jitter, as Java's commit retries wait). A transaction whose end the store did
not confirm is asked about before anything is removed (Java's `checkCommitStatus`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TypeVar

from isbre.catalog.append_rebase import COMMITTED, AppendRebase
from isbre.catalog.identifiers import Identifier
from isbre.catalog.maintenance_policy import check_policy
from isbre.catalog.metadata_files import Loaded, remove_quietly, write_durably, write_unsynced
from isbre.catalog.pointer_swap import PointerSwap, Stale, SwapEntry
from isbre.catalog.request_context import RequestContext
from isbre.catalog.service_core import TABLE, ServiceCore
from isbre.catalog.sink_rows import SinkRows
from isbre.catalog.store import CommitStateUnknownError, PendingFile, Pointer, ReadView, StoreUnavailableError
from isbre.catalog.table_staging import Staged, TableChange, commit_record, stage
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table.metadata import TableMetadata
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# How often a commit is staged again after losing the pointer swap to a commit from another process
# (commits from this process take their table's lock and do not race each other), and the delay
# whose random part it waits before each: doubling from 10 ms to a second.
MAX_COMMIT_ATTEMPTS = 32
COMMIT_RETRY_FIRST_S, COMMIT_RETRY_MOST_S = 0.01, 1.0
# How often a commit whose end was not confirmed asks the store whether it landed, and how long it
# waits between two asks (more each time): two and a half seconds in all.
OUTCOME_ATTEMPTS = 4
OUTCOME_BACKOFF_S = 0.25
LOCK_STRIPES = 64


def retrying(attempt: Callable[[], T]) -> T:
    """`attempt()`, again while it raises `Stale` (tables' and views' commits alike); after
    MAX_COMMIT_ATTEMPTS lost races, CommitFailedException (409)."""
    retries = Retrying(
        retry=retry_if_exception_type(Stale),
        stop=stop_after_attempt(MAX_COMMIT_ATTEMPTS),
        wait=wait_random_exponential(multiplier=COMMIT_RETRY_FIRST_S, max=COMMIT_RETRY_MOST_S),
    )
    try:
        return retries(attempt)
    except RetryError:
        raise CommitFailedException(
            f"Gave up after {MAX_COMMIT_ATTEMPTS} attempts lost to concurrent commits"
        ) from None


class StagingLocks:
    """Staging serialized per object in this process: two commits to one table can never share a
    batch (the second depends on the first), so staging them one at a time costs nothing and saves
    the loser from staging again, possibly forever, under heavy contention."""

    def __init__(self) -> None:
        self._stripes = [threading.Lock() for _ in range(LOCK_STRIPES)]

    @contextmanager
    def holding(self, idents: list[Identifier]) -> Iterator[None]:
        with ExitStack() as stack:
            for stripe in sorted({hash(ident) % LOCK_STRIPES for ident in idents}):
                stack.enter_context(self._stripes[stripe])
            yield


@dataclass(frozen=True)
class TableState:
    ident: Identifier
    metadata_location: str | None
    metadata: TableMetadata
    json: bytes


def table_pointer(core: ServiceCore, ident: Identifier) -> Pointer:
    """The table's pointer as the store has it now (NoSuchTableError when it has none)."""
    with core.store.read(core.scope, snapshot=False) as view:
        pointer = view.pointer(TABLE, ident)
    if pointer is None:
        raise NoSuchTableError(f"Table does not exist: {ident}")
    core.table_pointers.put(ident, pointer)
    return pointer


def load_table(core: ServiceCore, ident: Identifier) -> TableState:
    """The table as the store has it now (NoSuchTableError when it has none)."""
    pointer = table_pointer(core, ident)
    loaded = core.table_files.get(pointer.metadata_location)
    return TableState(ident, pointer.metadata_location, loaded.metadata, loaded.json)


def _state(entry: Staged) -> TableState:
    return TableState(entry.ident, entry.metadata_location, entry.metadata, entry.json)


class TableOperations:
    """One table as a commit sees it: the pointer this process last saw (`current`, maybe stale),
    the store's (`refresh`), and a change staged on one of them (`stage`)."""

    def __init__(self, core: ServiceCore, rebase: AppendRebase, ident: Identifier) -> None:
        self.core = core
        self.rebase = rebase
        self.ident = ident

    def current(self) -> Pointer | None:
        return self.core.table_pointers.peek(self.ident)

    def refresh(self, view: ReadView) -> Pointer | None:
        return view.pointer(TABLE, self.ident)

    def stage(
        self, change: TableChange, base: Pointer | None, context: RequestContext, rebases: int | None
    ) -> Staged:
        """`change` staged on `base`; when its branch moved since its writer loaded the table and it
        is a fast append, made again on the head if `rebases` (those made so far) says it may be."""
        current = self.core.table_files.get(base.metadata_location) if base else None
        rebased = None
        try:
            try:
                entry = stage(change, base, current)
            except CommitFailedException as refused:
                if rebases is None or current is None:
                    raise
                rebased = self.rebase.again(change, current.metadata, refused, rebases)
                entry = stage(rebased.change, base, current)
                entry.rebased_list = rebased.manifest_list
            # A set-location, a place property, a create by updates; and every commit to a table
            # with places of its own beyond its location, which may have been stored before they
            # were checked as they are now.
            if entry.moved or (entry.changed and len(entry.places) > 1):
                owner = str(entry.metadata.table_uuid) if entry.base else ""
                self.core.places.check_all(entry.places, "Table", context.places, owner)
        except BaseException:
            if rebased is not None:
                remove_quietly(self.core.io, self.core.roots, rebased.manifest_list)
            raise
        return entry


class TableCommits:
    """The commits of a warehouse's tables: `commit` is the retry loop, `swap` the write-then-swap."""

    def __init__(self, core: ServiceCore, rebase: AppendRebase) -> None:
        self.core = core
        self.rebase = rebase
        self.locks = StagingLocks()

    def commit(
        self, changes: list[TableChange], txn: str | None, context: RequestContext
    ) -> list[TableState]:
        """Commit every change or none of them; `txn` tags the records of a multi-table transaction."""
        operations = [TableOperations(self.core, self.rebase, change.ident) for change in changes]
        idents = [change.ident for change in changes]
        if len(set(idents)) != len(idents):
            raise ValueError("A transaction may change each table only once")
        # The first attempt stages on the pointers this process last saw, when it saw them all: the
        # writer swaps only if each is still current, so a stale one costs an attempt, never a
        # wrong commit. Whatever an attempt from memory fails on, it is tried again from the store
        # before it is answered (another server may have moved the table).
        remembered = [ops.current() for ops in operations]
        from_memory = None not in remembered
        rebases = 0

        def staged_on(bases: list[Pointer | None], rebase: int | None) -> list[Staged]:
            pairs = zip(operations, changes, strict=True)
            return [
                ops.stage(change, base, context, rebase)
                for (ops, change), base in zip(pairs, bases, strict=True)
            ]

        def attempt() -> list[TableState]:
            nonlocal from_memory, rebases
            staged = None
            if from_memory:
                from_memory = False
                try:
                    staged = staged_on(remembered, None)
                except Exception:
                    staged = None
            if staged is None:
                with self.core.store.read(self.core.scope, snapshot=False) as view:
                    bases = [ops.refresh(view) for ops in operations]
                # A stale append is made again on the head, when the head is the store's and it is
                # the only change (DuckDB sends even one table's commit as a transaction).
                staged = staged_on(bases, rebases if len(changes) == 1 else None)
                rebases += sum(entry.rebased_list is not None for entry in staged)
            return self.swap(staged, txn, context)

        with self.locks.holding(idents):
            return retrying(attempt)

    def swap(self, staged: list[Staged], txn: str | None, context: RequestContext) -> list[TableState]:
        """Write the staged metadata files (synced, or kept in the transaction until the settler syncs
        them: catalog/file_settling.py), then swap every pointer in one store transaction if none
        moved since it was staged (`Stale` otherwise); what was written for a commit that did not
        land is removed."""
        written = [entry.rebased_list for entry in staged if entry.rebased_list is not None]
        for entry in staged:
            if entry.changed:
                self.core.limits.check_properties(entry.metadata.properties, "Table")
                check_policy(entry.metadata.properties)
                self.core.limits.check_metadata(entry.json, "Table")
        self.core.limits.check_room(self.core.local_warehouse)
        kept: set[str] = set()  # the files left unsynced, their bytes kept in the transaction instead
        settler = self.core.settler
        try:
            for entry in staged:
                if entry.changed:
                    if settler is None or not settler.keeps(entry.json):
                        write_durably(self.core.io, self.core.roots, entry.metadata_location, entry.json)
                    elif write_unsynced(self.core.io, self.core.roots, entry.metadata_location, entry.json):
                        kept.add(entry.metadata_location)
                    written.append(entry.metadata_location)
            txn_size = sum(entry.changed for entry in staged) if txn else None
            swap = PointerSwap(
                [self._swap_entry(entry, txn, txn_size, entry.metadata_location in kept) for entry in staged],
                context.idempotency,
                staged[0].metadata_location,
            )
            self.core.swap(swap, [entry.ident for entry in staged], context)
            states = [_state(entry) for entry in staged]
        except StoreUnavailableError as exc:
            states = self._after_lost_answer(staged, written, exc, context)
        except BaseException:
            for location in written:
                remove_quietly(self.core.io, self.core.roots, location)
            raise
        if kept and settler is not None:
            settler.written()
        for entry in staged:
            self.core.table_files.put(entry.metadata_location, Loaded(entry.metadata, entry.json))
            self.core.table_pointers.put(entry.ident, entry.pointer)
            if entry.rebased_list is not None:
                self.rebase.count(COMMITTED)
        return states

    def _swap_entry(self, entry: Staged, txn: str | None, txn_size: int | None, kept: bool) -> SwapEntry:
        """What the store transaction does for one staged change (catalog/pointer_swap.py)."""
        swap = SwapEntry(entry.ident, entry.base, entry.pointer, places=entry.places if entry.moved else None)
        if kept:
            swap.pending = PendingFile(entry.metadata_location, entry.pointer.uuid, entry.json)
        if entry.changed:
            swap.record = commit_record(entry, txn, txn_size)
            swap.added_snapshots = tuple(entry.added_snapshots)
            swap.spans = entry.spans
            if entry.rows:
                swap.rows = SinkRows(entry.pointer.uuid, self.core.name, str(entry.ident), entry.rows)
        return swap

    def _after_lost_answer(
        self, staged: list[Staged], written: list[str], exc: StoreUnavailableError, context: RequestContext
    ) -> list[TableState]:
        """Lost as its transaction ended, a commit may have landed: the new files then are what the
        tables point at, and must stay. Ask the store, as the Java reference's checkCommitStatus
        does, before removing anything. Lost before that, it did not (503)."""
        landed = self._landed(staged) if exc.maybe_committed else False
        if landed is None:
            raise CommitStateUnknownError(
                f"The commit's outcome is unknown: the catalog's store was lost as it ended ({exc}) "
                "and could not be asked since. Load the table to see whether it landed."
            ) from exc
        if not landed:
            for location in written:
                remove_quietly(self.core.io, self.core.roots, location)
            raise exc
        log.warning(
            "a commit whose answer from the store was lost had landed (request %s): %s",
            context.request_id,
            exc,
        )
        return [_state(entry) for entry in staged]

    def _landed(self, staged: list[Staged]) -> bool | None:
        """Whether a transaction whose end the store did not confirm committed: every pointer it
        changed names its new file (True), every one is still where it was (False), or the store
        cannot say (None)."""
        changed = [entry for entry in staged if entry.changed]
        for attempt in range(OUTCOME_ATTEMPTS):
            try:
                with self.core.store.read(self.core.scope, snapshot=False) as view:
                    now = [view.pointer(TABLE, entry.ident) for entry in changed]
            except StoreUnavailableError:
                time.sleep(OUTCOME_BACKOFF_S * (attempt + 1))
                continue
            if all(pointer == entry.pointer for pointer, entry in zip(now, changed, strict=True)):
                return True
            if all(pointer == entry.base for pointer, entry in zip(now, changed, strict=True)):
                return False
            return None  # moved on since: the new file may be in a later commit's history
        return None
