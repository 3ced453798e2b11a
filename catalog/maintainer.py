"""The catalog's own maintenance, run after commits on a thread of its own: the request path never
waits for it.

It follows the commit log (every process's commits, not only this one's), so among the processes
of one store the one holding the store's maintenance lease does the work: one worker of a
server, one replica of a PostgreSQL store. After a commit to a table whose
`isbre.maintenance.enabled` is true, it runs what the table's policies make due
(catalog/maintenance.py), each job an ordinary commit (catalog/maintenance_operations.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from isbre.catalog.compaction import min_input_files
from isbre.catalog.confined_io import ForeignPathError
from isbre.catalog.identifiers import Identifier
from isbre.catalog.maintenance import (
    COMPACT_DATA_FILES,
    EXPIRE_SNAPSHOTS,
    REMOVE_METADATA_FILES,
    REMOVE_ORPHAN_FILES,
    REWRITE_MANIFESTS,
    JobReport,
    compaction_due,
    data_file_totals,
    plan_expiry,
)
from isbre.catalog.maintenance_policy import (
    DELETE_AFTER_COMMIT,
    enabled,
    min_count_to_merge,
    orphan_interval_ms,
)
from isbre.catalog.manifest_lists import read_manifests
from isbre.catalog.records import TABLE_KINDS
from isbre.catalog.request_context import ANONYMOUS, RequestContext
from isbre.catalog.store import Lease
from pyiceberg.exceptions import NoSuchTableError

if TYPE_CHECKING:
    from isbre.catalog.service import CatalogService

log = logging.getLogger(__name__)
LEASE = "maintenance"
# A table whose jobs failed this many times in a row turns /health degraded.
FAILING_AFTER = 3
# Tables the catalog maintains are looked at again without a commit, every this many intervals of
# the maintenance thread: a quiet table's snapshots age past its policy too. At most WATCHED are
# remembered (those committed to last).
RECHECK_INTERVALS = 10
WATCHED = 10_000


@dataclass
class MaintenanceStats:
    jobs: Counter[tuple[str, str]] = field(default_factory=Counter)  # (job, "ok" or "failed")
    snapshots_removed: int = 0
    files_deleted: int = 0
    last_run_at: float | None = None
    last_runs: dict[str, float] = field(default_factory=dict)  # table -> when its jobs last ran
    # Tables' jobs ("<table> <job>") whose last runs failed: how many times in a row, the last error.
    failing: dict[str, tuple[int, str]] = field(default_factory=dict)
    files_rewritten: int = 0
    bytes_rewritten: int = 0
    # Per table, how many data files it had when compaction last looked: it looks again once
    # `min-input-files` more have been added, not at every commit.
    compaction_seen: dict[str, int] = field(default_factory=dict)
    # Per table, when remove-orphan-files last ran here, or when this process first saw a commit
    # to it: it runs again after a commit once `orphan-files.interval-ms` has passed.
    orphans_looked: dict[str, float] = field(default_factory=dict)
    # Paths outside their tables that jobs met (and left alone); per table's job, what its last run
    # met: the table is degraded until a run of that job meets none.
    foreign_paths: int = 0
    confined: dict[str, str] = field(default_factory=dict)
    # Commits of jobs that Iceberg's conflict rules refused on the head (catalog/conflicts.py), by job.
    abandoned: Counter[str] = field(default_factory=Counter)

    def forget(self, table: str) -> None:
        """A dropped (or renamed) table's state: nothing of it is due or degraded any more."""
        for kept in (self.last_runs, self.compaction_seen, self.orphans_looked):
            kept.pop(table, None)
        for jobs in (self.failing, self.confined):
            for key in [key for key in jobs if key.rsplit(" ", 1)[0] == table]:
                del jobs[key]

    def degraded(self) -> list[str]:
        failing = [
            f"{table}: {error}" for table, (times, error) in self.failing.items() if times >= FAILING_AFTER
        ]
        return failing + [f"{table}: {said}" for table, said in self.confined.items()]


class Maintainer:
    def __init__(self, services: list[CatalogService], interval: float = 1.0) -> None:
        self._services = {service.name: service for service in services}
        self._first = services[0]
        self._log = self._first.core.commit_log
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="isbre-maintenance", daemon=True)
        self.stats = MaintenanceStats()
        self.holding = False  # this process holds the lease: it is the one that maintains
        # The maintained tables this process saw a commit to, and when it last looked at each.
        self._watched: OrderedDict[tuple[str, Identifier], float] = OrderedDict()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        lease: Lease | None = None
        cursor = 0
        while not self._stop.is_set():
            try:
                if lease is None or not lease.held():
                    lease = self._log.store.try_lease(LEASE)
                    self.holding = lease is not None
                    cursor = self._log.commit_seq()  # from now on: a table is due at its next commit
                else:
                    cursor = self._follow(cursor)
                    self._recheck()
            except Exception as exc:  # e.g. a database store that is down: try again later
                log.warning("maintenance: %s: %s", type(exc).__name__, exc)
            self._stop.wait(self._interval)
        if lease is not None:
            lease.release()

    def _follow(self, cursor: int) -> int:
        records = self._log.commits_since(cursor, 1000)
        due: dict[tuple[str, Identifier], None] = {}
        for record in records:
            warehouse = record.warehouse or self._first.name
            if record.kind == "table.drop" and record.name is not None:
                self._forget(warehouse, Identifier.of(tuple(record.namespace), record.name))
            elif record.kind == "table.rename" and record.previous:
                previous = record.previous
                self._forget(warehouse, Identifier.of(tuple(previous["namespace"]), previous["name"]))
            # The jobs' own commits make nothing due.
            if record.kind in TABLE_KINDS and record.job is None and record.name is not None:
                due[(warehouse, Identifier.of(tuple(record.namespace), record.name))] = None
        for warehouse, ident in due:
            if self._stop.is_set():
                break
            if (service := self._services.get(warehouse)) is not None:
                self.run_due(service, ident)
        return records[-1].commit_seq if records else cursor

    def _forget(self, warehouse: str, ident: Identifier) -> None:
        self.stats.forget(f"{warehouse}.{ident}")
        self._watched.pop((warehouse, ident), None)

    def _recheck(self) -> None:
        """Run what time alone makes due (snapshots aging past the policy, the orphan interval) on
        the maintained tables not looked at for RECHECK_INTERVALS intervals: commits make the rest
        due."""
        now = time.monotonic()
        for (warehouse, ident), looked in list(self._watched.items()):
            if self._stop.is_set():
                return
            service = self._services.get(warehouse)
            if now - looked >= RECHECK_INTERVALS * self._interval and service is not None:
                self.run_due(service, ident, after_commit=False)

    def run_due(
        self, service: CatalogService, ident: Identifier, after_commit: bool = True
    ) -> list[JobReport]:
        """Run what the table's policies make due now, if it is maintained by the catalog; on every
        table, remove the metadata files its `write.metadata.delete-after-commit.enabled` lets go,
        as Iceberg's own catalogs do after a commit. `after_commit`: a commit to the table made it
        worth a look (else only time did, and only what time makes due is looked at)."""
        key = (service.name, ident)
        try:
            metadata = service.tables.load(ident).metadata
        except NoSuchTableError:
            self._watched.pop(key, None)
            return []  # dropped since
        cleans = metadata.properties.get(DELETE_AFTER_COMMIT, "false").lower() == "true"
        if not enabled(metadata.properties):
            self._watched.pop(key, None)
            return self._run_each(service, ident, [REMOVE_METADATA_FILES]) if cleans and after_commit else []
        self._watched[key] = time.monotonic()
        self._watched.move_to_end(key)
        while len(self._watched) > WATCHED:
            self._watched.popitem(last=False)
        jobs = []
        now_ms = int(time.time() * 1000)
        if plan_expiry(metadata, now_ms, service.consumers.held(ident, now_ms)):
            jobs.append(EXPIRE_SNAPSHOTS)
        if cleans and (after_commit or jobs):
            jobs.append(REMOVE_METADATA_FILES)
        table = f"{service.name}.{ident}"
        files, size = data_file_totals(metadata)
        if after_commit:
            current = metadata.current_snapshot()
            # One read of the manifest list, if it is the table's: a table appended to a manifest a
            # commit needs merging (one whose list is elsewhere is left to the job, which says so).
            try:
                io = service.core.places.confined_io(metadata)
                listed = read_manifests(io, current.manifest_list, metadata.format_version) if current else []
                manifests = len(listed)
            except ForeignPathError:
                manifests = min_count_to_merge(metadata.properties)
            if manifests >= min_count_to_merge(metadata.properties):
                jobs.append(REWRITE_MANIFESTS)
            new_files = files - self.stats.compaction_seen.get(table, 0)
            if compaction_due(metadata.properties, files, size) and new_files >= min_input_files(
                metadata.properties
            ):
                # Late: it takes longest, and the others need not wait for it.
                jobs.append(COMPACT_DATA_FILES)
        now = time.time()
        looked = self.stats.orphans_looked.setdefault(table, now)
        if (now - looked) * 1000 >= orphan_interval_ms(metadata.properties):
            jobs.append(REMOVE_ORPHAN_FILES)  # after compaction: it reads every manifest kept
            self.stats.orphans_looked[table] = now  # done or failed, due again an interval later
        reports = self._run_each(service, ident, jobs)
        if COMPACT_DATA_FILES in jobs:  # done or failed, looked at again after more files
            compacted = next((r for r in reports if r.job == COMPACT_DATA_FILES), None)
            self.stats.compaction_seen[table] = (
                files - compacted.rewritten_files + compacted.added_files if compacted else files
            )
        return reports

    def _run_each(self, service: CatalogService, ident: Identifier, jobs: list[str]) -> list[JobReport]:
        reports = []
        for job in jobs:  # one failing job does not keep the others from running
            try:
                reports += self.run(service, ident, [job])
            except Exception:
                continue  # counted and logged; tried again at the table's next commit
        return reports

    def run(
        self, service: CatalogService, ident: Identifier, jobs: list[str], context: RequestContext = ANONYMOUS
    ) -> list[JobReport]:
        """Run `jobs` now and count what they did (the maintenance endpoint calls this too, for
        the caller `context` names)."""
        table = f"{service.name}.{ident}"
        self.stats.last_run_at = time.time()
        try:
            reports = service.maintenance.run(ident, jobs, context=context)
        except Exception as exc:
            for job in jobs:
                times = self.stats.failing.get(f"{table} {job}", (0, ""))[0] + 1
                self.stats.failing[f"{table} {job}"] = (times, f"{type(exc).__name__}: {exc}")
            self.stats.jobs.update((job, "failed") for job in jobs)
            log.warning("maintenance of %s (%s) failed: %s", table, ", ".join(jobs), exc)
            raise
        for job in jobs:
            self.stats.failing.pop(f"{table} {job}", None)
        self.stats.last_runs[table] = self.stats.last_run_at
        for report in reports:
            self.stats.jobs[(report.job, "failed" if report.problems else "ok")] += 1
            self.stats.snapshots_removed += report.removed_snapshots
            self.stats.files_deleted += report.deleted_files
            self.stats.files_rewritten += report.rewritten_files
            self.stats.bytes_rewritten += report.rewritten_bytes
            self.stats.foreign_paths += len(report.foreign_paths)
            self.stats.abandoned[report.job] += len(report.abandoned)
            if report.foreign_paths:
                self.stats.confined[f"{table} {report.job}"] = report.problems[-1]
            else:
                self.stats.confined.pop(f"{table} {report.job}", None)
            if report.problems:
                log.warning("maintenance of %s: %s left problems: %s", table, report.job, report.problems[:3])
        return reports
