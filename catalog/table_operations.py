"""Table operations: a commit stages its new metadata file first (in the caller's thread) and lets
the writer swap the pointer only if nobody moved it meanwhile."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field

from isbre.catalog.append_rebase import COMMITTED, AppendRebase
from isbre.catalog.confined_io import ConfinedIO
from isbre.catalog.coverage import Coverage, snapshot_spans
from isbre.catalog.deletion import TableFiles
from isbre.catalog.file_uris import local_path
from isbre.catalog.identifiers import Identifier
from isbre.catalog.locations import LocationNotAllowedError, LocationPolicy, normalized
from isbre.catalog.maintenance import check_policy, with_streaming_defaults
from isbre.catalog.metadata_checks import check_registered
from isbre.catalog.metadata_files import (
    Loaded,
    make_dirs_durably,
    metadata_json,
    read_table_metadata,
    remove_quietly,
    write_durably,
)
from isbre.catalog.metadata_updates import check_unique_ids
from isbre.catalog.purge import PurgeIncompleteError, PurgeReport, purge_files
from isbre.catalog.records import PURGE_INCOMPLETE, CommitRecord
from isbre.catalog.request_context import ANONYMOUS, RequestContext
from isbre.catalog.service_core import (
    MAX_COMMIT_ATTEMPTS,
    TABLE,
    VIEW,
    ServiceCore,
    Stale,
    commit_retries,
    object_of,
    read_for_register,
    require_free,
    require_namespace,
    require_new_uuid,
    unplace,
)
from isbre.catalog.sink_rows import SinkRows, snapshots_rows
from isbre.catalog.store import CommitStateUnknownError, Pointer, StoreUnavailableError
from isbre.catalog.table_properties import check_no_code
from isbre.catalog.table_staging import (
    Staged,
    TableChange,
    check_carried_paths,
    commit_record,
    named_places,
    new_metadata,
    next_metadata_location,
    places_of,
    stage,
)
from isbre.catalog.writer import Batch
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchTableError,
    TableAlreadyExistsError,
    ViewAlreadyExistsError,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.sorting import SortOrder

log = logging.getLogger(__name__)
# How often a commit whose end was not confirmed asks the store whether it landed, and how long it
# waits between two asks (more each time): two and a half seconds in all.
OUTCOME_ATTEMPTS = 4
OUTCOME_BACKOFF_S = 0.25


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
    rows: dict[str, int] = field(default_factory=dict)  # the running totals its sinks counted


class Tables:
    """A warehouse's tables: loaded, created, committed (one or several at once), registered,
    renamed and dropped through its core."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core
        self.rebase = AppendRebase(
            self.confined_io, lambda ident: self.coverage(ident).coverage, core.defaults_for
        )

    def pointer(self, ident: Identifier) -> Pointer:
        with self.core.store.read(self.core.scope, snapshot=False) as view:
            pointer = view.pointer(TABLE, ident)
        if pointer is None:
            raise NoSuchTableError(f"Table does not exist: {ident}")
        self.core.table_pointers.put(ident, pointer)
        return pointer

    def load(self, ident: Identifier) -> TableState:
        pointer = self.pointer(ident)
        loaded = self.core.table_files.get(pointer.metadata_location)
        return TableState(ident, pointer.metadata_location, loaded.metadata, loaded.json)

    def metadata_or_none(self, location: str) -> TableMetadata | None:
        """The metadata at `location`, or None when it cannot be read (e.g. purged since)."""
        try:
            return self.core.table_files.get(location).metadata
        except Exception:
            return None

    def load_if_cached(self, ident: Identifier) -> TableState | None:
        """`load_table` when it needs no file read and no wait on a database (None otherwise): safe
        to call on an event loop."""
        if not self.core.store.reads_in_process:
            return None
        pointer = self.pointer(ident)
        loaded = self.core.table_files.peek(pointer.metadata_location)
        if loaded is None:
            return None
        return TableState(ident, pointer.metadata_location, loaded.metadata, loaded.json)

    def listing(self, namespace: tuple[str, ...], after: str | None = None, limit: int | None = None):
        return self.core.list_objects(TABLE, namespace, after, limit)

    def create(
        self,
        ident: Identifier,
        schema: Schema,
        partition_spec: PartitionSpec,
        sort_order: SortOrder,
        location: str | None = None,
        properties: dict[str, str] | None = None,
        stage_only: bool = False,
        places: LocationPolicy | None = None,
        context: RequestContext = ANONYMOUS,
    ) -> TableState:
        with self.core.store.read(self.core.scope) as view:
            require_namespace(view, ident.namespace)
            require_free(view, ident, TABLE)
        table_uuid = uuid.uuid4()
        location = (location or "").rstrip("/") or self.core.default_location(
            ident.namespace, ident.name, table_uuid
        )
        check_no_code(properties or {})
        properties = {**self.core.defaults_for(ident.namespace), **with_streaming_defaults(properties or {})}
        self.core.check_places(named_places(location, properties), "Table", places)
        self.core.limits.check_properties(properties, "Table")
        check_policy(properties)
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
        return self._swap([staged], None, context)[0]

    def coverage(self, ident: Identifier, snapshot_id: int | None = None) -> TableCoverage:
        """The source offsets the table's commits declared (and which commit added `snapshot_id`)."""
        with self.core.store.read(self.core.scope) as view:
            pointer = view.pointer(TABLE, ident)
            if pointer is None:
                raise NoSuchTableError(f"Table does not exist: {ident}")
            commit_seq = None if snapshot_id is None else view.snapshot_commit(pointer.uuid, snapshot_id)
            totals = view.sink_rows(pointer.uuid)
            rows = totals[0].rows if totals else {}
            return TableCoverage(pointer.uuid, view.coverage(pointer.uuid), commit_seq, rows)

    def sink_rows(self) -> list[SinkRows]:
        """The running row counts of every table of the store (any warehouse) that a sink counted in."""
        with self.core.store.read(self.core.scope, snapshot=False) as view:
            return view.sink_rows(None)

    def commit(
        self, change: TableChange, places: LocationPolicy | None = None, context: RequestContext = ANONYMOUS
    ) -> TableState:
        return self.commit_all([change], txn=None, places=places, context=context)[0]

    def commit_all(
        self,
        changes: list[TableChange],
        txn: str | None,
        places: LocationPolicy | None = None,
        context: RequestContext = ANONYMOUS,
    ) -> list[TableState]:
        """Commit every change or none of them; `txn` tags the records of a multi-table transaction."""
        idents = [change.ident for change in changes]
        if len(set(idents)) != len(idents):
            raise ValueError("A transaction may change each table only once")
        with self.core.staging(TABLE, idents):
            # Stage against the pointers this process last saw, when it saw them all: the writer
            # swaps only if each is still current, so a stale one costs an attempt, never a
            # wrong commit. Whatever an attempt from memory fails on, it is tried again from
            # the store before it is answered (another server may have moved the table).
            remembered = [self.core.table_pointers.peek(ident) for ident in idents]
            bases = None if None in remembered else remembered
            retries = commit_retries()
            rebases = 0
            for _ in range(MAX_COMMIT_ATTEMPTS):
                from_store = bases is None
                if bases is None:
                    with self.core.store.read(self.core.scope, snapshot=False) as view:
                        bases = [view.pointer(TABLE, ident) for ident in idents]
                # A stale append is made again on the head, when the head is the store's and it is
                # the only change (DuckDB sends even one table's commit as a transaction).
                rebase = rebases if from_store and len(changes) == 1 else None
                try:
                    staged = [
                        self._staged(change, base, places, rebase)
                        for change, base in zip(changes, bases, strict=True)
                    ]
                except Exception:
                    if from_store:
                        raise
                    bases = None
                    continue
                rebases += sum(entry.rebased_list is not None for entry in staged)
                try:
                    return self._swap(staged, txn, context)
                except Stale:  # another process moved a table first: stage again on what it did
                    bases = None
                    time.sleep(retries.next())
        raise CommitFailedException(
            f"Gave up after {MAX_COMMIT_ATTEMPTS} attempts lost to concurrent commits"
        )

    def _staged(
        self, change: TableChange, base: Pointer | None, places: LocationPolicy | None, rebases: int | None
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
                self.core.check_places(entry.places, "Table", places, owner)
        except BaseException:
            if rebased is not None:
                remove_quietly(self.core.io, rebased.manifest_list)
            raise
        return entry

    def _swap(self, staged: list[Staged], txn: str | None, context: RequestContext) -> list[TableState]:
        written = [entry.rebased_list for entry in staged if entry.rebased_list is not None]
        for entry in staged:
            if entry.changed:
                self.core.limits.check_properties(entry.metadata.properties, "Table")
                check_policy(entry.metadata.properties)
                self.core.limits.check_metadata(entry.json, "Table")
        self.core.limits.check_room(self.core.local_warehouse)
        try:
            for entry in staged:
                if entry.changed:
                    write_durably(self.core.io, entry.metadata_location, entry.json)
                    written.append(entry.metadata_location)

            txn_size = sum(entry.changed for entry in staged) if txn else None

            def mutation(batch: Batch) -> list[TableState]:
                for entry in staged:
                    now = batch.view.pointer(TABLE, entry.ident)
                    if now != entry.base:
                        if entry.base is None:  # a concurrent create of the same table won
                            raise TableAlreadyExistsError(f"Table already exists: {entry.ident}")
                        raise Stale
                    if entry.base is None:
                        require_namespace(batch.view, entry.ident.namespace)
                        require_free(batch.view, entry.ident, TABLE)
                        require_new_uuid(batch.view, entry.pointer.uuid)
                for entry in staged:
                    if entry.moved:
                        self.core.claim_places(batch.view, entry.pointer.uuid, entry.places, "Table")
                    if entry.changed:
                        batch.view.put_pointer(TABLE, entry.ident, entry.pointer)
                        record = batch.log(commit_record(entry, txn, txn_size))
                        # Which commit added each snapshot: plans from a commit cursor go by it.
                        for snapshot_id in entry.added_snapshots:
                            batch.view.add_coverage(entry.pointer.uuid, [], snapshot_id, record.commit_seq)
                        if entry.spans:
                            batch.view.add_coverage(
                                entry.pointer.uuid, list(entry.spans), None, record.commit_seq
                            )
                        if entry.rows:
                            batch.view.add_sink_rows(
                                SinkRows(entry.pointer.uuid, self.core.name, str(entry.ident), entry.rows)
                            )
                return [TableState(e.ident, e.metadata_location, e.metadata, e.json) for e in staged]

            reads = [(TABLE, entry.ident) for entry in staged]
            states = self.core.mutate(
                mutation, reads, context, answer=lambda states: states[0].metadata_location
            )
        except StoreUnavailableError as exc:
            # Lost as its transaction ended, a commit may have landed: the new files then are what
            # the tables point at, and must stay. Ask the store, as the Java reference's
            # checkCommitStatus does, before removing anything. Lost before that, it did not (503).
            landed = self._landed(staged) if exc.maybe_committed else False
            if landed is None:
                raise CommitStateUnknownError(
                    f"The commit's outcome is unknown: the catalog's store was lost as it ended ({exc}) "
                    "and could not be asked since. Load the table to see whether it landed."
                ) from exc
            if not landed:
                for location in written:
                    remove_quietly(self.core.io, location)
                raise
            log.warning("a commit whose answer from the store was lost had landed: %s", exc)
            states = [TableState(e.ident, e.metadata_location, e.metadata, e.json) for e in staged]
        except BaseException:
            for location in written:
                remove_quietly(self.core.io, location)
            raise
        for entry in staged:
            self.core.table_files.put(entry.metadata_location, Loaded(entry.metadata, entry.json))
            self.core.table_pointers.put(entry.ident, entry.pointer)
            if entry.rebased_list is not None:
                self.rebase.count(COMMITTED)
        return states

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

    def drop(self, ident: Identifier, purge: bool = False, context: RequestContext = ANONYMOUS) -> None:
        pointer = self.core.drop_object(TABLE, ident, context, {"purge": purge})
        if purge:
            self._purge(ident, pointer, context.unkeyed())

    def _purge(self, ident: Identifier, pointer: Pointer, context: RequestContext) -> None:
        """Delete a dropped table's files: only those under its own location, never the store's, never
        another table's or view's. Whatever is left behind is recorded in the log and reported."""
        try:
            metadata = self.core.table_files.get(pointer.metadata_location).metadata
        except Exception as exc:
            report = PurgeReport(
                None, problems=[f"metadata {pointer.metadata_location}: {type(exc).__name__}"]
            )
        else:
            report = purge_files(self.core.io, metadata, [pointer.metadata_location], self.files_of(metadata))
        if not report.left_behind:
            return

        def mutation(batch: Batch) -> CommitRecord:
            return batch.log(
                CommitRecord(
                    PURGE_INCOMPLETE,
                    list(ident.namespace),
                    ident.name,
                    table_uuid=pointer.uuid,
                    previous_metadata_location=pointer.metadata_location,
                    properties=report.summary(),
                )
            )

        record = self.core.mutate(mutation, context=context)
        log.warning(
            "purge of %s left files behind (commit_seq %d): %s", ident, record.commit_seq, report.summary()
        )
        if report.problems:
            raise PurgeIncompleteError(
                f"Table {ident} was dropped, but its purge is incomplete: {len(report.problems)} "
                f"problem(s), first: {report.problems[0]}; what was left behind is recorded at commit_seq "
                f"{record.commit_seq} (kind table.purge-incomplete)"
            )

    def files_of(self, metadata: TableMetadata, owner: str | None = None) -> TableFiles | None:
        """The deleter of a table's files (None when its location may not be deleted from); `owner`:
        the table's uuid while it is in the catalog (a dropped one is no longer indexed: anyone
        found at a place is another)."""

        def claimed_by_other(location: str) -> bool:
            with self.core.store.read(self.core.scope) as view:
                return any(object_of(holder) != owner for _, holder in view.overlapping(location))

        def allowed(place: str) -> bool:
            try:
                self.core.locations.check(place)
                self.core.check_protected(place, "Place")
                return not claimed_by_other(normalized(place))
            except LocationNotAllowedError:
                return False

        try:
            # A place property stored before it was checked as it is now counts only if it passes.
            location, *more = places_of(metadata.location, metadata.properties)
            where = [location, *filter(allowed, more)]
            return TableFiles(
                self.core.io, where, self.core.locations.roots, self.core.protected, claimed_by_other
            )
        except LocationNotAllowedError as exc:
            log.warning("purge deletes nothing at %s: %s", metadata.location, exc)
            return None

    def confined_io(self, metadata: TableMetadata) -> ConfinedIO:
        """The FileIO the server's own jobs reach the table's files through: its files alone."""
        return ConfinedIO(self.core.io, self.files_of(metadata, owner=str(metadata.table_uuid)))

    def rename(self, source: Identifier, target: Identifier, context: RequestContext = ANONYMOUS) -> None:
        self.core.rename_object(TABLE, source, target, context)

    def register(
        self,
        ident: Identifier,
        metadata_location: str,
        overwrite: bool = False,
        places: LocationPolicy | None = None,
        context: RequestContext = ANONYMOUS,
    ) -> TableState:
        loaded = read_for_register(self.core.table_files, places or self.core.locations, metadata_location)
        where = named_places(loaded.metadata.location, loaded.metadata.properties)
        self.core.check_places(where, "Table", places, writes_to=None)
        check_carried_paths(loaded.metadata)
        check_unique_ids(loaded.metadata)
        check_no_code(loaded.metadata.properties)
        check_registered(loaded.metadata, read_table_metadata(self.core.io, metadata_location))
        # Whatever coverage the snapshots still declare (expired ones are gone with their summaries).
        spans = [span for snapshot in loaded.metadata.snapshots for span in snapshot_spans(snapshot)]
        rows = snapshots_rows(loaded.metadata.snapshots)

        def mutation(batch: Batch) -> TableState:
            require_namespace(batch.view, ident.namespace)
            existing = batch.view.pointer(TABLE, ident)
            if existing is not None and not overwrite:
                raise TableAlreadyExistsError(f"Table already exists: {ident}")
            if batch.view.pointer(VIEW, ident) is not None:
                raise ViewAlreadyExistsError(f"View with same name already exists: {ident}")
            pointer = Pointer(metadata_location, str(loaded.metadata.table_uuid))
            if existing is not None:
                unplace(batch.view, existing.uuid)
            require_new_uuid(batch.view, pointer.uuid)
            where = named_places(loaded.metadata.location, loaded.metadata.properties)
            self.core.claim_places(batch.view, pointer.uuid, where, "Table", moving=False)
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
            if rows:
                batch.view.add_sink_rows(SinkRows(pointer.uuid, self.core.name, str(ident), rows))
            return TableState(ident, metadata_location, loaded.metadata, loaded.json)

        return self.core.mutate(mutation, context=context, answer=lambda state: state.metadata_location)
