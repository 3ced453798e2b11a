"""Writers that append 10-row batches to one table from processes of their own, their client's own
retries off, so that every attempt is one request the catalog answers.

A format version 2 table is appended to by PyIceberg. PyIceberg 0.12 writes no v3 manifest list, so
a v3 table is appended to by `V3Appender`, a fast-append client over the REST API that does what
Spark's does: a Parquet file, a manifest of it, a manifest list of that and the base snapshot's
manifests with the snapshot's row ids, one `add-snapshot` and `set-snapshot-ref`.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from threading import Barrier
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
from isbre.catalog.manifest_lists import read_manifests, write_manifests
from isbre.catalog.pyiceberg_internals import ManifestWriterV3
from isbre.catalog.row_lineage import LAST_UPDATED_SEQUENCE_NUMBER, with_lineage_columns
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import PyArrowFileIO, parquet_file_to_data_file, schema_to_pyarrow
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    write_manifest,
)
from pyiceberg.table import CommitTableRequest
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyiceberg.table.snapshots import Operation
from pyiceberg.typedef import Record

from tests.puffin import write_deletion_vector
from tests.row_deltas import DeletesContent

SCHEMA = pa.schema([pa.field("writer", pa.int64()), pa.field("seq", pa.int64())])
ROWS = 10
NO_CLIENT_RETRIES = {"commit.retry.num-retries": "0"}


def rows(writer: int, seq: int) -> pa.Table:
    return pa.table(
        {"writer": pa.array([writer] * ROWS, pa.int64()), "seq": pa.array([seq] * ROWS, pa.int64())}
    )


def tags(writer: int, seq: int) -> dict[str, str]:
    """What each append says of itself in its snapshot's summary."""
    return {"test.writer": str(writer), "test.seq": str(seq)}


class V3Appender:
    """Over the REST API of the server at `url`; or, given `embedded`, through that catalog's
    own `commit_table` (the commit the REST route makes, without a server)."""

    def __init__(self, url: str, identifier: str, embedded: Catalog | None = None) -> None:
        namespace, name = identifier.split(".")
        self.endpoint = f"{url}/v1/isbre/namespaces/{namespace}/tables/{name}"
        self.client = httpx.Client(timeout=60)
        self.io = PyArrowFileIO()
        self.embedded, self.identifier = embedded, identifier
        if embedded is not None:
            self.metadata: dict[str, Any] = _as_json(embedded.load_table(identifier).metadata)
        else:
            self.metadata = self.client.get(self.endpoint).raise_for_status().json()["metadata"]

    def append(
        self,
        batch: pa.Table,
        properties: dict[str, str],
        manifests_at: str | None = None,
        disguised: bool = False,
    ) -> None:
        """One fast append of `batch`; its manifest written under `manifests_at` (a hostile client's
        choice) instead of the table's metadata folder when given; `disguised`: its entry EXISTING,
        with a sequence number of its own, while the list's counters say one file was ADDED."""
        metadata = TableMetadataUtil.parse_obj(self.metadata)
        location = self.metadata["location"]
        snapshot_id = random.getrandbits(62)
        data = f"{location}/data/{uuid.uuid4()}.parquet"
        with self.io.new_output(data).create() as stream:
            pq.write_table(batch.cast(schema_to_pyarrow(metadata.schema())), stream)  # with field ids
        data_file = parquet_file_to_data_file(self.io, metadata, data)
        manifest_path = f"{manifests_at or location + '/metadata'}/{uuid.uuid4()}-m0.avro"
        with write_manifest(
            2, metadata.spec(), metadata.schema(), self.io.new_output(manifest_path), snapshot_id, "deflate"
        ) as writer:
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.EXISTING if disguised else ManifestEntryStatus.ADDED,
                    snapshot_id=snapshot_id,
                    sequence_number=1 if disguised else None,
                    file_sequence_number=1 if disguised else None,
                    data_file=data_file,
                )
            )
        manifest = writer.to_manifest_file()
        if disguised:
            manifest[7], manifest[8] = 1, 0  # added_files_count, existing_files_count
            manifest[10], manifest[11] = batch.num_rows, 0  # added_rows_count, existing_rows_count
        summary = {"operation": "append", "added-data-files": "1", "added-records": str(batch.num_rows)}
        self._commit(snapshot_id, manifest, {**summary, **properties})

    def rewrite(self, data_path: str, batch: pa.Table) -> None:
        """Replace the data file `data_path` (alone in its manifest) by one holding `batch`, as a
        copy-on-write update of an engine that keeps row lineage: `batch` has the table's columns
        and `_row_id`, the id of the row it carries over or updates (null for a new row); the
        rows' last-updated sequence numbers are not kept (null: the new snapshot's)."""
        metadata = TableMetadataUtil.parse_obj(self.metadata)
        parent = metadata.current_snapshot()
        assert parent is not None
        base = read_manifests(self.io, parent.manifest_list, 3)
        listed = [(manifest, manifest.fetch_manifest_entry(self.io)) for manifest in base]
        holding, removed = next(
            (manifest, entries)
            for manifest, entries in listed
            if any(e.data_file.file_path == data_path for e in entries)
        )
        assert len(removed) == 1, "the rewritten file is alone in its manifest"
        snapshot_id = random.getrandbits(62)
        lineage = with_lineage_columns(metadata.schema())
        written = metadata.model_copy(update={"schemas": [lineage], "current_schema_id": lineage.schema_id})
        data = f"{self.metadata['location']}/data/{uuid.uuid4()}.parquet"
        nulls = pa.nulls(batch.num_rows, pa.int64())
        full = batch.append_column(LAST_UPDATED_SEQUENCE_NUMBER.name, nulls)
        with self.io.new_output(data).create() as stream:
            pq.write_table(full.cast(schema_to_pyarrow(lineage)), stream)
        added = parquet_file_to_data_file(self.io, written, data)
        manifest_path = f"{self.metadata['location']}/metadata/{uuid.uuid4()}-m0.avro"
        with write_manifest(
            2, metadata.spec(), metadata.schema(), self.io.new_output(manifest_path), snapshot_id, "deflate"
        ) as writer:
            gone = removed[0]
            writer.delete(gone)
            writer.add(ManifestEntry.from_args(snapshot_id=snapshot_id, data_file=added))
        summary = {
            "operation": "overwrite",
            "added-data-files": "1",
            "deleted-data-files": "1",
            "added-records": str(batch.num_rows),
            "deleted-records": str(gone.data_file.record_count),
        }
        self._commit(snapshot_id, writer.to_manifest_file(), summary, replacing=holding.manifest_path)

    def delete_from(self, data_path: str, positions: list[int], partition: Record | None = None) -> str:
        """Commit a deletion vector of the rows at `positions` of the data file `data_path` (of
        the `partition` of the current spec), as a v3 delete manifest holds it; its path."""
        metadata = TableMetadataUtil.parse_obj(self.metadata)
        location = self.metadata["location"]
        snapshot_id = random.getrandbits(62)
        puffin = f"{location}/data/{uuid.uuid4()}-deletes.puffin"
        written = write_deletion_vector(
            self.io, puffin, data_path, positions, snapshot_id, metadata.next_sequence_number()
        )
        vector = DataFile.from_args(
            3,
            content=DataFileContent.POSITION_DELETES,
            file_path=puffin,
            file_format=FileFormat.PUFFIN,
            partition=partition or Record(),
            record_count=len(positions),
            file_size_in_bytes=written.file_size,
            referenced_data_file=data_path,
            content_offset=written.offset,
            content_size_in_bytes=written.length,
        )
        vector.spec_id = metadata.default_spec_id
        summary = {"added-position-deletes": str(len(positions)), "added-dvs": "1"}
        self.commit_deletes(vector, snapshot_id, summary)
        return puffin

    def commit_deletes(
        self, delete_file: DataFile, snapshot_id: int | None = None, summary: dict[str, str] | None = None
    ) -> None:
        """Commit a `delete` snapshot adding the v3 record `delete_file`, in a manifest of its own."""
        metadata = TableMetadataUtil.parse_obj(self.metadata)
        snapshot_id = snapshot_id or random.getrandbits(62)
        manifest_path = f"{self.metadata['location']}/metadata/{uuid.uuid4()}-m0.avro"
        writer = _DeleteManifestWriterV3(
            metadata.specs()[delete_file.spec_id],
            metadata.schema(),
            self.io.new_output(manifest_path),
            snapshot_id,
            "deflate",
        )
        with writer:
            writer.add(
                ManifestEntry.from_args(
                    3, status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, data_file=delete_file
                )
            )
        said = {"operation": "delete", "added-delete-files": "1", **(summary or {})}
        self._commit(snapshot_id, writer.to_manifest_file(), said)

    def _commit(
        self, snapshot_id: int, manifest: ManifestFile, summary: dict[str, str], replacing: str = ""
    ) -> None:
        """Commit the snapshot `snapshot_id` adding `manifest` on the table's head (in place of
        the head's manifest `replacing`, when given), as a v3 writer does: its list gives row
        ids from the table's next-row-id."""
        metadata = TableMetadataUtil.parse_obj(self.metadata)
        location = self.metadata["location"]
        parent = metadata.current_snapshot()
        base = read_manifests(self.io, parent.manifest_list, 3) if parent is not None else []
        listed = f"{location}/metadata/snap-{snapshot_id}-{uuid.uuid4()}.avro"
        first_row_id = self.metadata["next-row-id"]
        sequence_number = metadata.last_sequence_number + 1
        written = write_manifests(
            self.io,
            listed,
            3,
            snapshot_id,
            parent and parent.snapshot_id,
            sequence_number,
            first_row_id,
            "deflate",
            [manifest, *(m for m in base if m.manifest_path != replacing)],
        )
        snapshot = {
            "snapshot-id": snapshot_id,
            "sequence-number": sequence_number,
            "timestamp-ms": int(time.time() * 1000),
            "manifest-list": listed,
            "summary": summary,
            "schema-id": metadata.current_schema_id,
            "first-row-id": first_row_id,
            "added-rows": written.assigned_rows,
        }
        if parent is not None:
            snapshot["parent-snapshot-id"] = parent.snapshot_id
        body = {
            "requirements": [
                {"type": "assert-table-uuid", "uuid": str(metadata.table_uuid)},
                {
                    "type": "assert-ref-snapshot-id",
                    "ref": "main",
                    "snapshot-id": parent and parent.snapshot_id,
                },
            ],
            "updates": [
                {"action": "add-snapshot", "snapshot": snapshot},
                {
                    "action": "set-snapshot-ref",
                    "ref-name": "main",
                    "type": "branch",
                    "snapshot-id": snapshot_id,
                },
            ],
        }
        if self.embedded is not None:
            namespace, name = self.identifier.split(".")
            request = CommitTableRequest.model_validate(
                {"identifier": {"namespace": [namespace], "name": name}, **body}
            )
            table = self.embedded.load_table(self.identifier)
            done = self.embedded.commit_table(table, tuple(request.requirements), tuple(request.updates))
            self.metadata = _as_json(done.metadata)
            return
        answer = self.client.post(self.endpoint, json=body)
        if answer.status_code == 409:
            raise CommitFailedException(answer.json()["error"]["message"])
        answer.raise_for_status()
        self.metadata = answer.json()["metadata"]


class _DeleteManifestWriterV3(DeletesContent, ManifestWriterV3):
    pass


def _as_json(metadata: TableMetadata) -> dict[str, Any]:
    return json.loads(metadata.model_dump_json())


def append_batches(
    url: str, identifier: str, writer: int, commits: int, v3: bool, barrier: Barrier, until_replaced: int = 0
) -> list[str]:
    """Append `commits` batches as `writer`, starting together with the others at `barrier`; for
    each attempt, "" if it was acknowledged, else what the client raised. With `until_replaced`,
    go on (up to that many batches) until an acknowledged append has a replace snapshot (the
    catalog's compaction) among its ancestors."""
    replaced = False
    if v3:
        appender = V3Appender(url, identifier)
        append = appender.append
    else:
        table = RestCatalog(f"writer-{writer}", uri=url).load_table(identifier)

        def append(batch: pa.Table, properties: dict[str, str]) -> None:
            nonlocal replaced
            table.append(batch, snapshot_properties=properties)
            replaced = replaced or any(
                s.summary is not None and s.summary.operation == Operation.REPLACE
                for s in table.metadata.snapshots
            )

    barrier.wait(timeout=120)  # every writer has loaded the same head: all but one start stale
    outcomes = []
    for seq in range(max(commits, until_replaced)):
        if seq >= commits and (replaced or not until_replaced):
            break
        try:
            append(rows(writer, seq), tags(writer, seq))
            outcomes.append("")
        except Exception as exc:  # reported, not raised: the test says which attempts failed
            outcomes.append(f"{type(exc).__name__}: {exc}")
    return outcomes
