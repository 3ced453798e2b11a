"""A table's named consumers: how far each has read the table's commits (a commit cursor, as plans
from a cursor take it), kept in the store as durably as a commit, moved only by compare-and-set.

A consumer's cursor lives under the table's uuid, so a rename keeps it and a drop ends it. It holds
no record of the commit log back (a consumer reads the table, not the log).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from isbre.catalog.commit_log import TABLE_CONSUMERS
from isbre.catalog.identifiers import Identifier, check_consumer_name
from isbre.catalog.maintenance_policy import consumer_bounds
from isbre.catalog.plans import ExpiredCommitsError, PlanRequest, Plans
from isbre.catalog.request_context import ANONYMOUS, RequestContext
from isbre.catalog.service_core import TABLE, ServiceCore, require_object
from isbre.catalog.writer import Batch
from pyiceberg.table.snapshots import Operation

log = logging.getLogger(__name__)


class NoSuchConsumerError(LookupError):
    pass


class ConsumerMovedError(Exception):
    """The cursor is not where the caller expected it: another instance of the consumer moved it."""


@dataclass(frozen=True)
class Consumer:
    name: str
    commit_seq: int
    behind_commits: int  # commits to the table after the cursor that added snapshots
    behind_rows: int  # rows their appends added
    expired: str | None = None  # why its plans answer 410, when they do

    def to_json(self) -> dict[str, object]:
        found: dict[str, object] = {
            "name": self.name,
            "commit-seq": self.commit_seq,
            "behind": {"commits": self.behind_commits, "rows": self.behind_rows},
            "expired": self.expired is not None,
        }
        if self.expired is not None:
            found["message"] = self.expired
        return found


class Consumers:
    def __init__(self, core: ServiceCore, plans: Plans) -> None:
        self.core = core
        self.plans = plans

    def get(self, ident: Identifier, consumer: str) -> Consumer:
        table_uuid, cursors = self._cursors(ident)
        found = cursors.get(_key(table_uuid, check_consumer_name(consumer)))
        if found is None:
            raise NoSuchConsumerError(f"Table {ident} has no consumer named {consumer!r}")
        return self._state(ident, consumer, found)

    def listing(self, ident: Identifier) -> list[Consumer]:
        table_uuid, cursors = self._cursors(ident)
        prefix = _key(table_uuid, "")
        return [
            self._state(ident, name.removeprefix(prefix), seq)
            for name, seq in sorted(cursors.items())
            if name.startswith(prefix)
        ]

    def advance(
        self,
        ident: Identifier,
        consumer: str,
        commit_seq: int,
        expected: int | None,
        context: RequestContext = ANONYMOUS,
    ) -> Consumer:
        """Move the cursor to `commit_seq` if it is at `expected` (None: if there is none yet);
        ConsumerMovedError otherwise."""
        check_consumer_name(consumer)

        def mutation(batch: Batch) -> None:
            if commit_seq < 0 or commit_seq > batch.view.commit_seq():
                raise ValueError(
                    f"Commit {commit_seq} is not in the log (its last is {batch.view.commit_seq()})"
                )
            key = _key(require_object(batch.view, TABLE, ident).uuid, consumer)
            current = batch.view.cursors().get(key)
            if current != expected:
                raise ConsumerMovedError(
                    f"Consumer {consumer!r} of {ident} is at {_where(current)}, not at {_where(expected)}: "
                    "another instance moved it"
                )
            batch.view.put_cursor(key, commit_seq)

        self.core.run(mutation, [(TABLE, ident)], context)
        return self._state(ident, consumer, commit_seq)

    def delete(self, ident: Identifier, consumer: str, context: RequestContext = ANONYMOUS) -> None:
        check_consumer_name(consumer)

        def mutation(batch: Batch) -> None:
            key = _key(require_object(batch.view, TABLE, ident).uuid, consumer)
            if key not in batch.view.cursors():
                raise NoSuchConsumerError(f"Table {ident} has no consumer named {consumer!r}")
            batch.view.delete_cursor(key)

        self.core.run(mutation, [(TABLE, ident)], context)

    def held(self, ident: Identifier, now_ms: int) -> frozenset[int]:
        """The snapshots the table's consumers have yet to read, which expiry keeps: those of each
        consumer within the table's bounds (`isbre.consumers.max-lag-ms`, `.max-snapshots`). One
        past them is left behind, saying so in the log; its plans then answer 410."""
        table_uuid, cursors = self._cursors(ident)
        prefix = _key(table_uuid, "")
        found: set[int] = set()
        mine = {name: seq for name, seq in cursors.items() if name.startswith(prefix)}
        if not mine:
            return frozenset()
        max_lag_ms, max_snapshots = consumer_bounds(self.plans.properties(ident))
        for name, commit_seq in mine.items():
            unread = self.plans.since(ident, commit_seq)
            oldest = unread[-1][0].timestamp_ms if unread else now_ms
            if len(unread) > max_snapshots or now_ms - oldest > max_lag_ms:
                log.warning(
                    "consumer %r of %s is %d snapshots and %d ms behind, past the table's bounds "
                    "(isbre.consumers.*): expiry no longer keeps its snapshots",
                    name.removeprefix(prefix),
                    ident,
                    len(unread),
                    now_ms - oldest,
                )
                continue
            found.update(snapshot.snapshot_id for snapshot, _ in unread)
        return frozenset(found)

    def _cursors(self, ident: Identifier) -> tuple[str, dict[str, int]]:
        with self.core.store.read(self.core.scope) as view:
            return require_object(view, TABLE, ident).uuid, view.cursors()

    def _state(self, ident: Identifier, consumer: str, commit_seq: int) -> Consumer:
        try:
            self.plans.resolve(ident, PlanRequest(after_commit_seq=commit_seq))
            expired = None
        except ExpiredCommitsError as exc:
            expired = str(exc)
        resolved = self.plans.since(ident, commit_seq)
        appended = sum(
            int(s.summary.additional_properties.get("added-records", "0"))
            for s, _ in resolved
            if s.summary is not None and s.summary.operation == Operation.APPEND
        )
        return Consumer(consumer, commit_seq, len({seq for _, seq in resolved}), appended, expired)


def _key(table_uuid: str, consumer: str) -> str:
    return f"{TABLE_CONSUMERS}{table_uuid}:{consumer}"


def _where(commit_seq: int | None) -> str:
    return "no commit yet" if commit_seq is None else f"commit {commit_seq}"
