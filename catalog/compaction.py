"""Which small data files of a table to compact together, from its policy properties.

A table appended to in small commits (a sink committing every second) gets one small data file a
commit; a scan opens each of them. Compaction reads a group of small files of one partition and
writes their rows again as files of the target size, in one `replace` snapshot: the rows are the
same, only the files change. This module decides; catalog/maintenance_operations.py rewrites and
commits, in a process of its own (catalog/job_process.py).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from isbre.catalog.manifest_entries import first_row_id as row_id_of
from isbre.catalog.manifest_entries import inherit_first_row_ids, read_entries
from isbre.catalog.manifest_lists import first_row_id, read_manifests
from isbre.catalog.row_lineage import Inherited
from isbre.catalog.scan_planning import DeleteIndex
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record

COMPACT_ENABLED = "isbre.maintenance.compact.enabled"
TARGET_FILE_SIZE = "isbre.maintenance.compact.target-file-size-bytes"
MIN_INPUT_FILES = "isbre.maintenance.compact.min-input-files"
# Iceberg's own: what a table's writers aim at, and what its rewrite_data_files reads.
WRITE_TARGET_FILE_SIZE = "write.target-file-size-bytes"
DEFAULT_TARGET_FILE_SIZE = 512 * 1024 * 1024
DEFAULT_MIN_INPUT_FILES = 5
# A file smaller than this share of the target is small (Iceberg's min-file-size-bytes default).
SMALL_SHARE = 0.75


class NotCompactedError(ValueError):
    """The table holds something compaction cannot rewrite without changing what it means."""


def target_file_size(properties: dict[str, str]) -> int:
    return int(
        properties.get(TARGET_FILE_SIZE, properties.get(WRITE_TARGET_FILE_SIZE, DEFAULT_TARGET_FILE_SIZE))
    )


def min_input_files(properties: dict[str, str]) -> int:
    return int(properties.get(MIN_INPUT_FILES, DEFAULT_MIN_INPUT_FILES))


def compaction_enabled(properties: dict[str, str]) -> bool:
    return properties.get(COMPACT_ENABLED, "false").lower() == "true"


@dataclass(frozen=True)
class LiveFiles:
    """The data files the current snapshot reads; on a format v3 table what each file's rows
    inherit of their lineage (by path); on a v2 table with delete files, the deletes that apply to
    each file (by path: what its rows are read with when it is rewritten)."""

    snapshot_id: int | None
    files: tuple[DataFile, ...]
    inherited: dict[str, Inherited]
    deletes: dict[str, tuple[DataFile, ...]] = field(default_factory=dict)


def live_data_files(io: FileIO, metadata: TableMetadata) -> LiveFiles:
    """The current snapshot's data files, each with the delete files that apply to it. A file is
    rewritten with its deletes applied: its rows written again are those a reader reads, and the
    new file takes a new sequence number, which the older deletes do not apply to. A format v3
    table with delete files is not compacted (its rows' lineage is their position in their file)."""
    snapshot = metadata.current_snapshot()
    if snapshot is None:
        return LiveFiles(None, (), {})
    manifests = read_manifests(io, snapshot.manifest_list, metadata.format_version)
    delete_manifests = [m for m in manifests if m.content == ManifestContent.DELETES]
    if delete_manifests and metadata.format_version >= 3:
        raise NotCompactedError("a format v3 table with delete files is not compacted")
    entries = []
    for manifest in manifests:
        if manifest.content == ManifestContent.DATA:
            read = read_entries(io, manifest, metadata.format_version)
            inherit_first_row_ids(read, first_row_id(manifest))
            entries += read
    inherited = {
        entry.data_file.file_path: Inherited(row_id_of(entry.data_file), entry.sequence_number)
        for entry in entries
        if metadata.format_version >= 3
    }
    index = DeleteIndex(metadata)
    for manifest in delete_manifests:
        for entry in read_entries(io, manifest, metadata.format_version):
            index.add(entry)
    deletes = {entry.data_file.file_path: found for entry in entries if (found := tuple(index.of(entry)))}
    return LiveFiles(snapshot.snapshot_id, tuple(entry.data_file for entry in entries), inherited, deletes)


def _small_by_partition(
    files: tuple[DataFile, ...], properties: dict[str, str]
) -> dict[tuple[int, Record], list[DataFile]]:
    small = int(target_file_size(properties) * SMALL_SHARE)
    partitions: dict[tuple[int, Record], list[DataFile]] = defaultdict(list)
    for data_file in files:
        if data_file.file_size_in_bytes < small:
            partitions[(data_file.spec_id, data_file.partition)].append(data_file)
    return partitions


def most_small_files(files: tuple[DataFile, ...], properties: dict[str, str]) -> int:
    """The most small files one partition holds (what compaction waits for, when it waits)."""
    return max((len(each) for each in _small_by_partition(files, properties).values()), default=0)


def plan_compaction(files: tuple[DataFile, ...], properties: dict[str, str]) -> list[list[DataFile]]:
    """Groups of small files to rewrite together: per partition (and spec), once it holds
    `min-input-files` small ones, packed into groups whose inputs add up to the target size at
    most. A group of one file is not worth rewriting."""
    target = target_file_size(properties)
    groups: list[list[DataFile]] = []
    for candidates in _small_by_partition(files, properties).values():
        if len(candidates) < min_input_files(properties):
            continue
        group: list[DataFile] = []
        size = 0
        for data_file in candidates:
            if group and size + data_file.file_size_in_bytes > target:
                groups.append(group)
                group, size = [], 0
            group.append(data_file)
            size += data_file.file_size_in_bytes
        groups.append(group)
    return [group for group in groups if len(group) > 1]
