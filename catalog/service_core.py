"""What the catalog's operations share: the store, the writer, the metadata caches, the places
tables and views may live, and how a mutation is run for whoever asked for it."""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

from isbre.catalog.backoff import Backoff
from isbre.catalog.commit_log import TABLE_CONSUMERS, CommitLog
from isbre.catalog.file_uris import local_path
from isbre.catalog.identifiers import Identifier, check_namespace, path_segment
from isbre.catalog.limits import Limits
from isbre.catalog.locations import LocationNotAllowedError, LocationPolicy, inside, normalized
from isbre.catalog.lru import Lru
from isbre.catalog.maintenance import check_policy
from isbre.catalog.metadata_files import Loaded, MetadataCache, parse_table_metadata, parse_view_metadata
from isbre.catalog.records import CommitRecord
from isbre.catalog.request_context import ANONYMOUS, RequestContext
from isbre.catalog.store import FIRST_WAREHOUSE, Pointer, ReadView, Store, WriteView
from isbre.catalog.table_properties import METADATA_PATH, PLACE_PROPERTIES, check_no_code
from isbre.catalog.table_staging import Place
from isbre.catalog.writer import Batch, Origin, Writer
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
TABLE, VIEW = "table", "view"
# How often a commit is re-staged after losing the pointer swap to a commit from another process
# (commits from this process take their table's lock and do not race each other).
MAX_COMMIT_ATTEMPTS = 32
# Between those attempts a commit waits a random part of a delay that doubles from 10 ms to a
# second (full jitter): processes racing for one table spread out instead of meeting again at once.
COMMIT_RETRY_FIRST_S, COMMIT_RETRY_MOST_S = 0.01, 1.0
LOCK_STRIPES = 64
TABLE_POINTERS = 65_536
_MISSING: dict[str, type[Exception]] = {TABLE: NoSuchTableError, VIEW: NoSuchViewError}


def commit_retries() -> Backoff:
    return Backoff(COMMIT_RETRY_FIRST_S, COMMIT_RETRY_MOST_S, jitter=True)


class Stale(Exception):
    """A pointer moved between staging and the swap; stage again."""


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
    ) -> None:
        """`protected`: locations no table or view may be in or around (the store's own files).
        `name`: the warehouse's name in records and events; `scope`: its namespaces in the store
        ("" for the store's first warehouse); `writer`: the store's writer, when another service
        of the same store made it; `table_defaults`: properties a new table gets under its own,
        by namespace (`()`: every one), the most specific winning."""
        self.store = store
        self.name = name
        self.scope = scope
        self.warehouse = warehouse.rstrip("/")
        self.locations = LocationPolicy.of(self.warehouse, allowed_locations)
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
        self.protected = tuple(normalized(location) for location in protected)
        self.io = io or PyArrowFileIO()
        # close() stops the writer and the store: only the service that made them (not one sharing
        # another's writer).
        self.owns_writer = writer is None
        self.writer = writer or Writer(store, max_batch=max_batch, max_queue=max_queue, on_fatal=on_fatal)
        self.commit_log = CommitLog(store, self.writer)
        self.table_files: MetadataCache[TableMetadata] = MetadataCache(self.io, parse_table_metadata)
        self.view_files: MetadataCache[ViewMetadata] = MetadataCache(self.io, parse_view_metadata)
        # The pointer of each table as this process last committed or loaded it (maybe stale).
        self.table_pointers: Lru[Identifier, Pointer] = Lru(TABLE_POINTERS)
        self._stripes = [threading.Lock() for _ in range(LOCK_STRIPES)]
        if not scope:
            self._index_locations()

    @property
    def record_tags(self) -> tuple[str | None, ...]:
        """The `warehouse` values of this warehouse's records: its name, and for the store's first
        warehouse None too (records written before a store held several warehouses)."""
        return (self.name, None) if self.scope == FIRST_WAREHOUSE else (self.name,)

    @contextmanager
    def staging(self, kind: str, idents: list[Identifier]) -> Iterator[None]:
        """Serialize staging per object in this process.

        Two commits to one table can never share a batch (the second depends on
        the first), so staging them one at a time costs nothing and saves the
        loser from re-staging, possibly forever, under heavy contention.
        """
        stripes = sorted({hash((kind, ident)) % LOCK_STRIPES for ident in idents})
        with ExitStack() as stack:
            for stripe in stripes:
                stack.enter_context(self._stripes[stripe])
            yield

    def close(self) -> None:
        """Stop the writer and close the store (the service that made the writer does it)."""
        if self.owns_writer:
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
        origin = Origin(self.scope, self.name, context.actor)
        prefetch = [(kind, self.scope, ident) for kind, ident in reads]
        return self.writer.execute(mutation, prefetch, origin)

    def mutate(
        self,
        mutation: Callable[[Batch], T],
        reads: Sequence[tuple[str, Identifier]] = (),
        context: RequestContext = ANONYMOUS,
        answer: Callable[[T], Any] = lambda result: None,
    ) -> T:
        """`_run` for a change a request asked for: where the request carries an Idempotency-Key,
        `answer(result)` is kept under it in the change's own transaction (an attempt that lost a
        race and is staged again keeps it only when it commits)."""
        self.limits.check_room(self.local_warehouse)
        idempotency = context.idempotency
        if idempotency is None:
            return self.run(mutation, reads, context)

        def answered(batch: Batch) -> T:
            result = mutation(batch)
            idempotency.keep(batch.view, answer(result))
            return result

        return self.run(answered, reads, context)

    # -- idempotent responses

    def idempotent_response(self, key: str) -> dict[str, Any] | None:
        with self.store.read(self.scope, snapshot=False) as view:
            return view.idempotent_response(key)

    def namespace_location(self, namespace: tuple[str, ...]) -> str:
        """Where the namespace's tables go by default: its `location` property, or under the warehouse."""
        with self.store.read(self.scope) as view:
            properties = view.namespace(namespace) or {}
        default = "/".join((self.warehouse, *(path_segment(level) for level in namespace)))
        return properties.get("location", "").rstrip("/") or default

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
        return f"{self.namespace_location(namespace)}/{path_segment(name)}-{object_uuid.hex}"

    def check_protected(self, location: str, what: str) -> None:
        found = normalized(location)
        for place in self.protected:
            if inside(found, place) or inside(place, found):
                raise LocationNotAllowedError(f"{what} {location!r} is in or around the catalog's own store")

    def check_place(
        self, location: str, what: str, places: LocationPolicy | None, writes_to: str | None = ""
    ) -> None:
        """Where a table or view may live: allowed, and away from the store. `writes_to`: for a place
        isbre is about to write a metadata file in, the object moving there ("" for a new one): the
        place must not be in or around another object's before anything is written (the writer
        checks overlaps again when it claims the place, `_claim`); None for a register, which
        writes nothing."""
        (places or self.locations).check(location, what)
        self.check_protected(location, what)
        if writes_to is None:
            return
        with self.store.read(self.scope) as view:
            others = [
                place
                for place, holder in view.overlapping(normalized(location))
                if object_of(holder) != writes_to
            ]
        if others:
            raise LocationNotAllowedError(
                f"{what} {location!r} overlaps the files of another table or view, at {others[0]}"
            )

    def check_places(
        self, where: tuple[Place, ...], what: str, places: LocationPolicy | None, writes_to: str | None = ""
    ) -> None:
        """`_check_place` for each place of a table or view (`catalog.tables.named_places`)."""
        for name, place in where:
            self.check_place(place, f"{what} {name}", places, writes_to)

    @staticmethod
    def claim(
        view: WriteView, owner: str, location: str, what: str, moving: bool = True, mine: tuple[str, ...] = ()
    ) -> None:
        """Index `location` as `owner`'s, unless another table or view lives in, at or around it.

        `moving`: `owner` is already in the catalog and changes its place (its old place, and its
        other places, are no conflict); otherwise any object found there is another, even one
        with the same uuid, but for the places in `mine` (claimed by the same call)."""
        found = normalized(location)
        for other, other_owner in view.overlapping(found):
            if object_of(other_owner) != object_of(owner) or not (moving or other_owner in mine):
                raise LocationNotAllowedError(
                    f"{what} {location!r} overlaps the files of another table or view, at {other}"
                )
        view.place(owner, found)

    def claim_places(
        self, view: WriteView, owner: str, where: tuple[Place, ...], what: str, moving: bool = True
    ) -> None:
        """Index every place of the object `owner` (its location first), and forget those it no
        longer has."""
        claimed: tuple[str, ...] = ()
        for name, place in where:
            held = owner + _place_suffix(name)
            self.claim(view, held, place, f"{what} {name}", moving, claimed)
            claimed += (held,)
        for name in PLACE_PROPERTIES:
            if owner + _place_suffix(name) not in claimed:
                view.unplace(owner + _place_suffix(name))

    def list_objects(self, kind: str, namespace: tuple[str, ...], after: str | None, limit: int | None):
        namespace = check_namespace(namespace)
        with self.store.read(self.scope) as view:
            if view.namespace(namespace) is None:
                raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(namespace)}")
            return view.identifiers(kind, namespace, after, limit)

    def drop_object(
        self,
        kind: str,
        ident: Identifier,
        context: RequestContext,
        properties: dict[str, Any] | None = None,
    ) -> Pointer:
        def mutation(batch: Batch) -> Pointer:
            pointer = require_object(batch.view, kind, ident)
            batch.view.delete_pointer(kind, ident)
            unplace(batch.view, pointer.uuid)
            if kind == TABLE:
                batch.view.drop_coverage(pointer.uuid)
                for name in batch.view.cursors():  # the table's consumers go with it
                    if name.startswith(f"{TABLE_CONSUMERS}{pointer.uuid}:"):
                        batch.view.delete_cursor(name)
            batch.log(
                CommitRecord(
                    f"{kind}.drop",
                    list(ident.namespace),
                    ident.name,
                    table_uuid=pointer.uuid,
                    previous_metadata_location=pointer.metadata_location,
                    properties=properties,
                )
            )
            return pointer

        return self.mutate(mutation, context=context)

    def rename_object(
        self, kind: str, source: Identifier, target: Identifier, context: RequestContext
    ) -> None:
        def mutation(batch: Batch) -> None:
            pointer = require_object(batch.view, kind, source)
            require_namespace(batch.view, target.namespace)
            require_free(batch.view, target, kind, renamed=source)
            batch.view.delete_pointer(kind, source)
            batch.view.put_pointer(kind, target, pointer)
            batch.log(
                CommitRecord(
                    f"{kind}.rename",
                    list(target.namespace),
                    target.name,
                    table_uuid=pointer.uuid,
                    metadata_location=pointer.metadata_location,
                    previous={"namespace": list(source.namespace), "name": source.name},
                )
            )

        self.mutate(mutation, context=context)

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

    def _index_locations(self) -> None:
        """Stores made before locations were indexed: index every table's and view's location, once."""
        with self.store.read(self.scope) as view:
            if view.marker("locations"):
                return
            pointers = [(kind, p) for kind in (TABLE, VIEW) for p in _every_pointer(view, kind)]
        placed = []
        for kind, pointer in pointers:
            cache = self.table_files if kind == TABLE else self.view_files
            try:
                placed.append(
                    (pointer.uuid, normalized(cache.get(pointer.metadata_location).metadata.location))
                )
            except Exception as exc:
                log.warning("cannot index the location of %s %s: %s", kind, pointer.uuid, exc)

        def mutation(batch: Batch) -> None:
            if not batch.view.marker("locations"):
                for owner, location in placed:
                    batch.view.place(owner, location)
                batch.view.set_marker("locations")

        self.run(mutation)


# The location index holds an object's location under its uuid, and each other place under its
# uuid with a suffix: `#metadata` for `write.metadata.path`, `#<property>` for the data paths.
_SUFFIXES = {"location": "", METADATA_PATH: "#metadata"}


def _place_suffix(name: str) -> str:
    return _SUFFIXES.get(name, f"#{name}")


def object_of(owner: str) -> str:
    """The uuid of the table or view that holds an indexed place."""
    return owner.split("#", 1)[0]


def unplace(view: WriteView, owner: str) -> None:
    for name in ("location", *PLACE_PROPERTIES):
        view.unplace(owner + _place_suffix(name))


def _every_pointer(view: ReadView, kind: str, parent: tuple[str, ...] = ()) -> Iterator[Pointer]:
    for namespace in view.namespaces(parent, None, None):
        for ident in view.identifiers(kind, namespace, None, None):
            pointer = view.pointer(kind, ident)
            if pointer is not None:
                yield pointer
        yield from _every_pointer(view, kind, namespace)
