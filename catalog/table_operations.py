"""Table operations: loaded, created, committed (catalog/table_commit.py), registered, renamed and
dropped."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

from isbre.catalog.append_rebase import AppendRebase
from isbre.catalog.coverage import Coverage, snapshot_spans
from isbre.catalog.file_uris import local_path
from isbre.catalog.identifiers import Identifier
from isbre.catalog.maintenance_policy import check_policy, with_streaming_defaults
from isbre.catalog.manifest_cache import ManifestCache
from isbre.catalog.metadata_checks import check_registered
from isbre.catalog.metadata_files import make_dirs_durably, metadata_json, read_table_metadata
from isbre.catalog.metadata_updates import check_unique_ids
from isbre.catalog.objects import drop_object, list_objects, rename_object
from isbre.catalog.places import claim_places, named_places, unplace
from isbre.catalog.purge import PurgeIncompleteError, PurgeReport, purge_files
from isbre.catalog.records import PURGE_INCOMPLETE, CommitRecord
from isbre.catalog.request_context import ANONYMOUS, RequestContext
from isbre.catalog.service_core import (
    TABLE,
    VIEW,
    ServiceCore,
    read_for_register,
    require_free,
    require_namespace,
    require_new_uuid,
)
from isbre.catalog.sink_rows import SinkRows, snapshots_rows
from isbre.catalog.store import Pointer
from isbre.catalog.table_commit import TableCommits, TableState, load_table, table_pointer
from isbre.catalog.table_properties import check_no_code
from isbre.catalog.table_staging import (
    Staged,
    TableChange,
    check_carried_paths,
    new_metadata,
    next_metadata_location,
)
from isbre.catalog.writer import Batch
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError, ViewAlreadyExistsError
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.sorting import SortOrder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableCoverage:
    table_uuid: str
    coverage: Coverage
    commit_seq: int | None = None
    rows: dict[str, int] = field(default_factory=dict)  # the running totals its sinks counted


class Tables:
    """A warehouse's tables: loaded, created, committed (one or several at once), registered,
    renamed and dropped through its core."""

    def __init__(self, core: ServiceCore, manifests: ManifestCache) -> None:
        """`manifests`: the process's decoded manifest lists and manifests."""
        self.core = core
        self.rebase = AppendRebase(core, manifests)
        self.commits = TableCommits(core, self.rebase)

    def pointer(self, ident: Identifier) -> Pointer:
        return table_pointer(self.core, ident)

    def load(self, ident: Identifier) -> TableState:
        return load_table(self.core, ident)

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
        return list_objects(self.core, TABLE, namespace, after, limit)

    def create(
        self,
        ident: Identifier,
        schema: Schema,
        partition_spec: PartitionSpec,
        sort_order: SortOrder,
        location: str | None = None,
        properties: dict[str, str] | None = None,
        stage_only: bool = False,
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
        self.core.places.check_all(named_places(location, properties), "Table", context.places)
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
        return self.commits.swap([staged], None, context)[0]

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

    def commit(self, change: TableChange, context: RequestContext = ANONYMOUS) -> TableState:
        return self.commits.commit([change], None, context)[0]

    def commit_all(
        self, changes: list[TableChange], txn: str | None, context: RequestContext = ANONYMOUS
    ) -> list[TableState]:
        """Commit every change or none of them; `txn` tags the records of a multi-table transaction."""
        return self.commits.commit(changes, txn, context)

    def drop(self, ident: Identifier, purge: bool = False, context: RequestContext = ANONYMOUS) -> None:
        pointer = drop_object(self.core, TABLE, ident, context, {"purge": purge})
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
            report = purge_files(
                self.core.io, metadata, [pointer.metadata_location], self.core.places.files_of(metadata)
            )
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

    def rename(self, source: Identifier, target: Identifier, context: RequestContext = ANONYMOUS) -> None:
        rename_object(self.core, TABLE, source, target, context)

    def register(
        self,
        ident: Identifier,
        metadata_location: str,
        overwrite: bool = False,
        context: RequestContext = ANONYMOUS,
    ) -> TableState:
        policy = context.places or self.core.places.policy
        loaded = read_for_register(self.core.table_files, policy, metadata_location)
        where = named_places(loaded.metadata.location, loaded.metadata.properties)
        self.core.places.check_all(where, "Table", context.places, writes_to=None)
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
            claim_places(batch.view, pointer.uuid, where, "Table", moving=False)
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
