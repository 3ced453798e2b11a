"""The lineage outbox: a consumer of the commit log with its own durable cursor.

It reads records after its cursor, maps each run to RunEvents and sends them
through an openlineage-python transport. A failed send is retried with capped
exponential backoff, for as long as it takes: events are delayed, never
dropped, and commits never wait for them (the writer only sets a flag). The
cursor advances in LMDB after each delivered chunk, so after a restart the
outbox resumes where it stopped; a chunk in flight at a crash is sent again,
and receivers deduplicate by the stable runId (delivery is at least once).
"""

from __future__ import annotations

import logging
import threading
import time

from isbre.catalog.commit_log import CommitLog
from isbre.catalog.records import CommitRecord
from isbre.catalog.store import StoreUnavailableError
from isbre.catalog.writer import WriterOverloadedError
from isbre.lineage.mapping import LineageMapper, group_runs
from isbre.lineage.status import CURSOR, OutboxStatus, start_from_now
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import RunEvent

log = logging.getLogger(__name__)


class _Stopping(Exception):
    pass


class LineageOutbox:
    def __init__(
        self,
        commit_log: CommitLog,
        client: OpenLineageClient,
        mapper: LineageMapper,
        chunk: int = 200,
        max_backoff: float = 30.0,
        idle_wait: float = 1.0,
    ) -> None:
        self._log = commit_log
        self._client = client
        self._mapper = mapper
        self._chunk = chunk
        self._max_backoff = max_backoff
        self._idle_wait = idle_wait
        self._wake = threading.Event()
        self._stopping = threading.Event()
        start_from_now(commit_log)
        self.status = OutboxStatus(delivered_seq=commit_log.consumer_cursor(CURSOR) or 0)
        self._thread = threading.Thread(target=self._run, name="isbre-lineage-outbox", daemon=True)

    def _on_commit(self, records: list[CommitRecord]) -> None:
        self._wake.set()

    def start(self) -> None:
        self._log.writer.add_listener(self._on_commit)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout=30)
        self._log.writer.remove_listener(self._on_commit)

    def backlog(self) -> int:
        return self._log.commit_seq() - self.status.delivered_seq

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    records = self._next_chunk(self.status.delivered_seq)
                except StoreUnavailableError as exc:  # the database is down: wait for it
                    self.status.failed(exc)
                    self._stopping.wait(1.0)
                    continue
                if not records:
                    self._wake.wait(self._idle_wait)
                    self._wake.clear()
                    continue
                for run in group_runs(records):
                    for event in self._events(run):
                        self._deliver(event)
                self._advance(records[-1].commit_seq)
                self.status.delivered_seq = records[-1].commit_seq
                self.status.last_delivery_at = time.time()
        except _Stopping:
            return
        except Exception:
            log.exception(
                "the lineage outbox stopped; events after %s wait for a restart", self.status.delivered_seq
            )

    def _advance(self, commit_seq: int) -> None:
        """Move the cursor past delivered runs; while the store is down, they are only delayed."""
        delay = 0.5
        while True:
            try:
                self._log.set_consumer_cursor(CURSOR, commit_seq)
                return
            except (StoreUnavailableError, WriterOverloadedError) as exc:
                self.status.failed(exc)
                if self._stopping.wait(delay):
                    raise _Stopping from exc
                delay = min(self._max_backoff, delay * 2)

    def _next_chunk(self, cursor: int) -> list[CommitRecord]:
        records = self._log.commits_since(cursor, self._chunk)
        # Never split a transaction's records over two chunks: they form one run.
        while (
            records
            and records[-1].txn
            and sum(r.txn == records[-1].txn for r in records) < (records[-1].txn_size or 1)
        ):
            more = self._log.commits_since(records[-1].commit_seq, records[-1].txn_size or 1)
            if not more:
                break
            records += more
        return records

    def _events(self, run: list[CommitRecord]) -> list[RunEvent]:
        try:
            return self._mapper.run_events(run)
        except Exception:
            # A record isbre cannot map is a bug, not a delivery failure; one must not block all lineage.
            self.status.mapping_errors += 1
            log.exception("cannot map commit %s to OpenLineage; skipping that run", run[0].commit_seq)
            return []

    def _deliver(self, event: RunEvent) -> None:
        delay = 0.5
        while True:
            if self._stopping.is_set():
                raise _Stopping
            try:
                self._client.emit(event)
            except Exception as exc:
                self.status.failed(exc)
                log.warning("lineage delivery failed (%s); retrying in %.1fs", self.status.last_error, delay)
                self._stopping.wait(delay)
                delay = min(self._max_backoff, delay * 2)
                continue
            self.status.events_sent += 1
            return
