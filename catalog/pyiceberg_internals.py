"""Every name isbre takes from PyIceberg that PyIceberg does not publish, in one place.

PyIceberg applies a table update, keeps the metadata log and writes Parquet data files with
functions it keeps private, and offers no hook for a REST catalog's extension endpoints. isbre
uses them rather than copy them, and only through this module: tests/test_upstream_seams.py
fails when PyIceberg changes any of them underneath. The Parquet writers are imported when
called, so that the catalog does not load PyIceberg's pyarrow I/O to apply an update.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from isbre.catalog.table_properties import honoured_metadata
from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.expressions import BooleanExpression
from pyiceberg.manifest import (
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV2,
    _inherit_from_manifest,
)
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    TableRequirement,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.typedef import EMPTY_DICT, KeyDefaultDict, TableVersion
from pyiceberg.utils.datetime import datetime_to_millis

if TYPE_CHECKING:
    import pyarrow as pa
    import requests
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.io import FileIO
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import FileScanTask

# What one commit's updates share while they are applied (the snapshots and schemas they add).
UpdateContext = _TableMetadataUpdateContext


def apply_table_update(update: TableUpdate, metadata: TableMetadata, context: UpdateContext) -> TableMetadata:
    return _apply_table_update(update, metadata, context)


def add_to_metadata_log(metadata: TableMetadata, location: str, last_updated_ms: int) -> TableMetadata:
    """`metadata` with the file at `location` (last updated at `last_updated_ms`) in its log."""
    return _update_table_metadata_log(metadata, location, last_updated_ms)


def inherit_from_manifest(entry: ManifestEntry, manifest: ManifestFile) -> ManifestEntry:
    """`entry` with the snapshot id and sequence numbers the spec says it inherits from `manifest`."""
    return _inherit_from_manifest(entry, manifest)


def empty_table_metadata() -> TableMetadata:
    """The starting point of PyIceberg's own catalogs for a table created by updates."""
    from pyiceberg.catalog import MetastoreCatalog

    return MetastoreCatalog._empty_table_metadata()


def arrow_schema_without_ids(schema: pa.Schema) -> Schema:
    """An Iceberg schema for an Arrow schema whose fields carry no field ids."""
    from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids

    return _pyarrow_to_schema_without_ids(schema)


def data_files_of(
    metadata: TableMetadata, rows: pa.Table, io: FileIO, write_uuid: uuid.UUID
) -> Iterable[DataFile]:
    """PyIceberg's own writer: `rows` as the table's data files (partitioned as the table is), with
    only the properties isbre honours (catalog/table_properties.py)."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    return _dataframe_to_data_files(honoured_metadata(metadata), rows, io, write_uuid)


def as_file_schema(
    requested: Schema, file_schema: Schema, batch: pa.RecordBatch, format_model: Any
) -> pa.RecordBatch:
    """`batch` (whose schema is `file_schema`) as the table's schema `requested`, with field ids."""
    from pyiceberg.io.pyarrow import _to_requested_schema

    return _to_requested_schema(
        requested, file_schema, batch, include_field_ids=True, format_model=format_model
    )


def parquet_writer_options(properties: dict[str, str]) -> dict[str, Any]:
    """The pyarrow Parquet writer's options the table's `write.parquet.*` properties ask for."""
    from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs

    return _get_parquet_writer_kwargs(properties)


def rows_per_task(
    scan: ArrowScan,
    io: FileIO,
    tasks: Sequence[FileScanTask],
    first_row_ids: Sequence[int | None] | None = None,
) -> list[pa.Table]:
    """The rows of each of `tasks`, read as `scan.to_table` reads them (position deletes applied,
    the files in parallel on PyIceberg's executor), one table per task: `to_table` concatenates
    them, and a reader that applies more per file (equality deletes) needs them apart. With
    `first_row_ids`, each row carries its id (`rows_at_positions`)."""
    return [rows for rows, _ in rows_at_positions(scan, io, tasks, first_row_ids)]


def rows_at_positions(
    scan: ArrowScan,
    io: FileIO,
    tasks: Sequence[FileScanTask],
    first_row_ids: Sequence[int | None] | None = None,
) -> list[tuple[pa.Table, pa.Array]]:
    """The rows of each of `tasks` (whose delete files are position deletes or deletion vectors
    only) and each row's position in its file: the file read whole, then its deletes applied.
    With `first_row_ids` (each task's data file's, on a format v3 table; `scan` projecting
    `_row_id`, catalog/row_lineage.py), a row whose file holds no id is given its id by position."""
    import numpy as np
    import pyarrow as pa
    from isbre.catalog.row_lineage import ROW_ID, row_ids
    from pyiceberg.io.pyarrow import _combine_positional_deletes, _read_all_delete_files
    from pyiceberg.utils.concurrent import ExecutorFactory

    deletes = _read_all_delete_files(io, tasks)
    empty = scan.to_table([])

    def read(task: FileScanTask, first_row_id: int | None) -> tuple[pa.Table, pa.Array]:
        batches = scan._record_batches_from_scan_tasks_and_deletes([task], {})
        rows = pa.concat_tables(
            [empty, *(pa.Table.from_batches([b]) for b in batches)], promote_options="permissive"
        )
        if first_row_ids is not None:
            at = rows.schema.get_field_index(ROW_ID.name)
            rows = rows.set_column(at, ROW_ID.name, row_ids(rows.column(at), rows.num_rows, first_row_id))
        positional = deletes.get(task.file.file_path)
        if not positional:  # every row kept: no copy
            return rows, pa.array(np.arange(rows.num_rows, dtype=np.int64))
        kept = _combine_positional_deletes(positional, 0, rows.num_rows)
        return rows.take(kept), kept

    ids = first_row_ids if first_row_ids is not None else [None] * len(tasks)
    return list(ExecutorFactory.get_or_create().map(read, tasks, ids))


def rest_extension(
    catalog: RestCatalog,
    method: str,
    endpoint: str,
    identifier: str,
    params: dict[str, Any] | None = None,
    body: Any = None,
) -> requests.Response:
    """Call a catalog's endpoint for the table `identifier` that PyIceberg has no method for (an
    extension, a plan page), on the catalog's own authenticated session, as PyIceberg builds its
    own requests; `endpoint` is under the catalog prefix, with `{namespace}` and `{table}`."""
    url = catalog.url(endpoint, prefixed=True, **catalog._split_identifier_for_path(identifier))
    return catalog._session.request(method, url, params=params, json=body)


class LeanTransaction(Transaction):
    """A transaction whose commit costs the same whatever the table's history.

    PyIceberg's Transaction works out `table_metadata` again on every read, deep-copying the
    whole metadata each time, and a fast append reads it 14 times: a sink's commit to a table of
    600 snapshots spent half a second of client CPU in those copies. This one works it out once
    per change of the staged updates, without the copy (the metadata models are frozen, and the
    sink changes none in place)."""

    _worked_out: tuple[TableMetadata, tuple[TableUpdate, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        if self._worked_out is not None and self._worked_out[0] is base and self._worked_out[1] is updates:
            return self._worked_out[2]
        context = UpdateContext()
        metadata = base
        for update in updates:
            metadata = apply_table_update(update, metadata, context)
        if context.has_changes() and metadata.last_updated_ms == base.last_updated_ms:
            now = datetime_to_millis(datetime.now().astimezone())
            metadata = metadata.model_copy(update={"last_updated_ms": now})
        self._worked_out = (base, updates, metadata)
        return metadata


# What a snapshot producer stages: the commit's requirements and its updates.
Staging = tuple[tuple[TableRequirement, ...], tuple[TableUpdate, ...]]


def replace_files(
    identifier: tuple[str, ...],
    metadata: TableMetadata,
    metadata_location: str,
    io: FileIO,
    removed: Iterable[DataFile],
    added: Iterable[DataFile],
    snapshot_properties: dict[str, str],
    data_sequence_number: int,
) -> Staging:
    """The requirements and updates of a `replace` snapshot on the main branch that removes the
    data files `removed` and adds `added` (the same rows in other files, of the data sequence
    number `data_sequence_number`), its manifests written. PyIceberg's overwrite producer does all
    of it but name the operation `replace` (its summary totals refuse that name) and keep an older
    sequence number: it is renamed once the snapshot is made, so that readers of changes know
    that the data did not change. Raises ValidationException when a file of `removed` is no longer
    in the table."""
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    class Rewrite(_OverwriteFiles):
        def new_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
            # The producer's writer of its added files takes no sequence number of theirs: its
            # `add` is the only way files are added, and is given the rewrite's.
            writer = super().new_manifest_writer(spec)
            add_entry = writer.add_entry

            def add(entry: ManifestEntry) -> ManifestWriter:
                return add_entry(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=entry.snapshot_id,
                        sequence_number=data_sequence_number,
                        data_file=entry.data_file,
                    )
                )

            setattr(writer, "add", add)  # noqa: B010
            return writer

    # The producer reads the table only for its location and metadata; it never commits itself.
    honoured = honoured_metadata(metadata)
    table = Table(identifier, honoured, metadata_location, io, catalog=None)  # type: ignore[arg-type]
    transaction = LeanTransaction(table)
    producer = Rewrite(
        operation=Operation.OVERWRITE, transaction=transaction, io=io, snapshot_properties=snapshot_properties
    )
    for data_file in removed:
        producer.delete_data_file(data_file)
    for data_file in added:
        producer.append_data_file(data_file)
    producer.commit()
    return transaction._requirements, tuple(_as_replace(update) for update in transaction._updates)


def merged_manifests(
    identifier: tuple[str, ...],
    metadata: TableMetadata,
    metadata_location: str,
    io: FileIO,
    snapshot_properties: dict[str, str],
) -> Staging:
    """The requirements and updates of a `replace` snapshot on the main branch whose manifests are
    the current snapshot's, merged as PyIceberg's merging append merges them (into bins of
    `commit.manifest.target-size-bytes`), whatever their number: an append that adds no file,
    with merging on and its threshold at two manifests, renamed `replace`."""
    from pyiceberg.table import TableProperties
    from pyiceberg.table.update.snapshot import _MergeAppendFiles

    eager = {TableProperties.MANIFEST_MERGE_ENABLED: "true", TableProperties.MANIFEST_MIN_MERGE_COUNT: "2"}
    # Only the producer reads these properties: the snapshot it makes does not carry them.
    merging = metadata.model_copy(update={"properties": {**honoured_metadata(metadata).properties, **eager}})
    table = Table(identifier, merging, metadata_location, io, catalog=None)  # type: ignore[arg-type]
    transaction = LeanTransaction(table)
    _MergeAppendFiles(
        operation=Operation.APPEND, transaction=transaction, io=io, snapshot_properties=snapshot_properties
    ).commit()
    return transaction._requirements, tuple(_as_replace(update) for update in transaction._updates)


def _as_replace(update: TableUpdate) -> TableUpdate:
    if not isinstance(update, AddSnapshotUpdate) or update.snapshot.summary is None:
        return update
    summary = Summary(Operation.REPLACE, **update.snapshot.summary.additional_properties)
    return AddSnapshotUpdate(snapshot=update.snapshot.model_copy(update={"summary": summary}))


class DeleteManifestWriterV2(ManifestWriterV2):
    """PyIceberg's v2 manifest writer, for delete files: PyIceberg writes data manifests only."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class AppendWithDeletes(_FastAppendFiles):
    """A fast append that adds delete files too, in a delete manifest of their own: an `overwrite`
    snapshot (PyIceberg's producers add data files only). `delete_files` are of the table's
    current spec."""

    def __init__(
        self, transaction: Transaction, delete_files: Iterable[DataFile], snapshot_properties: dict[str, str]
    ) -> None:
        super().__init__(
            Operation.OVERWRITE, transaction, transaction._table.io, snapshot_properties=snapshot_properties
        )
        self._delete_files = list(delete_files)

    def _manifests(self) -> list[ManifestFile]:
        manifests = super()._manifests()
        if not self._delete_files:
            return manifests
        spec, output = self._transaction.table_metadata.spec(), self.new_manifest_output()
        writer = DeleteManifestWriterV2(spec, self.schema(), output, self._snapshot_id, self._compression)
        with writer:
            for delete_file in self._delete_files:
                entry = ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id, data_file=delete_file
                )
                writer.add(entry)
        return [writer.to_manifest_file(), *manifests]

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        # PyIceberg's summary counts the files `_added_data_files` holds, delete files by content.
        data_files = self._added_data_files
        self._added_data_files = [*data_files, *self._delete_files]
        try:
            return super()._summary(snapshot_properties)
        finally:
            self._added_data_files = data_files


class ManifestWriterV3(ManifestWriterV2):
    """PyIceberg's manifest writer, writing v3 entries (a data file's `first_row_id`, a deletion
    vector's reference): PyIceberg 0.12 writes no v3 manifest. Its records are read as v3 ones
    (catalog/manifest_entries.py)."""

    @property
    def version(self) -> TableVersion:
        return 3

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        return AvroOutputFile[ManifestEntry](
            output_file=self._output_file,
            file_schema=self._with_partition(3),
            record_schema=self._with_partition(3),
            schema_name="manifest_entry",
            metadata=self._meta,
        )


class ScanPruning:
    """PyIceberg's own pruning and residuals for one scan, as its local planner applies them
    (manifest partition summaries, partition values, column metrics), so that a plan made on the
    server keeps exactly the files a client's local plan keeps."""

    def __init__(self, metadata: TableMetadata, row_filter: BooleanExpression, case_sensitive: bool) -> None:
        from pyiceberg.io import load_file_io
        from pyiceberg.table import ManifestGroupPlanner

        # The planner's evaluators read the metadata only; it opens no file here.
        self._planner = ManifestGroupPlanner(metadata, load_file_io(), row_filter, case_sensitive)
        self._row_filter = row_filter
        self._manifests = KeyDefaultDict(self._planner._build_manifest_evaluator)
        self._partitions = KeyDefaultDict(self._planner._build_partition_evaluator)
        self._metrics = self._planner._build_metrics_evaluator()
        self._residuals = KeyDefaultDict(self._planner._build_residual_evaluator)

    def keeps_manifest(self, manifest: ManifestFile) -> bool:
        return bool(self._manifests[manifest.partition_spec_id](manifest))

    def keeps_file(self, data_file: DataFile) -> bool:
        return bool(self._partitions[data_file.spec_id](data_file)) and bool(self._metrics(data_file))

    def residual(self, data_file: DataFile) -> BooleanExpression:
        """The part of the filter the file's partition does not settle. PyIceberg 0.12's residual
        evaluator compares a null partition value with `>` and fails (TypeError); the whole filter
        is then the residual, which a reader applies to every row (the spec allows any residual
        that keeps the rows the filter keeps)."""
        try:
            return self._residuals[data_file.spec_id](data_file).residual_for(data_file.partition)
        except TypeError:
            return self._row_filter
