"""The work of a sink for one table: provisioning, skipping covered offsets, stamping metadata
columns, writing data files, and the commit that carries the spans. `IcebergSink` (iceberg.py)
drives it from the caller's thread, the ack lane (lane.py) from a background one."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
import pyarrow as pa
import requests
from isbre.catalog.coverage import SPANS_PROPERTY, Coverage, SpanKey, encode_spans, merge
from isbre.catalog.file_uris import local_path
from isbre.catalog.metadata_files import sync_directories, sync_file
from isbre.catalog.pyiceberg_internals import AppendWithDeletes, LeanTransaction, arrow_schema_without_ids
from isbre.catalog.sink_rows import ACCEPTED, ROWS_PROPERTY, encode_rows
from isbre.sinks.catalogs import CoverageSource, coverage_source
from isbre.sinks.columns import DEFAULT_PREFIX, MetadataColumns, now
from isbre.sinks.contract import CommitInfo, OffsetSpan, SinkError, SourceFields, row_offsets
from isbre.sinks.datafiles import write_data_files
from isbre.sinks.pending import (
    Prepared,
    broken_rows,
    contract_errors,
    covered_offsets,
    exact_values,
    inside,
    spans_of,
)
from isbre.sinks.policies import DEFAULT_POLICY
from isbre.sinks.provisioning import comment_hash, plan, sink_properties, table_policy, with_docs
from isbre.sinks.record_id import canonical_json
from isbre.sinks.upserts import KeyedChanges, equality_delete_file
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

log = logging.getLogger(__name__)

COMMIT_ID_PROPERTY = "isbre.sink.commit-id"
MANIFEST_MERGE = "commit.manifest-merge.enabled"


class ConflictingWriteError(SinkError):
    """Another writer committed offsets this sink had prepared; replaying the span resolves it."""


class CommitOutcomeUnknownError(SinkError):
    """The commit's answer was lost and the catalog could not be asked whether it landed.

    Its data files are kept (an unreferenced file is harmless, a deleted referenced one is
    not); replaying the span resolves it either way."""


# Failures after which a commit may or may not have landed.
UNKNOWN_OUTCOME = (CommitStateUnknownException, requests.RequestException, OSError)


class TableWriter:
    """Writes prepared batches of any number of streams into one table, one commit at a time."""

    def __init__(
        self,
        catalog: Catalog,
        identifier: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        metadata_policy: str | None = None,
        widen: bool = False,
        to_json: bool = False,
        fill_missing: bool = False,
        snapshot_properties: Mapping[str, str] | None = None,
        table_properties: Mapping[str, str] | None = None,
        max_attempts: int = 10,
        target_file_bytes: int = 32 << 20,
        write_threads: int = 2,
        key: Sequence[str] = (),
    ) -> None:
        self.catalog = catalog
        self.identifier = identifier
        # None: the table's own policy, or DEFAULT_POLICY for a table this sink creates.
        self.metadata_policy = metadata_policy
        self.quality_columns: tuple[str, ...] = ()  # prefixed columns the rows may carry (sinks/quality.py)
        self.columns = MetadataColumns(prefix, metadata_policy or DEFAULT_POLICY)
        self.widen = widen
        self.to_json = to_json
        self.fill_missing = fill_missing
        self.snapshot_properties = dict(snapshot_properties or {})
        self.table_properties = dict(table_properties or {})
        self.max_attempts = max_attempts
        self.keyed = KeyedChanges(key) if key else None  # an upsert sink's changes (sinks/upserts.py)
        self._table: Table | None = None
        self._source: CoverageSource | None = None
        self._known: Coverage | None = None  # committed coverage, as of snapshot `_known_at`
        self._known_at: int | None = None
        self._pending = Coverage()  # prepared here, not yet committed
        # Rows by disposition since the last commit, which declares them (catalog/sink_rows.py).
        self.rows: Counter[str] = Counter()
        self._fitted: pa.Schema | None = None
        self._json_columns: list[str] = []
        self._exact: dict[str, pa.DataType] = {}
        # Data files (about `target_file_bytes` of Arrow data each) are stamped and written on
        # `write_threads` threads while the caller prepares the next batches: hashing and Parquet
        # encoding release the GIL, so on two cores the sink writes about 1.4 times as fast.
        self.target_file_bytes = target_file_bytes
        self.write_threads = write_threads
        self._buffer: list[Prepared] = []
        self._synced_dirs: set[Path] = set()  # data directories whose entries are durable
        self._buffered = 0
        self._writes: list[Future[list[DataFile]]] = []
        self._pool = ThreadPoolExecutor(write_threads, thread_name_prefix="isbre-sink-write")

    # -- provisioning

    def _load_or_create(self, schema: pa.Schema) -> Table:
        try:
            return self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            pass
        documented = with_docs(schema)
        synced = comment_hash(arrow_schema_without_ids(documented))
        properties = {
            **self.table_properties,
            **sink_properties(self.columns.prefix, synced, self.columns.policy),
        }
        try:
            if self.keyed is not None:
                return self.keyed.create(self.catalog, self.identifier, documented, properties)
            return self.catalog.create_table(self.identifier, schema=documented, properties=properties)
        except TableAlreadyExistsError:  # another sink created it first
            return self.catalog.load_table(self.identifier)

    def fit(self, payload: pa.Schema) -> None:
        """Make the table take batches of `payload` (plus the metadata columns), or raise naming why not."""
        if payload == self._fitted:
            return
        self.start_write()  # a data file holds batches of one schema, written under that schema
        existing = table.properties if (table := self.existing()) is not None else None
        policy = table_policy(existing, self.metadata_policy)
        self.columns = MetadataColumns(self.columns.prefix, policy)
        self.columns.check_payload(payload, self.quality_columns)
        schema = pa.schema([*payload, *self.columns.fields])
        for _ in range(self.max_attempts):
            table = self._table or self._load_or_create(schema)
            self._table = table
            steps = plan(
                table.schema(),
                table.properties,
                schema,
                self.columns.prefix,
                self.columns.policy,
                self.widen,
                self.to_json,
                self.fill_missing,
            )
            if not steps.changes_table:
                break
            # A transaction copies the table's metadata while write threads read it (PyIceberg
            # fills a schema's caches on first use): let them finish first.
            wait(self._writes)
            try:
                with table.transaction() as tx:
                    steps.stage(tx)
                if steps.add or steps.widen:
                    added = [".".join(path) for path, _, _ in steps.add]
                    widened = [".".join(path) for path, _ in steps.widen]
                    log.info("%s: added %s, widened %s", self.identifier, added, widened)
                break
            except CommitFailedException:
                self._table = self.catalog.load_table(self.identifier)
        else:
            raise SinkError(f"{self.identifier}: could not evolve the table: too many concurrent changes")
        self._json_columns = steps.to_json
        self._exact = steps.exact
        self._fitted = payload

    def existing(self) -> Table | None:
        """The table, None while it does not exist."""
        if self._table is None:
            with contextlib.suppress(NoSuchTableError):
                self._table = self.catalog.load_table(self.identifier)
        return self._table

    @property
    def table(self) -> Table:
        if self._table is None:
            self._table = self.catalog.load_table(self.identifier)
        return self._table

    # -- exactly-once

    def _coverage_source(self) -> CoverageSource:
        if self._source is None:
            self._source = coverage_source(self.catalog, self.identifier)
        return self._source

    def _load_known(self, table: Table) -> Coverage:
        self._known = self._coverage_source().coverage(table)
        self._known_at = table.metadata.current_snapshot_id
        return self._known

    def coverage(self) -> Coverage:
        """What the table holds, as far as this writer knows (committed coverage only)."""
        return self._known if self._known is not None else self._load_known(self.table)

    def _covered(self, key: SpanKey, offsets: np.ndarray) -> np.ndarray:
        ranges = merge([*self.coverage().of(key), *self._pending.of(key)])
        return covered_offsets(ranges, offsets)

    def add(
        self,
        batch: pa.RecordBatch,
        span: OffsetSpan,
        source: SourceFields | None = None,
        offsets: np.ndarray | None = None,
        disposition: str | None = ACCEPTED,
        keep: np.ndarray | None = None,
    ) -> int:
        """Take `batch` (only the rows `keep` selects, where given) for the next commit; returns
        how many of its rows were not covered yet (counted under `disposition` unless it is None:
        the caller counts them)."""
        prepared = self.prepare(batch, span, source, offsets, keep)
        if prepared is None:
            return 0
        if self.keyed is not None:  # written at the commit, once each key's last change is known
            self.keyed.upsert(prepared)
        else:
            self._buffer.append(prepared)
            self._buffered += prepared.nbytes
            if self._buffered >= self.target_file_bytes * self.write_threads:
                self.start_write()
        if disposition is not None:
            self.rows[disposition] += prepared.rows
        return prepared.rows

    def delete(
        self, keys: pa.Table | pa.RecordBatch, span: OffsetSpan, offsets: np.ndarray | None = None
    ) -> int:
        """Delete, in the next commit, the rows of each key of `keys` (a keyed sink's), the keys at
        the offsets of `span` as rows are; returns how many were not covered yet."""
        if self.keyed is None:
            raise SinkError(f"{self.identifier}: only a keyed sink deletes by key (key=[...])")
        offsets = row_offsets(keys.num_rows, span, offsets)
        try:
            taken = ~self._covered(span.key, offsets)
        except NoSuchTableError:
            raise SinkError(f"{self.identifier} does not exist yet: there is nothing to delete") from None
        self._pending.add(span.as_span())
        self.keyed.delete(keys, taken)
        return int(taken.sum())

    def fresh(self, span: OffsetSpan, offsets: np.ndarray) -> np.ndarray:
        """Which of the rows at `offsets` of `span`'s stream the table does not hold yet."""
        try:
            return ~self._covered(span.key, offsets)
        except NoSuchTableError:  # the first batch creates it
            return np.ones(len(offsets), dtype=bool)

    def start_write(self) -> None:
        """Write what is buffered as up to `write_threads` files of about equal size, in parallel."""
        if not self._buffer:
            return
        wanted = round(self._buffered / self.target_file_bytes)
        files = max(1, min(self.write_threads, wanted, len(self._buffer)))
        share = self._buffered / files
        groups: list[list[Prepared]] = [[] for _ in range(files)]
        filled = 0
        for item in self._buffer:  # each batch goes to the file its middle byte falls in
            groups[min(files - 1, int((filled + item.nbytes / 2) / share))].append(item)
            filled += item.nbytes
        self._buffer, self._buffered = [], 0
        for group in groups:
            self._writes.append(self._pool.submit(self._write, self.table, group))

    def _written(self) -> list[DataFile]:
        writes, self._writes = self._writes, []
        files: list[DataFile] = []
        failure: BaseException | None = None
        for write in writes:  # wait for every write, so that none is left running on failure
            try:
                files += write.result()
            except BaseException as e:
                failure = failure or e
        if failure is not None:
            self._discard(files)
            raise failure
        return files

    def prepare(
        self,
        batch: pa.RecordBatch,
        span: OffsetSpan,
        source: SourceFields | None = None,
        offsets: np.ndarray | None = None,
        keep: np.ndarray | None = None,
    ) -> Prepared | None:
        """The rows of `batch` (those `keep` selects, where given) not yet covered; None when
        there are none.

        Rows map to offsets `span.start, span.start + 1, …` unless `offsets` says otherwise
        (ascending, inside the span: a source that skips offsets).
        """
        if isinstance(batch, pa.Table):
            batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else batch.schema.empty_table()
        offsets = row_offsets(batch.num_rows, span, offsets)
        if source is not None:
            source.check(batch.num_rows)
        self.fit(batch.schema)
        batch = exact_values(batch, self._exact, self.identifier)
        taken = ~self._covered(span.key, offsets)
        self._pending.add(span.as_span())
        if keep is not None:
            taken &= keep
        if not taken.any():
            return None
        errors = contract_errors(self.table.schema(), batch)
        if errors is not None and errors[taken].astype(bool).any():
            broken = broken_rows(errors[taken], offsets[taken])
            raise SinkError(f"{self.identifier}: {span}: {broken}; none of the batch is taken")
        everything = bool(taken.all())
        return Prepared(
            batch,
            None if everything else pa.array(taken),
            span,
            offsets if everything else offsets[taken],
            source,
            now(),
            list(self._json_columns),
        )

    # -- committing

    def _write(self, table: Table, prepared: Sequence[Prepared]) -> list[DataFile]:
        # Runs on a write thread: hashing and encoding release the GIL, so the threads overlap.
        emitted = now()
        stamped = []
        for item in prepared:
            rows, source = item.selected()
            batch = self.columns.stamp(
                rows, item.span, item.offsets, source, item.received, self.quality_columns
            )
            for name in item.to_json:
                index = batch.schema.get_field_index(name)
                batch = batch.set_column(index, name, canonical_json(batch.column(index)))
            stamped.append(self.columns.with_emit_ts(batch, emitted))
        files = write_data_files(table, pa.Table.from_batches(stamped), self.columns.parquet_options)
        self._make_durable(table, files)
        return files

    def _make_durable(self, table: Table, files: list[DataFile]) -> None:
        root = local_path(table.metadata.location)
        for data_file in files:  # a commit must not point at data a power loss could take back
            if (path := local_path(data_file.file_path)) is not None:
                sync_file(path)
                if root is not None:
                    sync_directories(path, root, self._synced_dirs)

    def _settle_keys(self) -> list[DataFile]:
        """A keyed sink's rows to write (of each key, its last change if that is a row) and the
        equality delete file of every key the commit touched; none for a sink without a key."""
        if not self.keyed:
            return []
        ids = self.keyed.field_ids(self.table)
        rows, keys = self.keyed.settle()
        self._buffer += rows
        self._buffered += sum(prepared.nbytes for prepared in rows)
        deletes = [equality_delete_file(self.table, keys, ids)]
        self._make_durable(self.table, deletes)
        return deletes

    def _landed(self, commit_id: str) -> int | None:
        """The snapshot a commit whose answer was lost created, if it exists."""
        table = self.catalog.load_table(self.identifier)
        self._table = table
        for snapshot in reversed(table.metadata.snapshots):
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            if summary.get(COMMIT_ID_PROPERTY) == commit_id:
                return snapshot.snapshot_id
        return None

    def _check_no_overlap(self, table: Table) -> None:
        if self._known_at == table.metadata.current_snapshot_id and self._known is not None:
            return
        known = self._load_known(table)
        for key, ranges in self._pending.ranges.items():
            theirs = known.of(key)
            for start, end in ranges:
                if any(s < end and start < e for s, e in theirs):
                    raise ConflictingWriteError(
                        f"{self.identifier}: another writer committed offsets of {key} in [{start}, {end}) "
                        "while this sink held them; replay the span (covered rows are skipped)"
                    )

    def commit(self, commit_seq: bool = True) -> CommitInfo:
        """Make everything added since the last commit durable in one commit, spans included.
        `commit_seq`: also ask the catalog for the commit's commit_seq (a request of its own), for
        a caller that reports it."""
        spans = [span for key, ranges in self._pending.ranges.items() for span in spans_of(key, ranges)]
        files: list[DataFile] = []
        deletes: list[DataFile] = []
        try:
            deletes = self._settle_keys()
            self.start_write()
            files = self._written()
            known = self.coverage()
            if not files and not deletes and all(inside(known.of(s.key), s.start, s.end) for s in spans):
                self._pending = Coverage()
                return CommitInfo(self.identifier, None)
            commit_id = str(uuid.uuid4())
            properties = {
                **self.snapshot_properties,
                SPANS_PROPERTY: encode_spans(spans),
                COMMIT_ID_PROPERTY: commit_id,
            }
            if +self.rows:
                properties[ROWS_PROPERTY] = encode_rows(self.rows)
            # No refresh first: if the table moved, the catalog answers 409 and _commit refreshes then.
            snapshot_id = self._commit(files, deletes, properties, commit_id)
        except CommitOutcomeUnknownError:
            self.abort()
            raise
        except BaseException:
            self.abort([*files, *deletes])
            raise
        for span in spans:
            known.add(span)
        self._known_at = snapshot_id
        self._pending = Coverage()
        self.rows = Counter()
        seq = self._coverage_source().commit_seq_of(snapshot_id) if commit_seq else None
        return CommitInfo(self.identifier, snapshot_id, seq)

    def _commit(
        self, files: list[DataFile], deletes: list[DataFile], properties: dict[str, str], commit_id: str
    ) -> int:
        for _ in range(self.max_attempts):
            table = self.table
            self._check_no_overlap(table)
            try:
                tx = LeanTransaction(table)
                snapshot = tx.update_snapshot(snapshot_properties=properties)
                # As Iceberg's own appends: small manifests are merged when the table asks for it,
                # so that a table a sink commits to often does not plan over one manifest a commit.
                merging = table.metadata.properties.get(MANIFEST_MERGE, "false").lower() == "true"
                appending = AppendWithDeletes(tx, deletes, properties) if deletes else None
                with appending or (snapshot.merge_append() if merging else snapshot.fast_append()) as append:
                    for data_file in files:
                        append.append_data_file(data_file)
                tx.commit_transaction()
                return table.metadata.current_snapshot_id  # type: ignore[return-value]
            except CommitFailedException:
                self._table = table.refresh()
            except UNKNOWN_OUTCOME as lost:
                try:
                    landed = self._landed(commit_id)
                except UNKNOWN_OUTCOME as e:
                    raise CommitOutcomeUnknownError(f"{self.identifier}: {lost}; then {e}") from lost
                if landed is not None:
                    return landed
        raise SinkError(f"{self.identifier}: gave up after {self.max_attempts} commit attempts")

    def abort(self, files: Iterable[DataFile] = ()) -> None:
        """Forget everything not committed and remove its data files; coverage is re-read next time."""
        self._buffer, self._buffered = [], 0
        try:
            files = [*files, *self._written()]
        except BaseException as e:  # a failed write left nothing to remove
            log.debug("aborted write failed: %s", e)
        self._discard(files)
        self._pending = Coverage()
        self.rows = Counter()
        self._known = None
        if self.keyed is not None:
            self.keyed.clear()

    def close(self) -> None:
        self.abort()
        self._pool.shutdown(wait=True)

    def _discard(self, files: Iterable[DataFile]) -> None:
        for data_file in files:
            try:
                self.table.io.delete(data_file.file_path)
            except OSError as e:
                log.warning("could not remove unreferenced data file %s: %s", data_file.file_path, e)
