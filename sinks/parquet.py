"""The Parquet raw lane: plain Parquet files with the metadata columns, no catalog.

One `finish()` is one file, named after its span, so replaying a span with the
same boundaries finds the file already there and writes nothing. On local disk
a file is written under a temporary name, synced and renamed: it is whole or
absent. Under `s3://bucket/prefix` it is one conditional PUT (`If-None-Match`),
which is whole or absent too, and never replaces a file a replay finds there.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from isbre.catalog.metadata_files import make_dirs_durably, publish_durably
from isbre.catalog.object_storage import ObjectExistsError, ObjectStorageIO
from isbre.catalog.s3_options import S3Options
from isbre.sinks.columns import DEFAULT_PREFIX, MetadataColumns, now
from isbre.sinks.contract import CommitInfo, OffsetSpan, OneStreamSink, SourceFields, row_offsets


def span_file_name(span: OffsetSpan) -> str:
    # Source ids and topics may hold any character; a digest keeps the name a safe single path segment.
    stream = hashlib.sha256(f"{span.source_id}\0{span.topic}".encode()).hexdigest()[:16]
    return f"{stream}-p{span.partition}-{span.start:020d}-{span.end:020d}.parquet"


class ParquetSink(OneStreamSink):
    """`BatchSink` writing one Parquet file per `finish()` into `directory`."""

    def __init__(
        self,
        directory: str | Path,
        *,
        prefix: str = DEFAULT_PREFIX,
        compression: str = "zstd",
        s3: S3Options | None = None,
    ) -> None:
        """`directory`: a local directory, or `s3://bucket/prefix` reached with `s3` (default: the
        AWS environment and config chain)."""
        self.objects = ObjectStorageIO(s3 or S3Options()) if str(directory).startswith("s3://") else None
        self.directory = str(directory).rstrip("/") if self.objects else Path(directory)
        self.columns = MetadataColumns(prefix)
        self.compression = compression
        self._batches: list[pa.RecordBatch] = []

    def _take(
        self, batch: pa.RecordBatch, span: OffsetSpan, source: SourceFields | None, offsets: np.ndarray | None
    ) -> None:
        self.columns.check_payload(batch.schema)
        offsets = row_offsets(batch.num_rows, span, offsets)
        if source is not None:
            source.check(batch.num_rows)
        received = now()
        self._batches.append(self.columns.stamp(batch, span, offsets, source, received))

    def _commit(self, span: OffsetSpan) -> CommitInfo:
        batches, self._batches = self._batches, []
        emitted = now()
        table = pa.Table.from_batches([self.columns.with_emit_ts(b, emitted) for b in batches])
        if self.objects is not None:
            return self._put(table, f"{self.directory}/{span_file_name(span)}")
        assert isinstance(self.directory, Path)
        final = self.directory / span_file_name(span)
        if final.exists():  # this span was written before: replaying it adds nothing
            return CommitInfo(str(final), None)
        make_dirs_durably(self.directory)
        temporary = final.with_name(final.name + ".tmp")
        pq.write_table(table, temporary, compression=self.compression)
        publish_durably(temporary, final)
        return CommitInfo(str(final), None)

    def _put(self, table: pa.Table, location: str) -> CommitInfo:
        assert self.objects is not None
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer, compression=self.compression)
        # A span written before is there already: replaying it adds nothing.
        with contextlib.suppress(ObjectExistsError):
            self.objects.create_exclusively(location, buffer.getvalue().to_pybytes())
        return CommitInfo(location, None)
