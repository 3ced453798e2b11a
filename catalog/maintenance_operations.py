"""Maintenance jobs on one table, each change an ordinary commit.

A job plans from the table as it is, commits with requirements on what it read (a concurrent
commit wins, and the job plans again), and deletes files only once the commit that made them
unreachable is durable, through the table's confined deleter: a crash at any point leaves no
table pointing at a deleted file, at worst files nobody points at.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from isbre.catalog.compaction import (
    MIN_INPUT_FILES,
    NotCompactedError,
    live_data_files,
    min_input_files,
    most_small_files,
    plan_compaction,
)
from isbre.catalog.compaction_files import read_group, write_rows
from isbre.catalog.confined_io import ConfinedIO, ForeignPathError
from isbre.catalog.conflicts import ConflictError
from isbre.catalog.consumers import Consumers
from isbre.catalog.deletion import delete_each
from isbre.catalog.file_uris import local_path
from isbre.catalog.identifiers import Identifier
from isbre.catalog.maintenance import (
    COMPACT_DATA_FILES,
    EXPIRE_SNAPSHOTS,
    JOBS,
    REMOVE_METADATA_FILES,
    REMOVE_ORPHAN_FILES,
    REWRITE_MANIFESTS,
    REWRITING_JOBS,
    JobReport,
    orphans,
    plan_expiry,
    referenced_files,
    superseded_metadata,
    unreachable_files,
)
from isbre.catalog.maintenance_policy import DELETE_AFTER_COMMIT, orphan_min_age_ms
from isbre.catalog.manifest_lists import read_manifests
from isbre.catalog.own_commits import commit_rewrite, expiring, merging, replacing
from isbre.catalog.places import places_of
from isbre.catalog.request_context import ANONYMOUS, RequestContext
from isbre.catalog.service_core import ServiceCore
from isbre.catalog.table_commit import MAX_COMMIT_ATTEMPTS, TableState
from isbre.catalog.table_operations import Tables
from isbre.catalog.table_staging import TableChange
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    AssertTableUUID,
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    TableRequirement,
    TableUpdate,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from isbre.catalog.job_process import JobProcesses

log = logging.getLogger(__name__)
# What a commit of a job's must pass on the head it is staged on (catalog/conflicts.py).
Rules = Callable[[TableMetadata], None]


class UnknownJobError(ValueError):
    pass


class Maintenance:
    """The jobs that keep a warehouse's tables healthy, each change an ordinary commit of `tables`."""

    def __init__(self, core: ServiceCore, tables: Tables, consumers: Consumers) -> None:
        """`consumers`: the tables' consumers, whose unread snapshots expiry keeps."""
        self.core = core
        self.tables = tables
        self.consumers = consumers
        # Set in a server: where the jobs that read and write data files run (never in a process
        # that serves requests). Unset (an embedded catalog, a job's own process): here.
        self.job_processes: JobProcesses | None = None

    def run(
        self,
        ident: Identifier,
        jobs: Sequence[str],
        now_ms: int | None = None,
        here: bool = False,
        context: RequestContext = ANONYMOUS,
    ) -> list[JobReport]:
        """Run `jobs` (of catalog.maintenance.JOBS) on the table now, in order; what each did.
        `here`: in this process even if data-file jobs have a process of their own; `context`:
        who asked (the commits of jobs run in this process are theirs)."""
        unknown = [job for job in jobs if job not in JOBS]
        if unknown:
            raise UnknownJobError(
                f"Unknown maintenance job {unknown[0]!r}: this catalog runs {', '.join(JOBS)}"
            )
        when = now_ms if now_ms is not None else int(time.time() * 1000)
        # A job plans from the table as it is: one that another process (a job's, killed) committed
        # last must not be planned around.
        self.core.store.catch_up()
        run: dict[str, Callable[[ConfinedIO], JobReport]] = {
            EXPIRE_SNAPSHOTS: lambda io: self._expire_snapshots(ident, when, io, context),
            REMOVE_METADATA_FILES: lambda io: self._remove_metadata_files(ident, io),
            REWRITE_MANIFESTS: lambda io: self._rewrite_manifests(ident, io, context),
            COMPACT_DATA_FILES: lambda io: self._compact_data_files(ident, io, context),
            REMOVE_ORPHAN_FILES: lambda io: self._remove_orphan_files(ident, when, io),
        }
        elsewhere = self.job_processes if not here else None
        return [
            elsewhere.run(self.core.name, ident, job, when)
            if elsewhere is not None and job in REWRITING_JOBS
            else self._confined(ident, job, run[job])
            for job in jobs
        ]

    def _confined(self, ident: Identifier, job: str, run: Callable[[ConfinedIO], JobReport]) -> JobReport:
        """Run `job` reaching the table's files only through its confined FileIO. A path of the
        table's metadata that is not the table's stops the job before it is opened: the report
        names it, and the maintainer counts it and marks the table degraded."""
        io = self.core.places.confined_io(self.tables.load(ident).metadata)
        try:
            report = run(io)
        except ForeignPathError:
            report = JobReport(job)
        if io.foreign:
            report.foreign_paths = list(dict.fromkeys(io.foreign))
            report.problems.append(
                f"the table's metadata names {len(report.foreign_paths)} file(s) outside the table, "
                f"first {report.foreign_paths[0]}: none of them was read, written or deleted"
            )
            log.error("%s on %s met files outside the table: %s", job, ident, report.foreign_paths[:5])
        return report

    def _expire_snapshots(
        self, ident: Identifier, now_ms: int, io: ConfinedIO, context: RequestContext
    ) -> JobReport:
        report = JobReport(EXPIRE_SNAPSHOTS)
        for _ in range(MAX_COMMIT_ATTEMPTS):
            before = self.tables.load(ident)
            held = self.consumers.held(ident, now_ms)
            plan = plan_expiry(before.metadata, now_ms, held)
            if not plan:
                report.nothing_to_do = "no snapshot or ref is past the table's retention (history.expire.*)"
                return report
            requirements: list[TableRequirement] = [AssertTableUUID(uuid=before.metadata.table_uuid)]
            requirements += [
                AssertRefSnapshotId(ref=name, snapshot_id=at) for name, at in plan.branches.items()
            ]
            updates: list[TableUpdate] = [RemoveSnapshotRefUpdate(ref_name=name) for name in plan.refs]
            if plan.snapshot_ids:
                updates.append(RemoveSnapshotsUpdate(snapshot_ids=list(plan.snapshot_ids)))
            rules = expiring(plan, now_ms, held)
            change = TableChange(
                ident, tuple(requirements), tuple(updates), job=EXPIRE_SNAPSHOTS, validate=rules
            )
            try:
                after = self.tables.commit(change, context=context)
            except CommitFailedException:
                continue  # a commit moved a branch meanwhile: it wins, and the plan is made again
            except ConflictError as conflict:  # a ref made meanwhile keeps what the plan removes
                log.info("expiry of %s planned again: %s", ident, conflict)
                continue
            report.committed = True
            report.removed_snapshots = len(plan.snapshot_ids)
            report.removed_refs = list(plan.refs)
            self._delete_unreachable(report, before, after, io)
            return report
        raise CommitFailedException(f"Gave up expiring snapshots after {MAX_COMMIT_ATTEMPTS} lost races")

    def _delete_unreachable(
        self, report: JobReport, before: TableState, after: TableState, io: ConfinedIO
    ) -> None:
        """The expiry is durable: delete what only the expired snapshots named."""
        try:
            found = unreachable_files(io, before.metadata, after.metadata)
        except Exception as exc:  # an unreadable manifest: delete nothing rather than guess
            report.problems.append(f"cannot list the expired snapshots' files: {type(exc).__name__}: {exc}")
            return
        self._delete(report, after.metadata, found)

    def _delete(self, report: JobReport, metadata: TableMetadata, named: list[tuple[str, str]]) -> None:
        done = delete_each(self.core.places.files_of(metadata, owner=str(metadata.table_uuid)), named)
        report.deleted_files += done.deleted
        report.skipped_files += done.skipped
        report.problems += done.problems

    def _remove_metadata_files(self, ident: Identifier, io: ConfinedIO) -> JobReport:
        """With `write.metadata.delete-after-commit.enabled`, delete the metadata files older than
        every version the table still lists (the commits keep `write.metadata.previous-versions-max`
        of them in its metadata log)."""
        report = JobReport(REMOVE_METADATA_FILES)
        state = self.tables.load(ident)
        assert state.metadata_location is not None
        if state.metadata.properties.get(DELETE_AFTER_COMMIT, "false").lower() != "true":
            report.nothing_to_do = f"the table's {DELETE_AFTER_COMMIT} is not true"
            return report
        directory = state.metadata_location.rsplit("/", 1)[0]
        if local_path(directory) is None:
            report.problems.append(f"listing {directory} is not supported: only local warehouses are cleaned")
            return report
        try:
            names = io.names_in(directory)
        except OSError as exc:
            report.problems.append(f"cannot list {directory}: {exc}")
            return report
        old = superseded_metadata(names, state.metadata, state.metadata_location)
        self._delete(report, state.metadata, [(f"{directory}/{name}", "metadata") for name in old])
        return report

    def _remove_orphan_files(self, ident: Identifier, now_ms: int, io: ConfinedIO) -> JobReport:
        """Delete the files under the table's places that none of its metadata reaches and that are
        older than `isbre.maintenance.orphan-files.min-age-ms` (a younger one may be a commit's
        under way). Nothing is deleted if any manifest cannot be read. The places are listed
        through handles: a folder of the table swapped for a link is not entered."""
        report = JobReport(REMOVE_ORPHAN_FILES)
        state = self.tables.load(ident)
        assert state.metadata_location is not None
        listed: list[tuple[str, float]] = []
        for place in places_of(state.metadata.location, state.metadata.properties):
            if local_path(place) is None:
                report.problems.append(f"listing {place} is not supported: only local warehouses are cleaned")
                return report
            try:
                listed += io.files(place)
            except FileNotFoundError:
                continue  # nothing written there yet
        try:
            referenced = referenced_files(io, state.metadata, state.metadata_location)
        except Exception as exc:  # an unreadable manifest: what it names is unknown, so delete nothing
            report.problems.append(f"cannot list the table's files: {type(exc).__name__}: {exc}")
            return report
        found = orphans(listed, referenced, now_ms, orphan_min_age_ms(state.metadata.properties))
        self._delete(report, state.metadata, found)
        return report

    def _compact_data_files(self, ident: Identifier, io: ConfinedIO, context: RequestContext) -> JobReport:
        """Rewrite groups of small data files (catalog/compaction.py) as files of the target size,
        in one `replace` snapshot. The new files are written once; if a commit lands meanwhile,
        the snapshot is made again on top of it (an append always wins and is kept), checked
        against every snapshot committed since the files were read (catalog/conflicts.py): a group
        one of whose files went meanwhile, or that a delete committed since applies to, is
        abandoned (the report says so, its new files are deleted) and the others are committed.
        The replaced files stay until expiry removes the snapshots that read them."""
        report = JobReport(COMPACT_DATA_FILES)
        state = self.tables.load(ident)
        try:
            live = live_data_files(io, state.metadata)
        except NotCompactedError as exc:
            report.problems.append(str(exc))
            return report
        groups = plan_compaction(live.files, state.metadata.properties)
        if not groups:
            most = most_small_files(live.files, state.metadata.properties)
            report.nothing_to_do = (
                f"no partition holds {MIN_INPUT_FILES} = {min_input_files(state.metadata.properties)} "
                f"small data files (the most: {most})"
            )
            return report
        for data_file in (f for group in groups for f in group):  # all of them before any is read
            io.check(data_file.file_path)
            for delete_file in live.deletes.get(data_file.file_path, ()):
                io.check(delete_file.file_path)
        self.core.limits.check_room(self.core.local_warehouse)  # the same reserve of free disk as commits
        try:
            rewritten = [
                (group, self._rewritten(state.metadata, read_group(state.metadata, group, io, live), io))
                for group in groups
            ]
        except BaseException:
            # A full disk, a file gone: nothing references what was written, so it goes now.
            self._delete(report, state.metadata, [(path, "partial new data file") for path in io.written])
            raise
        starting = state.metadata.snapshot_by_id(live.snapshot_id or 0)
        assert starting is not None, "the snapshot the files were read at"
        while rewritten:
            removed = [data_file for group, _ in rewritten for data_file in group]
            added = [data_file for _, new in rewritten for data_file in new]
            try:
                commit_rewrite(
                    self.tables.commits,
                    ident,
                    state,
                    COMPACT_DATA_FILES,
                    replacing(ident, io, starting, removed, added),
                    io,
                    context,
                )
            except ConflictError as conflict:
                # Iceberg's rules refuse these groups on the head (catalog/conflicts.py): their rows
                # stay in the files they were in, and the rest of the job goes on without them.
                hit = [each for each in rewritten if not conflict.files or _touches(each[0], conflict.files)]
                report.abandoned.append(
                    f"{sum(len(group) for group, _ in hit)} file(s) left as they were: {conflict}"
                )
                unused = [(f.file_path, "unused new data file") for _, new in hit for f in new]
                self._delete(report, state.metadata, unused)
                rewritten = [each for each in rewritten if each not in hit]
                continue
            except CommitFailedException:
                self._delete(report, state.metadata, [(f.file_path, "unused new data file") for f in added])
                raise
            report.committed = True
            report.rewritten_files = len(removed)
            report.added_files = len(added)
            report.rewritten_bytes = sum(f.file_size_in_bytes for f in removed)
            break
        return report

    def _rewrite_manifests(self, ident: Identifier, io: ConfinedIO, context: RequestContext) -> JobReport:
        """Merge the current snapshot's manifests into as few as `commit.manifest.target-size-bytes`
        allows (8 MiB by default), in one `replace` snapshot: a scan plans over fewer files. Tables
        appended to one manifest a commit (PyIceberg's and Spark's fast appends) need it; a sink
        with manifest merging on does it as it appends."""
        report = JobReport(REWRITE_MANIFESTS)
        state = self.tables.load(ident)
        current = state.metadata.current_snapshot()
        version = state.metadata.format_version
        before = read_manifests(io, current.manifest_list, version) if current is not None else []
        if len(before) < 2:
            report.nothing_to_do = f"the current snapshot has {len(before)} manifest(s): nothing to merge"
            return report
        for manifest in before:  # all of them before any is read
            io.check(manifest.manifest_path)

        after = commit_rewrite(
            self.tables.commits, ident, state, REWRITE_MANIFESTS, merging(ident, io), io, context
        )
        if after is None:
            report.nothing_to_do = (
                "the manifests are merged as far as commit.manifest.target-size-bytes allows"
            )
            return report
        made = after.metadata.current_snapshot()
        assert made is not None
        listed = read_manifests(io, made.manifest_list, version)
        written = {m.manifest_path for m in listed if m.added_snapshot_id == made.snapshot_id}
        kept = {m.manifest_path for m in listed} - written
        report.committed = True
        report.rewritten_files = sum(m.manifest_path not in kept for m in before)
        report.added_files = len(written)
        report.rewritten_bytes = sum(m.manifest_length for m in before if m.manifest_path not in kept)
        return report

    def _rewritten(self, metadata: TableMetadata, rows: pa.Table, io: FileIO) -> list[DataFile]:
        # A method of its own: the step between reading and committing, where tests meddle.
        return write_rows(metadata, rows, io)


def _touches(group: list[DataFile], files: frozenset[str]) -> bool:
    return any(data_file.file_path in files for data_file in group)
