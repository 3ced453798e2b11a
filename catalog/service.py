"""The catalog's operations: what the REST API and the embedded PyIceberg catalog both call.

Reads go straight to a store read transaction and the metadata cache. Every
write is a mutation run by the writer; table and view commits stage their new
metadata file first (in the caller's thread) and let the writer swap the
pointer only if nobody moved it meanwhile.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from isbre.catalog.coverage import Coverage, snapshot_spans
from isbre.catalog.deletion import TableFiles
from isbre.catalog.identifiers import Identifier, check_namespace, path_segment
from isbre.catalog.limits import Limits
from isbre.catalog.locations import LocationNotAllowedError, LocationPolicy, inside, normalized
from isbre.catalog.lru import Lru
from isbre.catalog.metadata_files import (
    Loaded,
    MetadataCache,
    local_path,
    make_dirs_durably,
    metadata_json,
    parse_table_metadata,
    parse_view_metadata,
    remove_quietly,
    write_durably,
)
from isbre.catalog.metadata_updates import check_unique_ids
from isbre.catalog.purge import PurgeIncompleteError, PurgeReport, purge_files
from isbre.catalog.records import CommitRecord, now_us
from isbre.catalog.store import Pointer, ReadView, Store, WriteView
from isbre.catalog.tables import (
    METADATA_PATH,
    Staged,
    TableChange,
    check_carried_paths,
    commit_record,
    new_metadata,
    next_metadata_location,
    places_of,
    stage,
)
from isbre.catalog.views import ViewRequirement, ViewUpdate, new_view_metadata, update_view_metadata
from isbre.catalog.writer import Batch, Writer
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    NoSuchViewError,
    TableAlreadyExistsError,
    ViewAlreadyExistsError,
)
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.sorting import SortOrder
from pyiceberg.view.metadata import ViewMetadata, ViewVersion

log = logging.getLogger(__name__)

T = TypeVar("T")
TABLE, VIEW = "table", "view"
# How often a commit is re-staged after losing the pointer swap to a commit from another process
# (commits from this process take their table's lock and do not race each other).
MAX_COMMIT_ATTEMPTS = 32
LOCK_STRIPES = 64
TABLE_POINTERS = 65_536
# Expired Idempotency-Keys removed per writer transaction: each step holds the writer well under 10 ms.
TRIM_CHUNK = 500
_MISSING: dict[str, type[Exception]] = {TABLE: NoSuchTableError, VIEW: NoSuchViewError}


# What the caller of the next service operation wants done inside the transaction that commits it,
# given the mutation's result: the REST layer stores an idempotent response there, atomically with
# the change it answers.
_after_mutation: ContextVar[Callable[[Batch, Any], None] | None] = ContextVar("after_mutation", default=None)


@contextmanager
def after_mutation(hook: Callable[[Batch, Any], None]) -> Iterator[None]:
    token = _after_mutation.set(hook)
    try:
        yield
    finally:
        _after_mutation.reset(token)


# Who asks for the next service operations (a principal's name); recorded in their commit records.
_actor: ContextVar[str | None] = ContextVar("actor", default=None)


@contextmanager
def acting_as(actor: str | None) -> Iterator[None]:
    token = _actor.set(actor)
    try:
        yield
    finally:
        _actor.reset(token)


class ConflictingPropertiesError(ValueError):
    """A property key appears in both the updates and the removals of one request."""


class _Stale(Exception):
    """A pointer moved between staging and the swap; stage again."""


@dataclass(frozen=True)
class TableState:
    ident: Identifier
    metadata_location: str | None
    metadata: TableMetadata
    json: bytes


@dataclass(frozen=True)
class TableCoverage:
    table_uuid: str
    coverage: Coverage
    commit_seq: int | None = None


@dataclass(frozen=True)
class ViewState:
    ident: Identifier
    metadata_location: str
    metadata: ViewMetadata
    json: bytes


@dataclass(frozen=True)
class PropertiesChange:
    updated: list[str]
    removed: list[str]
    missing: list[str]


def _require_namespace(view: ReadView, namespace: tuple[str, ...]) -> dict[str, str]:
    properties = view.namespace(namespace)
    if properties is None:
        raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(namespace)}")
    return properties


_EXISTS: dict[str, type[Exception]] = {TABLE: TableAlreadyExistsError, VIEW: ViewAlreadyExistsError}


def _require_free(view: ReadView, ident: Identifier, kind: str, renamed: Identifier | None = None) -> None:
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


def _read_for_register(cache: MetadataCache[Any], policy: LocationPolicy, location: str) -> Loaded[Any]:
    policy.check(location, "Metadata location")
    try:
        return cache.get(location)
    except Exception as exc:  # missing, unreadable or not metadata: the caller's mistake
        # Name the failure, not its text: a parse error can quote the file's contents.
        raise ValueError(f"Cannot read metadata at {location}: {type(exc).__name__}") from exc


class CatalogService:
    """One warehouse's catalog. Services for several warehouses of one store share its writer."""

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
        scope: str = "",
        writer: Writer | None = None,
    ) -> None:
        """`protected`: locations no table or view may be in or around (the store's own files).
        `name`: the warehouse's name in records and events; `scope`: its namespaces in the store
        ("" for the store's first warehouse); `writer`: the store's writer, when another service
        of the same store made it."""
        self.store = store
        self.name = name
        self.scope = scope
        self.warehouse = warehouse.rstrip("/")
        self.locations = LocationPolicy.of(self.warehouse, allowed_locations)
        self.limits = limits or Limits()
        self.protected = tuple(normalized(location) for location in protected)
        self.io = io or PyArrowFileIO()
        self._owns_writer = writer is None
        self.writer = writer or Writer(store, max_batch=max_batch, max_queue=max_queue, on_fatal=on_fatal)
        self.table_files: MetadataCache[TableMetadata] = MetadataCache(self.io, parse_table_metadata)
        self.view_files: MetadataCache[ViewMetadata] = MetadataCache(self.io, parse_view_metadata)
        # The pointer of each table as this process last committed or loaded it (maybe stale).
        self._table_pointers: Lru[Identifier, Pointer] = Lru(TABLE_POINTERS)
        self._stripes = [threading.Lock() for _ in range(LOCK_STRIPES)]
        if not scope:
            self._index_locations()

    @contextmanager
    def _staging(self, kind: str, idents: list[Identifier]) -> Iterator[None]:
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

    @classmethod
    def open(cls, warehouse: Path, **options: Any) -> CatalogService:
        """The embedded catalog: LMDB under `<warehouse>/isbre.lmdb`, tables under `<warehouse>/`;
        `options` are those of `catalog.warehouses.open_warehouses`."""
        from isbre.catalog.warehouses import Warehouse, open_warehouses

        (service,) = open_warehouses(None, [Warehouse("isbre", str(warehouse))], **options)
        return service

    @classmethod
    def follow_log(cls, location: str | Path) -> CatalogService:
        """A service over the store at `location` (see `catalog.stores`) for a process that only
        reads and follows the log (the events fan-out): it serves no warehouse's tables."""
        from isbre.catalog.stores import open_store, store_files

        store = open_store(location, migrate=False)
        # It serves no tables: a root no table can be under.
        return cls(store, "file:///nonexistent", protected=store_files(store))

    def close(self) -> None:
        """Stop the writer and close the store (the service that made the writer does it)."""
        if self._owns_writer:
            self.writer.close()
            self.store.close()

    def _run(self, mutation: Callable[[Batch], T], reads: Sequence[tuple[str, Identifier]] = ()) -> T:
        """Run `mutation` on the writer, seeing this warehouse and tagging its records with it;
        `reads`: the (kind, identifier) pointers it reads first."""

        actor = _actor.get()  # read here: the mutation runs on the writer's thread

        def in_warehouse(batch: Batch) -> T:
            root = batch.view
            batch.view, batch.warehouse, batch.actor = root.scoped(self.scope), self.name, actor
            try:
                return mutation(batch)
            finally:
                batch.view, batch.warehouse, batch.actor = root, None, None

        return self.writer.execute(in_warehouse, [(kind, self.scope, ident) for kind, ident in reads])

    def _mutate(self, mutation: Callable[[Batch], T], reads: Sequence[tuple[str, Identifier]] = ()) -> T:
        self.limits.check_room(self._local_warehouse)
        hook = _after_mutation.get()
        if hook is None:
            return self._run(mutation, reads)

        def hooked(batch: Batch) -> T:
            result = mutation(batch)
            hook(batch, result)
            return result

        result = self._run(hooked, reads)
        # The hook belongs to the operation's first mutation that commits: an attempt that lost a
        # race and is staged again keeps it (a rolled-back attempt stored nothing).
        _after_mutation.set(None)
        return result

    # -- idempotent responses

    def idempotent_response(self, key: str) -> dict[str, Any] | None:
        with self.store.read(self.scope, snapshot=False) as view:
            return view.idempotent_response(key)

    def store_idempotent_response(self, key: str, response: dict[str, Any]) -> None:
        """For answers that changed nothing (refusals, staged creates): no atomicity needed."""

        def mutation(batch: Batch) -> None:
            if batch.view.idempotent_response(key) is None:
                batch.view.put_idempotent_response(key, response)

        self._run(mutation)

    def trim_idempotency(self, keep_us: int, chunk: int = TRIM_CHUNK) -> int:
        def mutation(batch: Batch) -> int:
            return batch.view.trim_idempotency(now_us() - keep_us, chunk)

        removed = 0
        while (step := self._run(mutation)) == chunk:
            removed += step
        return removed + step

    # -- namespaces

    def _check_namespace_properties(self, properties: dict[str, str], places: LocationPolicy | None) -> None:
        self.limits.check_properties(properties, "Namespace")
        if "location" in properties:
            (places or self.locations).check(properties["location"], "Namespace location")
            self._check_protected(properties["location"], "Namespace location")

    def namespace_location(self, namespace: tuple[str, ...]) -> str:
        """Where the namespace's tables go by default: its `location` property, or under the warehouse."""
        with self.store.read(self.scope) as view:
            properties = view.namespace(namespace) or {}
        default = "/".join((self.warehouse, *(path_segment(level) for level in namespace)))
        return properties.get("location", "").rstrip("/") or default

    def create_namespace(
        self, namespace: tuple[str, ...], properties: dict[str, str], places: LocationPolicy | None = None
    ) -> dict[str, str]:
        namespace = check_namespace(namespace)
        self._check_namespace_properties(properties, places)

        def mutation(batch: Batch) -> dict[str, str]:
            if batch.view.namespace(namespace) is not None:
                raise NamespaceAlreadyExistsError(f"Namespace already exists: {'.'.join(namespace)}")
            if len(namespace) > 1:
                _require_namespace(batch.view, namespace[:-1])
            batch.view.put_namespace(namespace, properties)
            batch.log(CommitRecord("namespace.create", list(namespace), properties=dict(properties)))
            return properties

        return self._mutate(mutation)

    def load_namespace(self, namespace: tuple[str, ...]) -> dict[str, str]:
        namespace = check_namespace(namespace)
        with self.store.read(self.scope) as view:
            properties = view.namespace(namespace)
        if properties is None:
            raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(namespace)}")
        return properties

    def list_namespaces(
        self, parent: tuple[str, ...], after: tuple[str, ...] | None = None, limit: int | None = None
    ) -> list[tuple[str, ...]]:
        with self.store.read(self.scope) as view:
            if parent and view.namespace(check_namespace(parent)) is None:
                raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(parent)}")
            return view.namespaces(parent, after, limit)

    def drop_namespace(self, namespace: tuple[str, ...]) -> None:
        namespace = check_namespace(namespace)

        def mutation(batch: Batch) -> None:
            _require_namespace(batch.view, namespace)
            if not batch.view.is_empty(namespace):
                raise NamespaceNotEmptyError(f"Namespace is not empty: {'.'.join(namespace)}")
            batch.view.delete_namespace(namespace)
            batch.log(CommitRecord("namespace.drop", list(namespace)))

        self._mutate(mutation)

    def update_namespace(
        self,
        namespace: tuple[str, ...],
        removals: list[str],
        updates: dict[str, str],
        places: LocationPolicy | None = None,
    ) -> PropertiesChange:
        namespace = check_namespace(namespace)
        overlap = set(removals) & set(updates)
        if overlap:
            raise ConflictingPropertiesError(f"Properties are both updated and removed: {sorted(overlap)}")
        self._check_namespace_properties(updates, places)

        def mutation(batch: Batch) -> PropertiesChange:
            properties = dict(_require_namespace(batch.view, namespace))
            removed = [key for key in removals if key in properties]
            missing = [key for key in removals if key not in properties]
            for key in removed:
                del properties[key]
            properties.update(updates)
            batch.view.put_namespace(namespace, properties)
            batch.log(
                CommitRecord(
                    "namespace.update", list(namespace), properties={"updated": updates, "removed": removed}
                )
            )
            return PropertiesChange(sorted(updates), removed, missing)

        return self._mutate(mutation)

    # -- tables

    def _default_location(self, namespace: tuple[str, ...], name: str, object_uuid: uuid.UUID) -> str:
        with self.store.read(self.scope) as view:
            _require_namespace(view, namespace)
        return f"{self.namespace_location(namespace)}/{path_segment(name)}-{object_uuid.hex}"

    def _check_protected(self, location: str, what: str) -> None:
        found = normalized(location)
        for place in self.protected:
            if inside(found, place) or inside(place, found):
                raise LocationNotAllowedError(f"{what} {location!r} is in or around the catalog's own store")

    def _check_place(
        self, location: str, what: str, places: LocationPolicy | None, writes_to: str | None = ""
    ) -> None:
        """Where a table or view may live: allowed, and away from the store. `writes_to`: for a place
        isbre is about to write a metadata file in, the object moving there ("" for a new one): the
        place must not be in or around another object's before anything is written (the writer
        checks overlaps again when it claims the place, `_claim`); None for a register, which
        writes nothing."""
        (places or self.locations).check(location, what)
        self._check_protected(location, what)
        if writes_to is None:
            return
        with self.store.read(self.scope) as view:
            others = [
                place
                for place, holder in view.overlapping(normalized(location))
                if _object(holder) != writes_to
            ]
        if others:
            raise LocationNotAllowedError(
                f"{what} {location!r} overlaps the files of another table or view, at {others[0]}"
            )

    def _check_places(
        self, where: tuple[str, ...], what: str, places: LocationPolicy | None, writes_to: str | None = ""
    ) -> None:
        """`_check_place` for each place of a table or view (`catalog.tables.places`)."""
        for place, name in zip(where, (f"{what} location", f"{what} {METADATA_PATH}"), strict=False):
            self._check_place(place, name, places, writes_to)

    @staticmethod
    def _claim(view: WriteView, owner: str, location: str, what: str, moving: bool = True) -> None:
        """Index `location` as `owner`'s, unless another table or view lives in, at or around it.

        `moving`: `owner` is already in the catalog and changes its place (its old place, and its
        other place, are no conflict); otherwise any object found there, even one with the same
        uuid, is another."""
        found = normalized(location)
        for other, other_owner in view.overlapping(found):
            if _object(other_owner) != _object(owner) or not moving:
                raise LocationNotAllowedError(
                    f"{what} {location!r} overlaps the files of another table or view, at {other}"
                )
        view.place(owner, found)

    def _claim_places(
        self, view: WriteView, owner: str, where: tuple[str, ...], what: str, moving: bool = True
    ) -> None:
        """Index every place of the object `owner`: its location, and its metadata path if it has one."""
        self._claim(view, owner, where[0], f"{what} location", moving)
        if len(where) > 1:
            self._claim(view, owner + _METADATA_PLACE, where[1], f"{what} {METADATA_PATH}")
        else:
            view.unplace(owner + _METADATA_PLACE)

    def table_pointer(self, ident: Identifier) -> Pointer:
        with self.store.read(self.scope, snapshot=False) as view:
            pointer = view.pointer(TABLE, ident)
        if pointer is None:
            raise NoSuchTableError(f"Table does not exist: {ident}")
        self._table_pointers.put(ident, pointer)
        return pointer

    def load_table(self, ident: Identifier) -> TableState:
        pointer = self.table_pointer(ident)
        loaded = self.table_files.get(pointer.metadata_location)
        return TableState(ident, pointer.metadata_location, loaded.metadata, loaded.json)

    def table_metadata_or_none(self, location: str) -> TableMetadata | None:
        """The metadata at `location`, or None when it cannot be read (e.g. purged since)."""
        try:
            return self.table_files.get(location).metadata
        except Exception:
            return None

    def load_table_if_cached(self, ident: Identifier) -> TableState | None:
        """`load_table` when it needs no file read (None otherwise): safe to call on an event loop."""
        pointer = self.table_pointer(ident)
        loaded = self.table_files.peek(pointer.metadata_location)
        if loaded is None:
            return None
        return TableState(ident, pointer.metadata_location, loaded.metadata, loaded.json)

    def list_tables(self, namespace: tuple[str, ...], after: str | None = None, limit: int | None = None):
        return self._list(TABLE, namespace, after, limit)

    def _list(self, kind: str, namespace: tuple[str, ...], after: str | None, limit: int | None):
        namespace = check_namespace(namespace)
        with self.store.read(self.scope) as view:
            if view.namespace(namespace) is None:
                raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(namespace)}")
            return view.identifiers(kind, namespace, after, limit)

    def create_table(
        self,
        ident: Identifier,
        schema: Schema,
        partition_spec: PartitionSpec,
        sort_order: SortOrder,
        location: str | None = None,
        properties: dict[str, str] | None = None,
        stage_only: bool = False,
        places: LocationPolicy | None = None,
    ) -> TableState:
        with self.store.read(self.scope) as view:
            _require_namespace(view, ident.namespace)
            _require_free(view, ident, TABLE)
        table_uuid = uuid.uuid4()
        location = (location or "").rstrip("/") or self._default_location(
            ident.namespace, ident.name, table_uuid
        )
        self._check_places(places_of(location, properties or {}), "Table", places)
        self.limits.check_properties(properties or {}, "Table")
        metadata = new_metadata(
            schema, partition_spec, sort_order, location, dict(properties or {}), table_uuid
        )
        if stage_only:
            if (root := local_path(location)) is not None:
                # Engines write a staged table's files before it exists (DuckDB's CTAS writes its
                # manifests), and not every engine creates directories on a local disk.
                make_dirs_durably(root / "metadata")
            return TableState(ident, None, metadata, metadata_json(metadata))
        first = next_metadata_location(location, metadata.properties, None)
        staged = Staged(ident, None, metadata, metadata_json(metadata), first, True)
        return self._swap([staged], txn=None)[0]

    def coverage(self, ident: Identifier, snapshot_id: int | None = None) -> TableCoverage:
        """The source offsets the table's commits declared (and which commit added `snapshot_id`)."""
        with self.store.read(self.scope) as view:
            pointer = view.pointer(TABLE, ident)
            if pointer is None:
                raise NoSuchTableError(f"Table does not exist: {ident}")
            commit_seq = None if snapshot_id is None else view.coverage_commit(pointer.uuid, snapshot_id)
            return TableCoverage(pointer.uuid, view.coverage(pointer.uuid), commit_seq)

    def commit_table(self, change: TableChange, places: LocationPolicy | None = None) -> TableState:
        return self.commit_tables([change], txn=None, places=places)[0]

    def commit_tables(
        self, changes: list[TableChange], txn: str | None, places: LocationPolicy | None = None
    ) -> list[TableState]:
        """Commit every change or none of them; `txn` tags the records of a multi-table transaction."""
        idents = [change.ident for change in changes]
        if len(set(idents)) != len(idents):
            raise ValueError("A transaction may change each table only once")
        with self._staging(TABLE, idents):
            # Stage against the pointers this process last saw, when it saw them all: the writer
            # swaps only if each is still current, so a stale one costs an attempt, never a
            # wrong commit. Whatever an attempt from memory fails on, it is tried again from
            # the store before it is answered (another server may have moved the table).
            remembered = [self._table_pointers.peek(ident) for ident in idents]
            bases = None if None in remembered else remembered
            for _ in range(MAX_COMMIT_ATTEMPTS):
                from_store = bases is None
                if bases is None:
                    with self.store.read(self.scope, snapshot=False) as view:
                        bases = [view.pointer(TABLE, ident) for ident in idents]
                try:
                    staged = [
                        stage(change, base, self.table_files.get(base.metadata_location) if base else None)
                        for change, base in zip(changes, bases, strict=True)
                    ]
                    for entry in staged:
                        if entry.moved:  # set-location, a metadata path, a create by updates
                            owner = str(entry.metadata.table_uuid) if entry.base else ""
                            self._check_places(entry.places, "Table", places, owner)
                except Exception:
                    if from_store:
                        raise
                    bases = None
                    continue
                try:
                    return self._swap(staged, txn)
                except _Stale:
                    bases = None
        raise CommitFailedException(
            f"Gave up after {MAX_COMMIT_ATTEMPTS} attempts lost to concurrent commits"
        )

    def _swap(self, staged: list[Staged], txn: str | None) -> list[TableState]:
        written: list[str] = []
        for entry in staged:
            if entry.changed:
                self.limits.check_properties(entry.metadata.properties, "Table")
                self.limits.check_metadata(entry.json, "Table")
        self.limits.check_room(self._local_warehouse)
        try:
            for entry in staged:
                if entry.changed:
                    write_durably(self.io, entry.metadata_location, entry.json)
                    written.append(entry.metadata_location)

            txn_size = sum(entry.changed for entry in staged) if txn else None

            def mutation(batch: Batch) -> list[TableState]:
                for entry in staged:
                    now = batch.view.pointer(TABLE, entry.ident)
                    if now != entry.base:
                        if entry.base is None:  # a concurrent create of the same table won
                            raise TableAlreadyExistsError(f"Table already exists: {entry.ident}")
                        raise _Stale
                    if entry.base is None:
                        _require_namespace(batch.view, entry.ident.namespace)
                        _require_free(batch.view, entry.ident, TABLE)
                for entry in staged:
                    if entry.moved:
                        self._claim_places(batch.view, entry.pointer.uuid, entry.places, "Table")
                    if entry.changed:
                        batch.view.put_pointer(TABLE, entry.ident, entry.pointer)
                        record = batch.log(commit_record(entry, txn, txn_size))
                        if entry.spans:
                            batch.view.add_coverage(
                                entry.pointer.uuid, list(entry.spans), record.snapshot_id, record.commit_seq
                            )
                return [TableState(e.ident, e.metadata_location, e.metadata, e.json) for e in staged]

            states = self._mutate(mutation, [(TABLE, entry.ident) for entry in staged])
        except BaseException:
            for location in written:
                remove_quietly(self.io, location)
            raise
        for entry in staged:
            self.table_files.put(entry.metadata_location, Loaded(entry.metadata, entry.json))
            self._table_pointers.put(entry.ident, entry.pointer)
        return states

    def drop_table(self, ident: Identifier, purge: bool = False) -> None:
        pointer = self._drop(TABLE, ident, {"purge": purge})
        if purge:
            self._purge(ident, pointer)

    def _drop(self, kind: str, ident: Identifier, properties: dict[str, Any] | None = None) -> Pointer:
        def mutation(batch: Batch) -> Pointer:
            pointer = batch.view.pointer(kind, ident)
            if pointer is None:
                raise _MISSING[kind](f"{kind.capitalize()} does not exist: {ident}")
            batch.view.delete_pointer(kind, ident)
            _unplace(batch.view, pointer.uuid)
            if kind == TABLE:
                batch.view.drop_coverage(pointer.uuid)
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

        return self._mutate(mutation)

    def _purge(self, ident: Identifier, pointer: Pointer) -> None:
        """Delete a dropped table's files: only those under its own location, never the store's, never
        another table's or view's. Whatever is left behind is recorded in the log and reported."""
        try:
            metadata = self.table_files.get(pointer.metadata_location).metadata
        except Exception as exc:
            report = PurgeReport(
                None, problems=[f"metadata {pointer.metadata_location}: {type(exc).__name__}"]
            )
        else:
            report = purge_files(self.io, metadata, [pointer.metadata_location], self._table_files(metadata))
        if not report.left_behind:
            return

        def mutation(batch: Batch) -> CommitRecord:
            return batch.log(
                CommitRecord(
                    "table.purge-incomplete",
                    list(ident.namespace),
                    ident.name,
                    table_uuid=pointer.uuid,
                    previous_metadata_location=pointer.metadata_location,
                    properties=report.summary(),
                )
            )

        record = self._mutate(mutation)
        log.warning(
            "purge of %s left files behind (commit_seq %d): %s", ident, record.commit_seq, report.summary()
        )
        if report.problems:
            raise PurgeIncompleteError(
                f"Table {ident} was dropped, but its purge is incomplete: {len(report.problems)} "
                f"problem(s), first: {report.problems[0]}; what was left behind is recorded at commit_seq "
                f"{record.commit_seq} (kind table.purge-incomplete)"
            )

    def _table_files(self, metadata: TableMetadata) -> TableFiles | None:
        """The deleter of a dropped table's files (None when its location may not be deleted from)."""

        def claimed_by_other(location: str) -> bool:
            # The dropped table is no longer indexed: anyone here is another.
            with self.store.read(self.scope) as view:
                return bool(view.overlapping(location))

        try:
            where = places_of(metadata.location, metadata.properties)
            return TableFiles(self.io, where, self.locations.roots, self.protected, claimed_by_other)
        except LocationNotAllowedError as exc:
            log.warning("purge deletes nothing at %s: %s", metadata.location, exc)
            return None

    def rename_table(self, source: Identifier, target: Identifier) -> None:
        self._rename(TABLE, source, target)

    def _rename(self, kind: str, source: Identifier, target: Identifier) -> None:
        def mutation(batch: Batch) -> None:
            pointer = batch.view.pointer(kind, source)
            if pointer is None:
                raise _MISSING[kind](f"{kind.capitalize()} does not exist: {source}")
            _require_namespace(batch.view, target.namespace)
            _require_free(batch.view, target, kind, renamed=source)
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

        self._mutate(mutation)

    def register_table(
        self,
        ident: Identifier,
        metadata_location: str,
        overwrite: bool = False,
        places: LocationPolicy | None = None,
    ) -> TableState:
        loaded = _read_for_register(self.table_files, places or self.locations, metadata_location)
        where = places_of(loaded.metadata.location, loaded.metadata.properties)
        self._check_places(where, "Table", places, writes_to=None)
        check_carried_paths(loaded.metadata)
        check_unique_ids(loaded.metadata)
        # Whatever coverage the snapshots still declare (expired ones are gone with their summaries).
        spans = [span for snapshot in loaded.metadata.snapshots for span in snapshot_spans(snapshot)]

        def mutation(batch: Batch) -> TableState:
            _require_namespace(batch.view, ident.namespace)
            existing = batch.view.pointer(TABLE, ident)
            if existing is not None and not overwrite:
                raise TableAlreadyExistsError(f"Table already exists: {ident}")
            if batch.view.pointer(VIEW, ident) is not None:
                raise ViewAlreadyExistsError(f"View with same name already exists: {ident}")
            pointer = Pointer(metadata_location, str(loaded.metadata.table_uuid))
            if existing is not None:
                _unplace(batch.view, existing.uuid)
            where = places_of(loaded.metadata.location, loaded.metadata.properties)
            self._claim_places(batch.view, pointer.uuid, where, "Table", moving=False)
            batch.view.put_pointer(TABLE, ident, pointer)
            record = batch.log(
                CommitRecord(
                    "table.register",
                    list(ident.namespace),
                    ident.name,
                    table_uuid=pointer.uuid,
                    metadata_location=metadata_location,
                    previous_metadata_location=existing.metadata_location if existing else None,
                    snapshot_id=loaded.metadata.current_snapshot_id,
                    schema_id=loaded.metadata.current_schema_id,
                )
            )
            if spans:
                batch.view.add_coverage(pointer.uuid, spans, None, record.commit_seq)
            return TableState(ident, metadata_location, loaded.metadata, loaded.json)

        return self._mutate(mutation)

    # -- views

    def load_view(self, ident: Identifier) -> ViewState:
        with self.store.read(self.scope) as view:
            pointer = view.pointer(VIEW, ident)
        if pointer is None:
            raise NoSuchViewError(f"View does not exist: {ident}")
        loaded = self.view_files.get(pointer.metadata_location)
        return ViewState(ident, pointer.metadata_location, loaded.metadata, loaded.json)

    def list_views(self, namespace: tuple[str, ...], after: str | None = None, limit: int | None = None):
        return self._list(VIEW, namespace, after, limit)

    def create_view(
        self,
        ident: Identifier,
        schema: Schema,
        version: ViewVersion,
        location: str | None = None,
        properties: dict[str, str] | None = None,
        places: LocationPolicy | None = None,
    ) -> ViewState:
        view_uuid = uuid.uuid4()
        location = (location or "").rstrip("/") or self._default_location(
            ident.namespace, ident.name, view_uuid
        )
        self._check_places(places_of(location, properties or {}), "View", places)
        metadata = new_view_metadata(view_uuid, location, schema, version, dict(properties or {}))
        return self._swap_view(ident, None, metadata, moved=True)

    def replace_view(
        self,
        ident: Identifier,
        requirements: tuple[ViewRequirement, ...],
        updates: tuple[ViewUpdate, ...],
        places: LocationPolicy | None = None,
    ) -> ViewState:
        with self._staging(VIEW, [ident]):
            for _ in range(MAX_COMMIT_ATTEMPTS):
                current = self.load_view(ident)
                for requirement in requirements:
                    requirement.validate_against(current.metadata)
                metadata = update_view_metadata(current.metadata, updates)
                if metadata == current.metadata:
                    return current
                where = places_of(metadata.location, metadata.properties)
                moved = where != places_of(current.metadata.location, current.metadata.properties)
                if moved:
                    self._check_places(where, "View", places, str(metadata.view_uuid))
                base = Pointer(current.metadata_location, current.metadata.view_uuid)
                try:
                    return self._swap_view(ident, base, metadata, moved)
                except _Stale:
                    continue
        raise CommitFailedException(
            f"Gave up after {MAX_COMMIT_ATTEMPTS} attempts lost to concurrent commits"
        )

    def _swap_view(
        self, ident: Identifier, base: Pointer | None, metadata: ViewMetadata, moved: bool
    ) -> ViewState:
        data = metadata_json(metadata)
        self.limits.check_properties(metadata.properties, "View")
        self.limits.check_metadata(data, "View")
        self.limits.check_room(self._local_warehouse)
        previous = base.metadata_location if base else None
        location = next_metadata_location(metadata.location, metadata.properties, previous)
        pointer = Pointer(location, metadata.view_uuid)
        write_durably(self.io, location, data)

        def mutation(batch: Batch) -> ViewState:
            if batch.view.pointer(VIEW, ident) != base:
                if base is None:
                    raise ViewAlreadyExistsError(f"View already exists: {ident}")
                raise _Stale
            if base is None:
                _require_namespace(batch.view, ident.namespace)
                _require_free(batch.view, ident, VIEW)
            if moved:
                where = places_of(metadata.location, metadata.properties)
                self._claim_places(batch.view, metadata.view_uuid, where, "View")
            batch.view.put_pointer(VIEW, ident, pointer)
            batch.log(
                CommitRecord(
                    "view.create" if base is None else "view.replace",
                    list(ident.namespace),
                    ident.name,
                    table_uuid=metadata.view_uuid,
                    metadata_location=location,
                    previous_metadata_location=base.metadata_location if base else None,
                )
            )
            return ViewState(ident, location, metadata, data)

        try:
            state = self._mutate(mutation)
        except BaseException:
            remove_quietly(self.io, location)
            raise
        self.view_files.put(location, Loaded(metadata, data))
        return state

    def drop_view(self, ident: Identifier) -> None:
        self._drop(VIEW, ident)

    def rename_view(self, source: Identifier, target: Identifier) -> None:
        self._rename(VIEW, source, target)

    def register_view(
        self, ident: Identifier, metadata_location: str, places: LocationPolicy | None = None
    ) -> ViewState:
        loaded = _read_for_register(self.view_files, places or self.locations, metadata_location)
        where = places_of(loaded.metadata.location, loaded.metadata.properties)
        self._check_places(where, "View", places, writes_to=None)

        def mutation(batch: Batch) -> ViewState:
            _require_namespace(batch.view, ident.namespace)
            _require_free(batch.view, ident, VIEW)
            self._claim_places(batch.view, loaded.metadata.view_uuid, where, "View", moving=False)
            batch.view.put_pointer(VIEW, ident, Pointer(metadata_location, loaded.metadata.view_uuid))
            batch.log(
                CommitRecord(
                    "view.register",
                    list(ident.namespace),
                    ident.name,
                    table_uuid=loaded.metadata.view_uuid,
                    metadata_location=metadata_location,
                )
            )
            return ViewState(ident, metadata_location, loaded.metadata, loaded.json)

        return self._mutate(mutation)

    # -- where tables and views live

    @property
    def _local_warehouse(self) -> Path | None:
        """The disk whose free space commits check: the warehouse's, or for a warehouse on object
        storage the store's (an LMDB store has a path)."""
        return local_path(self.warehouse) or getattr(self.store, "path", None)

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

        self._run(mutation)

    # -- the log

    def commit_seq(self) -> int:
        with self.store.read(self.scope, snapshot=False) as view:
            return view.commit_seq()

    def records(self, after: int = 0) -> Iterator[CommitRecord]:
        return self.store.scan_log(after)

    def commits_since(self, after: int, limit: int = 1000) -> list[CommitRecord]:
        """Up to `limit` records with `commit_seq > after`, in order."""
        with self.store.read(self.scope) as view:
            return view.records(after, limit)

    def log_bounds(self) -> tuple[int, int]:
        """(lowest retained commit_seq, highest commit_seq); a cursor is valid from floor - 1 to high."""
        with self.store.read(self.scope) as view:
            return view.log_floor(), view.commit_seq()

    def cursor_before(self, ts_us: int) -> int:
        """The cursor just before the first retained record at or after `ts_us`.

        Record timestamps never decrease, so this is a binary search over commit_seq.
        """
        with self.store.read(self.scope) as view:
            low, high = view.log_floor(), view.commit_seq() + 1
            while low < high:
                middle = (low + high) // 2
                (record,) = view.records(middle - 1, 1)
                if record.ts < ts_us:
                    low = middle + 1
                else:
                    high = middle
        return low - 1

    def consumer_cursor(self, name: str) -> int | None:
        with self.store.read(self.scope) as view:
            return view.cursors().get(name)

    def set_consumer_cursor(self, name: str, commit_seq: int) -> None:
        """Record a consumer's durable position; the log keeps every record after it."""

        def mutation(batch: Batch) -> None:
            batch.view.put_cursor(name, commit_seq)

        self._mutate(mutation)

    def trim_log(self, keep_records: int, keep_us: int, chunk: int = 1000) -> int:
        """Drop records beyond the retention window, in small writer batches; returns how many went.

        Records a consumer with a durable cursor has not yet handled are kept, whatever their age.
        """

        def mutation(batch: Batch) -> int:
            high = batch.view.commit_seq()
            ceiling = min([high, *batch.view.cursors().values()])
            return batch.view.trim_log(high - keep_records, now_us() - keep_us, ceiling, chunk)

        removed = 0
        while True:
            step = self._mutate(mutation)
            removed += step
            if step < chunk:
                return removed


# The location index holds an object's metadata path under its uuid with this suffix.
_METADATA_PLACE = "#metadata"


def _object(owner: str) -> str:
    """The uuid of the table or view that holds an indexed place."""
    return owner.removesuffix(_METADATA_PLACE)


def _unplace(view: WriteView, owner: str) -> None:
    view.unplace(owner)
    view.unplace(owner + _METADATA_PLACE)


def _every_pointer(view: ReadView, kind: str, parent: tuple[str, ...] = ()) -> Iterator[Pointer]:
    for namespace in view.namespaces(parent, None, None):
        for ident in view.identifiers(kind, namespace, None, None):
            pointer = view.pointer(kind, ident)
            if pointer is not None:
                yield pointer
        yield from _every_pointer(view, kind, namespace)
