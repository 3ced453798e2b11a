"""Manifest lists read and written in the table's own format version, v3's row ids included.

PyIceberg 0.12 reads every manifest list with its v2 schema, which drops a v3 list's
`first_row_id` of each manifest, and writes no v3 list at all. A snapshot the catalog makes again
(catalog/rebase.py) must keep the row ids the head's manifests were given and give its own new
manifests theirs, as the spec's first-row-id assignment says: a data manifest without a
`first_row_id` gets the next row id, which then advances by the rows of its added and existing
files; delete manifests get none.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from io import BytesIO
from typing import Any, TypeVar

from isbre.catalog.lru import Lru
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.encoder import BinaryEncoder
from pyiceberg.avro.file import META_SCHEMA, AvroFile, AvroFileHeader, AvroOutputFile
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import construct_reader, resolve_reader
from pyiceberg.avro.writer import Writer
from pyiceberg.io import FileIO, InputFile, OutputFile
from pyiceberg.manifest import (
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    ManifestContent,
    ManifestFile,
    ManifestListWriter,
    ManifestListWriterV2,
    PartitionFieldSummary,
    write_manifest_list,
)
from pyiceberg.schema import Schema
from pyiceberg.typedef import StructProtocol
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

R = TypeVar("R", bound=StructProtocol)
# Where a v3 manifest list's `first_row_id` sits in PyIceberg's manifest record (after the v2 fields).
FIRST_ROW_ID = len(MANIFEST_LIST_FILE_SCHEMAS[3].fields) - 1


def read_manifests(io: FileIO, location: str, format_version: int) -> list[ManifestFile]:
    """The manifests of the list at `location`, with their `first_row_id` on a v3 table."""
    version = 3 if format_version >= 3 else 2
    with KeptSchemaFile[ManifestFile](io.new_input(location), _resolved, version) as reader:
        return list(reader)


# Resolving a list's schema into a reader takes about as long as decoding a hundred of its entries,
# and a table's lists declare one or two schemas: the readers of the last few schemas are kept. A
# schema is what a list's writer declared, so one longer than this is resolved every time instead.
_KEPT_SCHEMAS = 16
_KEPT_SCHEMA_CHARS = 64 << 10
_HEADER = construct_reader(META_SCHEMA, {-1: AvroFileHeader})


class KeptSchemaFile(AvroFile[R]):
    """PyIceberg's Avro file, its records read by the reader `resolve(declared, version)` makes of
    the schema its header declares: a function kept with functools.lru_cache, so that it is
    resolved once for all files declaring the same schema (one longer than _KEPT_SCHEMA_CHARS is
    resolved every time, and not kept)."""

    def __init__(self, input_file: InputFile, resolve: Any, version: int) -> None:
        super().__init__(input_file)
        self._resolve = resolve
        self._version = version

    def __enter__(self) -> KeptSchemaFile[R]:
        with self.input_file.open() as stream:
            self.decoder = new_decoder(stream.read())
        self.header = _HEADER.read(self.decoder)
        declared = self.header.meta.get("avro.schema")
        if declared is None:
            raise ValueError("No schema found in Avro file headers")
        resolve = self._resolve if len(declared) <= _KEPT_SCHEMA_CHARS else self._resolve.__wrapped__
        self.schema, self.reader = resolve(declared, self._version)
        return self


def parsed_schema(declared: str) -> Schema:
    return AvroSchemaConversion().avro_to_iceberg(json.loads(declared))


@functools.lru_cache(maxsize=_KEPT_SCHEMAS)
def _resolved(declared: str, version: int) -> tuple[Schema, Reader]:
    schema = parsed_schema(declared)
    reader = resolve_reader(
        schema,
        MANIFEST_LIST_FILE_SCHEMAS[version],
        read_types={-1: ManifestFile, 508: PartitionFieldSummary},
        read_enums={517: ManifestContent},
    )
    return schema, reader


def first_row_id(manifest: ManifestFile) -> int | None:
    found: int | None = manifest[FIRST_ROW_ID] if len(manifest) > FIRST_ROW_ID else None
    return found


def without_first_row_id(manifest: ManifestFile) -> ManifestFile:
    """A copy of `manifest` that the next v3 list it is written to gives row ids again. A copy of
    its values: `copy.copy` of a PyIceberg record shares them with the original."""
    moved = ManifestFile(*(manifest[i] for i in range(len(manifest))))
    if len(moved) > FIRST_ROW_ID:
        moved[FIRST_ROW_ID] = None
    return moved


# Encodings of manifest-list entries remembered, by their whole content.
Encodings = Lru[tuple[Any, ...], bytes]

_PARTITIONS = [f.name for f in MANIFEST_LIST_FILE_SCHEMAS[2].fields].index("partitions")


def _content(manifest: ManifestFile) -> tuple[Any, ...]:
    """Every value of a manifest-list entry, its partition summaries' too: what its encoding says."""
    values = [manifest[i] for i in range(len(manifest))]
    partitions = manifest.partitions
    values[_PARTITIONS] = (
        None if partitions is None else tuple(tuple(p[i] for i in range(len(p))) for p in partitions)
    )
    return tuple(values)


class _EncodedOnce:
    """A manifest list's record writer that encodes each distinct entry once: the entries of a hot
    table's head are written again into every list made on it."""

    def __init__(self, writer: Writer, encodings: Encodings) -> None:
        self._writer = writer
        self._encodings = encodings

    def write(self, encoder: BinaryEncoder, manifest: ManifestFile) -> None:
        key = _content(manifest)
        encoded = self._encodings.peek(key)
        if encoded is None:
            buffer = BytesIO()
            self._writer.write(BinaryEncoder(buffer), manifest)
            encoded = buffer.getvalue()
            self._encodings.put(key, encoded)
        encoder.write(encoded)


class _ListWriter(ManifestListWriterV2):
    """PyIceberg's v2 manifest list writer, writing v2 or v3 (with row ids assigned), its entries'
    encodings remembered in `encodings` when given."""

    def __init__(
        self,
        output_file: OutputFile,
        format_version: int,
        snapshot_id: int,
        parent_snapshot_id: int | None,
        sequence_number: int,
        next_row_id: int,
        compression: str,
        encodings: Encodings | None,
    ) -> None:
        super().__init__(output_file, snapshot_id, parent_snapshot_id, sequence_number, compression)  # type: ignore[arg-type]
        if format_version >= 3:
            self._format_version = 3
            self._meta = {**self._meta, "format-version": "3", "first-row-id": str(next_row_id)}
        self.next_row_id = next_row_id
        self._encodings = encodings

    def __enter__(self) -> ManifestListWriter:
        schema = MANIFEST_LIST_FILE_SCHEMAS[self._format_version]
        self._writer = AvroOutputFile[ManifestFile](
            output_file=self._output_file,
            record_schema=schema,
            file_schema=schema,
            schema_name="manifest_file",
            metadata=self._meta,
        )
        self._writer.__enter__()
        if self._encodings is not None:
            self._writer.writer = _EncodedOnce(self._writer.writer, self._encodings)  # type: ignore[assignment]
        return self

    def prepare_manifest(self, manifest_file: ManifestFile) -> ManifestFile:
        if self._assigned(manifest_file):
            return manifest_file  # a manifest of an earlier snapshot: as it is, not copied
        prepared = super().prepare_manifest(manifest_file)
        if self._format_version < 3:
            return prepared
        if len(prepared) <= FIRST_ROW_ID:  # read with the v2 schema (a list from before v3)
            prepared = ManifestFile(*(prepared[i] for i in range(len(prepared))), None)
        if prepared.content == ManifestContent.DATA and prepared[FIRST_ROW_ID] is None:
            prepared[FIRST_ROW_ID] = self.next_row_id
            self.next_row_id += (prepared.existing_rows_count or 0) + (prepared.added_rows_count or 0)
        return prepared

    def _assigned(self, manifest: ManifestFile) -> bool:
        """Whether the manifest has its sequence numbers, and on v3 its row ids, already."""
        if UNASSIGNED_SEQ in (manifest.sequence_number, manifest.min_sequence_number):
            return False
        if self._format_version < 3:
            return True
        if len(manifest) <= FIRST_ROW_ID:  # a v2 record: written as v3, it needs a copy anyway
            return False
        return manifest.content != ManifestContent.DATA or manifest[FIRST_ROW_ID] is not None

    def write(self, manifests: list[ManifestFile]) -> tuple[ManifestFile, ...]:
        """Write `manifests`; them as written."""
        prepared = tuple(self.prepare_manifest(manifest) for manifest in manifests)
        self._writer.write_block(list(prepared))
        return prepared


@dataclass(frozen=True)
class Written:
    manifests: tuple[ManifestFile, ...]  # as the list holds them: sequence numbers, row ids assigned
    assigned_rows: int  # v3: the rows given row ids (else 0)


def write_manifests(
    io: FileIO,
    location: str,
    format_version: int,
    snapshot_id: int,
    parent_snapshot_id: int | None,
    sequence_number: int,
    first_row_id: int | None,
    compression: str,
    manifests: list[ManifestFile],
    encodings: Encodings | None = None,
) -> Written:
    """Write `manifests` as the list of the snapshot `snapshot_id`, whose row ids (v3) start at
    `first_row_id`, the table's next row id; with the encodings of entries in `encodings`."""
    output = io.new_output(location)
    start = first_row_id or 0
    writer: ManifestListWriter
    if format_version < 2:
        writer = write_manifest_list(1, output, snapshot_id, parent_snapshot_id, None, compression)  # type: ignore[arg-type]
    else:
        writer = _ListWriter(
            output,
            format_version,
            snapshot_id,
            parent_snapshot_id,
            sequence_number,
            start,
            compression,
            encodings,
        )
    with writer:
        if isinstance(writer, _ListWriter):
            prepared = writer.write(manifests)
        else:  # v1: written as they are
            writer.add_manifests(manifests)
            prepared = tuple(manifests)
    assigned = writer.next_row_id - start if isinstance(writer, _ListWriter) else 0
    return Written(prepared, assigned)
