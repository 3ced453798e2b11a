"""Table maintenance the catalog runs itself: which snapshots a table's retention properties
expire, which metadata files fall out of its kept versions, and which files that leaves
unreachable.

The policies are Iceberg's own table properties (what `expire_snapshots` and metadata cleanup
read in Spark and Java), read here the same way; `isbre.maintenance.enabled` says whether the
catalog applies them by itself after commits (they are always applied when asked for, see the
maintenance endpoint). This module decides; catalog/table_operations.py commits and deletes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from isbre.catalog.carried_index import carried_files
from isbre.catalog.compaction import (
    SMALL_SHARE,
    compaction_enabled,
    min_input_files,
    target_file_size,
)
from isbre.catalog.file_uris import local_path
from isbre.catalog.maintenance_policy import (
    DEFAULT_MAX_SNAPSHOT_AGE_MS,
    DEFAULT_MIN_SNAPSHOTS_TO_KEEP,
    DELETE_AFTER_COMMIT,
    MAX_REF_AGE_MS,
    MAX_SNAPSHOT_AGE_MS,
    MIN_SNAPSHOTS_TO_KEEP,
    enabled,
    int_property,
)
from isbre.catalog.manifest_entries import read_entries
from isbre.catalog.manifest_lists import read_manifests
from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Snapshot

EXPIRE_SNAPSHOTS = "expire-snapshots"
REMOVE_METADATA_FILES = "remove-metadata-files"
REMOVE_ORPHAN_FILES = "remove-orphan-files"
COMPACT_DATA_FILES = "compact-data-files"
REWRITE_MANIFESTS = "rewrite-manifests"
JOBS = (EXPIRE_SNAPSHOTS, REMOVE_METADATA_FILES, REWRITE_MANIFESTS, COMPACT_DATA_FILES, REMOVE_ORPHAN_FILES)
# The jobs that rewrite a table's files (manifests, data files): a server runs them in a process
# of their own.
REWRITING_JOBS = (REWRITE_MANIFESTS, COMPACT_DATA_FILES)

# A snapshot a job commits says which job it was, in this summary property.
JOB_PROPERTY = "isbre.maintenance.job"

# The metadata files isbre writes: `<version>-<uuid>.metadata.json`, versions counting up.
_VERSIONED = re.compile(r"^(\d{5,})-[0-9a-f-]{36}\.metadata\.json(\.gz)?$")


@dataclass(frozen=True)
class ExpiryPlan:
    """What expiring snapshots now would change: the snapshots to remove, the refs past their age,
    and the snapshot each branch the plan walked stood at (what the commit requires)."""

    snapshot_ids: tuple[int, ...]
    refs: tuple[str, ...]
    branches: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.snapshot_ids or self.refs)


def plan_expiry(metadata: TableMetadata, now_ms: int, held: frozenset[int] = frozenset()) -> ExpiryPlan:
    """Iceberg's rules: a branch keeps the ancestors of its head while fewer than its
    `min-snapshots-to-keep` are kept or they are younger than its `max-snapshot-age-ms`; a tag
    keeps its snapshot; a ref other than main older than its `max-ref-age-ms` goes; a snapshot no
    ref reaches stays until it is older than the table's `max-snapshot-age-ms`. And `held`, the
    snapshots the table's consumers have yet to read (catalog/consumers.py), stay."""
    properties = metadata.properties
    max_age = int_property(properties, MAX_SNAPSHOT_AGE_MS, DEFAULT_MAX_SNAPSHOT_AGE_MS)
    min_keep = int_property(properties, MIN_SNAPSHOTS_TO_KEEP, DEFAULT_MIN_SNAPSHOTS_TO_KEEP)
    max_ref_age = int(properties[MAX_REF_AGE_MS]) if MAX_REF_AGE_MS in properties else None
    by_id = {snapshot.snapshot_id: snapshot for snapshot in metadata.snapshots}
    retained: set[int] = set(held)
    reachable: set[int] = set()
    dropped: list[str] = []
    branches: dict[str, int] = {}
    for name, ref in metadata.refs.items():
        head = by_id.get(ref.snapshot_id)
        if head is None:
            continue
        ref_age = ref.max_ref_age_ms or max_ref_age
        if name != MAIN_BRANCH and ref_age is not None and now_ms - head.timestamp_ms > ref_age:
            dropped.append(name)
            continue
        if ref.snapshot_ref_type == SnapshotRefType.TAG:
            retained.add(head.snapshot_id)
            continue
        branches[name] = head.snapshot_id
        keep = ref.min_snapshots_to_keep or min_keep
        age = ref.max_snapshot_age_ms or max_age
        kept = 0
        walked: Snapshot | None = head
        while walked is not None:
            reachable.add(walked.snapshot_id)
            if kept < keep or now_ms - walked.timestamp_ms <= age:
                retained.add(walked.snapshot_id)
                kept += 1
            parent = walked.parent_snapshot_id
            walked = by_id.get(parent) if parent is not None and parent not in reachable else None
    for snapshot in metadata.snapshots:
        if snapshot.snapshot_id not in reachable and now_ms - snapshot.timestamp_ms <= max_age:
            retained.add(snapshot.snapshot_id)
    expired = tuple(s.snapshot_id for s in metadata.snapshots if s.snapshot_id not in retained)
    return ExpiryPlan(expired, tuple(dropped), branches)


def unreachable_files(io: FileIO, before: TableMetadata, after: TableMetadata) -> list[tuple[str, str]]:
    """(path, what it is) of every file that `before`'s snapshots name and `after`'s do not, data
    files first, manifest lists last."""
    kept = {snapshot.snapshot_id for snapshot in after.snapshots}
    gone = [snapshot for snapshot in before.snapshots if snapshot.snapshot_id not in kept]
    if not gone:
        return []
    version = after.format_version
    live_lists = {snapshot.manifest_list for snapshot in after.snapshots}
    live = {
        m.manifest_path: m
        for snapshot in after.snapshots
        for m in read_manifests(io, snapshot.manifest_list, version)
    }
    expired = {
        m.manifest_path: m
        for snapshot in gone
        for m in read_manifests(io, snapshot.manifest_list, version)
        if m.manifest_path not in live
    }
    files: list[tuple[str, str]] = []
    if expired:
        # A kept snapshot's entry that says a file was deleted does not keep it: a snapshot reads
        # only the files its manifests hold as added or existing.
        live_data = {
            entry.data_file.file_path
            for manifest in live.values()
            for entry in read_entries(io, manifest, version, discard_deleted=True)
        }
        dead_data = {
            entry.data_file.file_path
            for manifest in expired.values()
            for entry in read_entries(io, manifest, version, discard_deleted=False)
        }
        files += [(path, "data file") for path in sorted(dead_data - live_data)]
        files += [(path, "manifest") for path in sorted(expired)]
    files += [(s.manifest_list, "manifest list") for s in gone if s.manifest_list not in live_lists]
    return files


def referenced_files(io: FileIO, metadata: TableMetadata, location: str) -> set[str]:
    """Every file the table's metadata reaches: its metadata files (current and logged), each
    snapshot's manifest list and manifests, the data and delete files they name (removed entries
    too), its statistics files, and what the catalog keeps for its snapshots' carried rows."""
    named = {location, *(entry.metadata_file for entry in metadata.metadata_log)}
    named |= {f.statistics_path for f in metadata.statistics}
    named |= {f.statistics_path for f in metadata.partition_statistics}
    for snapshot in metadata.snapshots:
        named.add(snapshot.manifest_list)
        for manifest in read_manifests(io, snapshot.manifest_list, metadata.format_version):
            if manifest.manifest_path in named:
                continue
            named.add(manifest.manifest_path)
            entries = read_entries(io, manifest, metadata.format_version, discard_deleted=False)
            named |= {e.data_file.file_path for e in entries}
    return named | set(carried_files(io, metadata))


def orphans(
    listed: Iterable[tuple[str, float]], referenced: set[str], now_ms: int, min_age_ms: int
) -> list[tuple[str, str]]:
    """(location, what it is) of the listed files (local locations, with their modification time
    in seconds) that the table does not reference and that are older than `min_age_ms`."""
    known = {os.path.normpath(p) for p in (local_path(uri) for uri in referenced) if p is not None}
    return [
        (location, "orphan file")
        for location, modified in sorted(listed)
        if os.path.normpath(str(local_path(location))) not in known and now_ms - modified * 1000 > min_age_ms
    ]


def version_of(name: str) -> int | None:
    """The version in the name of a metadata file isbre wrote (None: another writer's file)."""
    found = _VERSIONED.match(name)
    return int(found.group(1)) if found else None


def superseded_metadata(names: list[str], metadata: TableMetadata, location: str) -> list[str]:
    """Of the files `names` in the table's metadata directory, the old versions to delete: older
    than every version the table still lists (its current file and its metadata log). A newer
    file may be a commit's, written but not yet current: it is never one of these."""
    listed = [location, *(entry.metadata_file for entry in metadata.metadata_log)]
    versions = [v for v in (version_of(path.rsplit("/", 1)[-1]) for path in listed) if v is not None]
    if not versions:
        return []
    oldest = min(versions)
    keep = {path.rsplit("/", 1)[-1] for path in listed}
    return [n for n in names if n not in keep and (v := version_of(n)) is not None and v < oldest]


def health(metadata: TableMetadata, metadata_bytes: int, now_ms: int) -> dict[str, Any]:
    """What maintenance has to look at in a table, from its metadata alone (no manifest read):
    its snapshots, the size of its metadata file, its data files by the current snapshot's
    summary, and the jobs its policies make due now."""
    files, size = data_file_totals(metadata)
    due = [EXPIRE_SNAPSHOTS] if plan_expiry(metadata, now_ms) else []
    if metadata.properties.get(DELETE_AFTER_COMMIT, "false").lower() == "true":
        due.append(REMOVE_METADATA_FILES)  # whether old files remain is known only by listing
    if compaction_due(metadata.properties, files, size):
        due.append(COMPACT_DATA_FILES)  # by the totals: which files are small, only the manifests say
    return {
        "maintained": enabled(metadata.properties),
        "snapshots": len(metadata.snapshots),
        "metadata-file-bytes": metadata_bytes,
        "metadata-log-entries": len(metadata.metadata_log),
        "data-files": files,
        "average-data-file-bytes": size // files if files else 0,
        "due": due,
    }


def data_file_totals(metadata: TableMetadata) -> tuple[int, int]:
    """How many data files the current snapshot reads, and their bytes, by its summary."""
    current = metadata.current_snapshot()
    totals = current.summary.additional_properties if current and current.summary else {}
    return int(totals.get("total-data-files", 0)), int(totals.get("total-files-size", 0))


def compaction_due(properties: dict[str, str], files: int, size: int) -> bool:
    """Whether a table of `files` data files of `size` bytes in all may have small files enough
    to compact, by its totals alone."""
    if not compaction_enabled(properties) or files < min_input_files(properties):
        return False
    return size / files < target_file_size(properties) * SMALL_SHARE


@dataclass
class JobReport:
    """What one job did on one table."""

    job: str
    committed: bool = False
    commit_seq: int | None = None
    removed_snapshots: int = 0
    removed_refs: list[str] = field(default_factory=list)
    deleted_files: int = 0
    skipped_files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # What a rewrite read and wrote: files (data files or manifests) replaced, files written in
    # their place, bytes of the replaced files.
    rewritten_files: int = 0
    added_files: int = 0
    rewritten_bytes: int = 0
    # Paths the table's metadata names outside the table, which the job left alone.
    foreign_paths: list[str] = field(default_factory=list)
    # Why a job that ran found nothing to do (None when it did something, or failed).
    nothing_to_do: str | None = None
    # Commits of the job that Iceberg's rules refused on the table's head (catalog/conflicts.py),
    # each with why: what they would have changed is left as it was.
    abandoned: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "job": self.job,
            "committed": self.committed,
            "removed-snapshots": self.removed_snapshots,
            "removed-refs": self.removed_refs,
            "deleted-files": self.deleted_files,
        }
        if self.commit_seq is not None:
            body["commit-seq"] = self.commit_seq
        if self.job in REWRITING_JOBS:
            body["rewritten-files"] = self.rewritten_files
            body["added-files"] = self.added_files
            body["rewritten-bytes"] = self.rewritten_bytes
        if self.skipped_files:
            body["skipped-files"] = self.skipped_files[:20]
        if self.problems:
            body["problems"] = self.problems[:20]
        if self.foreign_paths:
            body["foreign-paths"] = self.foreign_paths[:20]
        if self.nothing_to_do is not None:
            body["nothing-to-do"] = self.nothing_to_do
        if self.abandoned:
            body["abandoned"] = self.abandoned[:20]
        return body

    @classmethod
    def from_json(cls, found: dict[str, Any]) -> JobReport:
        """The report `to_json` wrote (in a job's process)."""
        return cls(
            found["job"],
            committed=found["committed"],
            commit_seq=found.get("commit-seq"),
            removed_snapshots=found["removed-snapshots"],
            removed_refs=found["removed-refs"],
            deleted_files=found["deleted-files"],
            skipped_files=found.get("skipped-files", []),
            problems=found.get("problems", []),
            rewritten_files=found.get("rewritten-files", 0),
            added_files=found.get("added-files", 0),
            rewritten_bytes=found.get("rewritten-bytes", 0),
            foreign_paths=found.get("foreign-paths", []),
            nothing_to_do=found.get("nothing-to-do"),
            abandoned=found.get("abandoned", []),
        )
