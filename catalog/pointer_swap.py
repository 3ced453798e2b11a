"""A table commit's store transaction as data: the pointers to swap if none moved, and what the
catalog keeps with each (its commit record, coverage, a sink's rows, a metadata file's bytes).

It is plain data so that the process which runs it need not be the one that staged it: a
server's workers hand theirs to one committer (catalog/shared_writer.py), which puts the commits
of every worker in one transaction. Everything here is decided at staging, except what the
transaction itself must check: that each pointer is still the one it was staged on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from isbre.catalog.coverage import Span
from isbre.catalog.identifiers import Identifier
from isbre.catalog.pending_files import PendingFile
from isbre.catalog.places import Place, claim_places
from isbre.catalog.pointers import Pointer
from isbre.catalog.records import CommitRecord
from isbre.catalog.request_context import Idempotency
from isbre.catalog.service_core import TABLE, require_free, require_namespace, require_new_uuid
from isbre.catalog.sink_rows import SinkRows
from isbre.catalog.writer import Batch
from pyiceberg.exceptions import TableAlreadyExistsError


class Stale(Exception):
    """A pointer moved between staging and the swap; stage again."""


@dataclass
class SwapEntry:
    """One table's part: its pointer goes from `base` (None: the table is created) to `pointer`."""

    ident: Identifier
    base: Pointer | None
    pointer: Pointer
    # Unstamped; None where the change changed nothing (the pointer is only checked).
    record: CommitRecord | None = None
    places: tuple[Place, ...] | None = None  # claimed when the change creates the table or moves it
    added_snapshots: tuple[int, ...] = ()
    spans: tuple[Span, ...] = ()
    rows: SinkRows | None = None
    pending: PendingFile | None = None  # a metadata file left unsynced: its bytes, kept


@dataclass
class PointerSwap:
    """Every pointer of one commit swapped in one transaction, or none (`Stale` when one moved)."""

    entries: list[SwapEntry]
    idempotency: Idempotency | None = None
    answer: str | None = None  # what the request's Idempotency-Key keeps

    def __call__(self, batch: Batch) -> None:
        for entry in self.entries:
            now = batch.view.pointer(TABLE, entry.ident)
            if now != entry.base:
                if entry.base is None:  # a concurrent create of the same table won
                    raise TableAlreadyExistsError(f"Table already exists: {entry.ident}")
                raise Stale
            if entry.base is None:
                require_namespace(batch.view, entry.ident.namespace)
                require_free(batch.view, entry.ident, TABLE)
                require_new_uuid(batch.view, entry.pointer.uuid)
        for entry in self.entries:
            if entry.places is not None:
                claim_places(batch.view, entry.pointer.uuid, entry.places, "Table")
            if entry.record is not None:
                self._swapped(batch, entry, entry.record)
            if entry.pending is not None:
                batch.view.put_pending_file(entry.pending)
        if self.idempotency is not None:
            self.idempotency.keep(batch.view, self.answer)

    @staticmethod
    def _swapped(batch: Batch, entry: SwapEntry, record: CommitRecord) -> None:
        batch.view.put_pointer(TABLE, entry.ident, entry.pointer)
        # A store may run a transaction again from the start: each run stamps its own copy.
        stamped = batch.log(replace(record))
        # Which commit added each snapshot: plans from a commit cursor go by it.
        for snapshot_id in entry.added_snapshots:
            batch.view.add_coverage(entry.pointer.uuid, [], snapshot_id, stamped.commit_seq)
        if entry.spans:
            batch.view.add_coverage(entry.pointer.uuid, list(entry.spans), None, stamped.commit_seq)
        if entry.rows is not None:
            batch.view.add_sink_rows(entry.rows)
