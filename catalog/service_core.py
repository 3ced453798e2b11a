"""What the catalog's operations share: the store, the writer, the metadata caches, the places
tables and views may live, and how a mutation is run for whoever asked for it. What tables and
views share beyond that (listing, drops, renames) is catalog/objects.py's."""

from __future__ import annotations

import functools
import logging
import secrets
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from isbre.catalog.commit_log import CommitLog
from isbre.catalog.file_settling import FileSettler
from isbre.catalog.file_uris import local_path
from isbre.catalog.identifiers import Identifier, path_segment
from isbre.catalog.limits import Limits
from isbre.catalog.locations import LocationPolicy
from isbre.catalog.lru import Lru
from isbre.catalog.maintenance_policy import check_policy
from isbre.catalog.metadata_files import Loaded, MetadataCache, parse_table_metadata, parse_view_metadata
from isbre.catalog.places import Places
from isbre.catalog.request_context import ANONYMOUS, RequestContext
from isbre.catalog.store import FIRST_WAREHOUSE, TABLE, VIEW, Pointer, ReadView, Store
from isbre.catalog.table_handles import TrustedRoots
from isbre.catalog.table_properties import check_no_code
from isbre.catalog.writer import Batch, Executes, Origin, Writer
from pyiceberg.exceptions import (
    NoSuchNamespaceError,
    NoSuchTableError,
    NoSuchViewError,
    TableAlreadyExistsError,
    ViewAlreadyExistsError,
)
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.view.metadata import ViewMetadata

log = logging.getLogger(__name__)

T = TypeVar("T")
TABLE_POINTERS = 65_536
# How often, by default, the metadata files of table commits are synced together (seconds).
METADATA_SYNC_S = 1.0
_MISSING: dict[str, type[Exception]] = {TABLE: NoSuchTableError, VIEW: NoSuchViewError}


def require_namespace(view: ReadView, namespace: tuple[str, ...]) -> dict[str, str]:
    properties = view.namespace(namespace)
    if properties is None:
        raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(namespace)}")
    return properties


def require_object(view: ReadView, kind: str, ident: Identifier) -> Pointer:
    pointer = view.pointer(kind, ident)
    if pointer is None:
        raise _MISSING[kind](f"{kind.capitalize()} does not exist: {ident}")
    return pointer


_EXISTS: dict[str, type[Exception]] = {TABLE: TableAlreadyExistsError, VIEW: ViewAlreadyExistsError}


def require_free(view: ReadView, ident: Identifier, kind: str, renamed: Identifier | None = None) -> None:
    """`ident` names no table and no view, for a new `kind` (or one `renamed` there), in the Java
    reference's words: clients match on them."""
    for found in (TABLE, VIEW):
        if view.pointer(found, ident) is None:
            continue
        if renamed is not None:
            message = f"Cannot rename {renamed} to {ident}. {found.capitalize()} already exists"
        elif found == kind:
            message = f"{found.capitalize()} already exists: {ident}"
        else:
            message = f"{found.capitalize()} with same name already exists: {ident}"
        raise _EXISTS[found](message)


def require_new_uuid(view: ReadView, table_uuid: str) -> None:
    """No table or view of the store holds `table_uuid`: everything the catalog keeps per table
    (consumers, coverage, location claims) is keyed by it, so a table's identity is never shared
    (a create or register naming another's uuid is refused, 409)."""
    if view.placed(table_uuid) is not None:
        raise TableAlreadyExistsError(
            f"Table uuid {table_uuid} is already another table's in this catalog: a table's uuid is its own"
        )


def read_for_register(cache: MetadataCache[Any], policy: LocationPolicy, location: str) -> Loaded[Any]:
    policy.check(location, "Metadata location")
    try:
        return cache.get(location)
    except Exception as exc:  # missing, unreadable or not metadata: the caller's mistake
        # Name the failure, not its text: a parse error can quote the file's contents.
        raise ValueError(f"Cannot read metadata at {location}: {type(exc).__name__}") from exc


class ServiceCore:
    """One warehouse's catalog, without its operations (namespace_operations.py, table_operations.py
    and view_operations.py hold those). Services for several warehouses of one store share its writer."""

    def __init__(
        self,
        store: Store,
        warehouse: str,
        io: FileIO | None = None,
        max_batch: int = 512,
        max_queue: int = 10_000,
        allowed_locations: tuple[str, ...] = (),
        limits: Limits | None = None,
        protected: tuple[str, ...] = (),
        on_fatal: Callable[[BaseException], None] | None = None,
        name: str = "isbre",
        scope: str = FIRST_WAREHOUSE,
        writer: Writer | None = None,
        table_defaults: Mapping[tuple[str, ...], Mapping[str, str]] | None = None,
        metadata_sync_s: float = METADATA_SYNC_S,
        settler: FileSettler | None = None,
        commit_wait_s: float = 0.0,
    ) -> None:
        """`protected`: locations no table or view may be in or around (the store's own files).
        `name`: the warehouse's name in records and events; `scope`: its namespaces in the store
        ("" for the store's first warehouse); `writer`: the store's writer, when another service
        of the same store made it; `table_defaults`: properties a new table gets under its own,
        by namespace (`()`: every one), the most specific winning; `metadata_sync_s`: how often
        the metadata files of table commits are synced together (0: each commit syncs its own);
        `settler`: the one syncing them, when another service of the same store made it;
        `commit_wait_s`: how long the writer lets a transaction wait for more commits to join it."""
        self.store = store
        self.name = name
        self.scope = scope
        self.io = io or PyArrowFileIO()
        self.places = Places(store, scope, warehouse, self.io, allowed_locations, protected)
        self.warehouse = self.places.warehouse
        self.roots = TrustedRoots(self.places.policy.roots)
        self.limits = limits or Limits()
        self.table_defaults = {tuple(ns): dict(props) for ns, props in (table_defaults or {}).items()}
        for namespace, properties in self.table_defaults.items():
            where = ".".join((name, *namespace))
            try:
                self.limits.check_properties(properties, "Table")
                check_policy(properties)
                check_no_code(properties)
            except ValueError as exc:
                raise ValueError(f"table_defaults of {where!r}: {exc}") from exc
        # close() stops the writer and the store: only the service that made them (not one sharing
        # another's writer).
        self.owns_writer = writer is None
        self.writer = writer or Writer(
            store, max_batch=max_batch, max_queue=max_queue, on_fatal=on_fatal, group_wait_s=commit_wait_s
        )
        if writer is None:
            settler = FileSettler(store, self.writer, metadata_sync_s)
        self.settler = settler
        self.commit_log = CommitLog(store, self.writer)
        # What runs table commits' pointer swaps: this writer, or on a server with several workers
        # the committer that groups every worker's (catalog/shared_writer.py).
        self.swaps: Executes = self.writer
        self.table_files: MetadataCache[TableMetadata] = MetadataCache(self.io, parse_table_metadata)
        self.view_files: MetadataCache[ViewMetadata] = MetadataCache(self.io, parse_view_metadata)
        # The pointer of each table as this process last committed or loaded it (maybe stale).
        self.table_pointers: Lru[Identifier, Pointer] = Lru(TABLE_POINTERS)

    @property
    def record_tags(self) -> tuple[str | None, ...]:
        """The `warehouse` values of this warehouse's records: its name, and for the store's first
        warehouse None too (records written before a store held several warehouses)."""
        return (self.name, None) if self.scope == FIRST_WAREHOUSE else (self.name,)

    def close(self) -> None:
        """Stop the writer and close the store (the service that made the writer does it)."""
        if self.owns_writer:
            if self.settler is not None:
                self.settler.close()
            self.writer.close()
            self.store.close()

    def run(
        self,
        mutation: Callable[[Batch], T],
        reads: Sequence[tuple[str, Identifier]] = (),
        context: RequestContext = ANONYMOUS,
    ) -> T:
        """Run `mutation` on the writer, seeing this warehouse and tagging its records with it and
        with the caller; `reads`: the (kind, identifier) pointers it reads first."""
        return self._run_by(self.writer, mutation, reads, context)

    def _run_by(
        self,
        runner: Executes,
        mutation: Callable[[Batch], T],
        reads: Sequence[tuple[str, Identifier]],
        context: RequestContext,
    ) -> T:
        origin = Origin(self.scope, self.name, context.actor)
        prefetch = [(kind, self.scope, ident) for kind, ident in reads]
        return runner.execute(mutation, prefetch, origin)

    def swap(self, swap: Callable[[Batch], T], tables: Sequence[Identifier], context: RequestContext) -> T:
        """A table commit's pointer swap (catalog/pointer_swap.py: plain data, keeping its request's
        answer itself), run by `swaps`."""
        self.limits.check_room(self.local_warehouse)
        return self._run_by(self.swaps, swap, [(TABLE, ident) for ident in tables], context)

    def mutate(
        self,
        mutation: Callable[[Batch], T],
        reads: Sequence[tuple[str, Identifier]] = (),
        context: RequestContext = ANONYMOUS,
        answer: Callable[[T], Any] = lambda result: None,
    ) -> T:
        """`run` for a change a request asked for: with the free disk it needs, and `answer(result)`
        kept under the request's Idempotency-Key (`RequestContext.answering`)."""
        self.limits.check_room(self.local_warehouse)
        return self.run(context.answering(mutation, answer), reads, context)

    def unsynced_files(self) -> int:
        """How many metadata files of commits wait for their group's sync (catalog/file_settling.py)."""
        with self.store.read(self.scope, snapshot=False) as view:
            return view.pending_count()

    # -- idempotent responses

    def idempotent_response(self, key: str) -> dict[str, Any] | None:
        with self.store.read(self.scope, snapshot=False) as view:
            return view.idempotent_response(key)

    def defaults_for(self, namespace: tuple[str, ...]) -> dict[str, str]:
        """The properties a new table in `namespace` gets under its own: the warehouse's, then
        each enclosing namespace's, the innermost winning."""
        found: dict[str, str] = {}
        for depth in range(len(namespace) + 1):
            found.update(self.table_defaults.get(namespace[:depth], {}))
        return found

    def default_location(self, namespace: tuple[str, ...], name: str, object_uuid: uuid.UUID) -> str:
        with self.store.read(self.scope) as view:
            require_namespace(view, namespace)
            root = self.places.namespace_location(namespace, view)
        return f"{root}/{path_segment(name)}-{object_uuid.hex}"

    # -- where tables and views live

    @functools.cached_property
    def local_warehouse(self) -> Path | None:
        """The disk whose free space commits check: the warehouse's, or for a warehouse on object
        storage the store's (when it has one here)."""
        return local_path(self.warehouse) or self.store.local_dir()

    def key(self, purpose: str) -> bytes:
        """The store's random key for `purpose`, made by the first process that asks: every worker
        and replica of the catalog, and the catalog after a restart, sign and check with it."""
        with self.store.read(self.scope, snapshot=False) as view:
            found = view.key(purpose)
        if found is not None:
            return found

        def mutation(batch: Batch) -> bytes:
            kept = batch.view.key(purpose)
            if kept is None:  # another process may have made it meanwhile: the first one is kept
                kept = secrets.token_bytes(32)
                batch.view.put_key(purpose, kept)
            return kept

        return self.run(mutation)
