"""Manifest entries read in the table's own format version, v3's fields kept.

PyIceberg 0.12 reads every manifest with its v2 schema, which drops what a v3 entry adds: a data
file's `first_row_id`, and a deletion vector's `referenced_data_file`, `content_offset` and
`content-size-in-bytes`. The catalog's conflict rules (catalog/conflicts.py) need the data file a
deletion vector deletes from; on a v1 or v2 table the entries are PyIceberg's own.
"""

from __future__ import annotations

import functools

from isbre.catalog.manifest_lists import KeptSchemaFile, parsed_schema
from isbre.catalog.pyiceberg_internals import inherit_from_manifest
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import resolve_reader
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    MANIFEST_ENTRY_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.schema import Schema

# Where v3's fields sit in PyIceberg's data file record (after the v2 fields, in the spec's order).
_V3_FIELDS = [f.name for f in MANIFEST_ENTRY_SCHEMAS[3].find_field("data_file").field_type.fields]  # type: ignore[attr-defined]
_FIRST_ROW_ID = _V3_FIELDS.index("first_row_id")
_REFERENCED_DATA_FILE = _V3_FIELDS.index("referenced_data_file")
_CONTENT_OFFSET = _V3_FIELDS.index("content_offset")
_CONTENT_SIZE = _V3_FIELDS.index("content_size_in_bytes")


def read_entries(
    io: FileIO,
    manifest: ManifestFile,
    format_version: int,
    discard_deleted: bool = True,
    inherit: bool = True,
) -> list[ManifestEntry]:
    """The entries of `manifest`; with `inherit`, their snapshot ids and sequence numbers filled in
    from the manifest as the spec says (else as written)."""
    version = 3 if format_version >= 3 else 2
    with KeptSchemaFile[ManifestEntry](io.new_input(manifest.manifest_path), _resolved, version) as reader:
        entries = [
            inherit_from_manifest(entry, manifest) if inherit else entry
            for entry in reader
            if not discard_deleted or entry.status != ManifestEntryStatus.DELETED
        ]
    for entry in entries:  # a file's spec is its manifest's (PyIceberg's reader says so too)
        entry.data_file.spec_id = manifest.partition_spec_id
    return entries


@functools.lru_cache(maxsize=16)
def _resolved(declared: str, version: int) -> tuple[Schema, Reader]:
    """The reader of manifest entries whose file declares `declared`: a table's manifests declare
    one schema per partition spec, so it is resolved once, not for every manifest."""
    schema = parsed_schema(declared)
    reader = resolve_reader(
        schema,
        MANIFEST_ENTRY_SCHEMAS[version],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    )
    return schema, reader


def inherit_first_row_ids(entries: list[ManifestEntry], manifest_first_row_id: int | None) -> None:
    """Give each live data file of a manifest without a `first_row_id` its own, as the spec's row
    lineage says (Java's ManifestReader does it as it reads): the manifest's, then on past the
    rows of each such file before it, in the manifest's order."""
    if manifest_first_row_id is None:
        return
    next_row_id = manifest_first_row_id
    for entry in entries:
        data_file = entry.data_file
        if entry.status == ManifestEntryStatus.DELETED or data_file.content != DataFileContent.DATA:
            continue
        if first_row_id(data_file) is None and len(data_file) > _FIRST_ROW_ID:
            data_file[_FIRST_ROW_ID] = next_row_id
            next_row_id += data_file.record_count


def as_v3(data_file: DataFile, spec_id: int) -> DataFile:
    """A data file record PyIceberg's writer made (shaped for v1 and v2, and without its spec) as
    a v3 manifest entry of the spec `spec_id` holds it, its v3 fields unset."""
    made = DataFile.from_args(
        3, **{name: data_file[i] for i, name in enumerate(_V3_FIELDS[: len(data_file)])}
    )
    made.spec_id = spec_id
    return made


def with_first_row_id(data_file: DataFile, row_id: int) -> DataFile:
    """A copy of `data_file` (shaped for any version) as a v3 record whose `first_row_id` is
    `row_id`."""
    made = as_v3(data_file, data_file.spec_id)
    made[_FIRST_ROW_ID] = row_id
    return made


def _v3_field(data_file: DataFile, index: int) -> object:
    return data_file[index] if len(data_file) > index else None


def first_row_id(data_file: DataFile) -> int | None:
    found = _v3_field(data_file, _FIRST_ROW_ID)
    return found if isinstance(found, int) else None


def referenced_data_file(data_file: DataFile) -> str | None:
    """The one data file a delete file (a deletion vector, or a position delete file that says so)
    deletes from; None when it may delete from any file of its partition."""
    found = _v3_field(data_file, _REFERENCED_DATA_FILE)
    return found if isinstance(found, str) else None


def content_range(data_file: DataFile) -> tuple[int, int] | None:
    """A deletion vector's offset and length in its Puffin file."""
    offset, size = _v3_field(data_file, _CONTENT_OFFSET), _v3_field(data_file, _CONTENT_SIZE)
    return (offset, size) if isinstance(offset, int) and isinstance(size, int) else None
