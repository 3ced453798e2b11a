"""The record metadata columns a sink adds to every row, under a configurable prefix.

`<prefix>source_*` hold what the source said about the record; the bare
`<prefix>*` columns are stamped by isbre. The prefix is fixed for a table
once it exists (the table property `isbre.sink.prefix` records it).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
from isbre.sinks.contract import OffsetSpan, SinkError, SourceFields
from isbre.sinks.policies import EARLIER_POLICY, POLICIES
from isbre.sinks.record_id import RECORD_ID, record_ids

DEFAULT_PREFIX = "_twg_"
TIMESTAMP = pa.timestamp("us", tz="UTC")
HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))

# (suffix, Arrow type, built-in column doc), in table order.
COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("source_topic", pa.string(), "Source topic (for files: the file path) the record was read from."),
    ("source_partition", pa.int64(), "Source partition the record was read from."),
    ("source_offset", pa.int64(), "Offset of the record within its source partition."),
    ("source_key", pa.binary(), "Record key as the source supplied it; null if it had none."),
    ("source_timestamp", TIMESTAMP, "Record timestamp as the source supplied it; null if it had none."),
    ("source_headers", HEADERS, "Record headers in source order; duplicate keys and null values kept."),
    ("ingest_ts", TIMESTAMP, "When isbre's sink received the record."),
    ("emit_ts", TIMESTAMP, "When the sink wrote the record into the commit that made it durable."),
    (
        "record_id",
        RECORD_ID,
        "Deterministic 128-bit id (rid1) of source id, topic, partition, offset and payload.",
    ),
)


def now() -> pa.Scalar:
    return pa.scalar(datetime.now(UTC), TIMESTAMP)


def _constant(value: pa.Scalar, length: int) -> pa.Array:
    return pa.repeat(value, length)


@dataclass(frozen=True)
class MetadataColumns:
    prefix: str = DEFAULT_PREFIX
    policy: str = EARLIER_POLICY

    def __post_init__(self) -> None:
        if not self.prefix or not self.prefix.isidentifier():
            raise ValueError(f"A metadata column prefix must be a non-empty identifier: {self.prefix!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"Unknown metadata policy {self.policy!r}: one of {', '.join(POLICIES)}")

    def name(self, suffix: str) -> str:
        return self.prefix + suffix

    @property
    def columns(self) -> list[tuple[str, pa.DataType, str]]:
        """The policy's columns: (suffix, Arrow type, doc), in table order."""
        return [column for column in COLUMNS if column[0] in POLICIES[self.policy]]

    @property
    def names(self) -> list[str]:
        return [self.prefix + suffix for suffix, _, _ in self.columns]

    @property
    def fields(self) -> list[pa.Field]:
        return [
            pa.field(self.prefix + suffix, kind, metadata={"doc": doc}) for suffix, kind, doc in self.columns
        ]

    def check_payload(self, schema: pa.Schema, allowed: tuple[str, ...] = ()) -> None:
        """A payload field under the prefix would shadow a metadata column: refuse it by name, but
        for the `allowed` ones (the columns data-quality rules add) that this policy does not add."""
        own = set(self.names)
        clashing = [n for n in schema.names if n.startswith(self.prefix) and (n in own or n not in allowed)]
        if clashing:
            raise SinkError(
                f"Payload column(s) {', '.join(map(repr, clashing))} use the reserved metadata prefix "
                f"{self.prefix!r}; rename them or configure another prefix for a new table"
            )

    @property
    def parquet_options(self) -> dict[str, tuple[bool, str | None, str | None, bool]]:
        """Parquet (dictionary, encoding, compression, statistics) for the columns whose values defeat
        the defaults. Random record ids have no useful min/max either."""
        options = {
            "source_offset": (False, "DELTA_BINARY_PACKED", None, True),
            "ingest_ts": (False, "DELTA_BINARY_PACKED", None, True),
            "emit_ts": (False, "DELTA_BINARY_PACKED", None, True),
            "record_id": (False, None, "none", False),
        }
        return {
            self.name(suffix): option for suffix, option in options.items() if suffix in POLICIES[self.policy]
        }

    def with_emit_ts(self, batch: pa.RecordBatch, emitted: pa.Scalar) -> pa.RecordBatch:
        if "emit_ts" not in POLICIES[self.policy]:
            return batch
        # emit_ts goes back to its place, just before record_id, the last column `stamp` made.
        column = pa.repeat(emitted, batch.num_rows)
        return batch.add_column(batch.num_columns - 1, pa.field(self.name("emit_ts"), TIMESTAMP), column)

    def stamp(
        self,
        batch: pa.RecordBatch,
        span: OffsetSpan,
        offsets: np.ndarray,
        source: SourceFields | None,
        received: pa.Scalar,
        unhashed: Collection[str] = (),
    ) -> pa.RecordBatch:
        """`batch` with the metadata columns appended (`offsets`: one source offset per row), all but
        `emit_ts`, which the writer adds when it writes the commit's files. The record id hashes
        the record's own columns: not those named `unhashed` (what a rule or a quarantine added), so
        a record has one id in its table, its quarantine and its audit."""
        n = batch.num_rows
        source = source or SourceFields()
        given = {
            "source_key": source.keys,
            "source_timestamp": source.timestamps,
            "source_headers": source.headers,
            "ingest_ts": source.ingest_ts,
        }
        columns, fields = [], []
        for (suffix, kind, _), metadata_field in zip(self.columns, self.fields, strict=True):
            if suffix == "emit_ts":
                continue
            if suffix == "source_topic":
                column = _constant(pa.scalar(span.topic), n)
            elif suffix == "source_partition":
                column = _constant(pa.scalar(span.partition, pa.int64()), n)
            elif suffix == "source_offset":
                column = pa.array(offsets, pa.int64())
            elif suffix in given:
                column = given[suffix]
                if column is None:
                    column = _constant(received, n) if suffix == "ingest_ts" else pa.nulls(n, kind)
                elif column.type != kind:
                    column = column.cast(kind)
            else:
                own = [
                    c
                    for c, name in zip(batch.columns, batch.schema.names, strict=True)
                    if name not in unhashed
                ]
                column = record_ids(span.source_id, span.topic, span.partition, offsets, own)
            columns.append(column)
            fields.append(metadata_field)
        schema = pa.schema([*batch.schema, *fields])
        return pa.RecordBatch.from_arrays([*batch.columns, *columns], schema=schema)
