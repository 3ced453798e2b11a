"""The commit log as its readers see it: the events streams, the lineage outbox and retention.

It needs a store and the writer that commits to it, not a catalog service: a process that only
follows the log (the events fan-out) opens one with `CommitLog.follow`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from isbre.catalog.records import CommitRecord, now_us
from isbre.catalog.store import Store
from isbre.catalog.writer import Batch, Writer

# Expired Idempotency-Keys removed per writer transaction: each step holds the writer well under 10 ms.
TRIM_CHUNK = 500


# The durable cursors of a table's named consumers (catalog/consumers.py) are kept beside the log's
# own, under this prefix.
TABLE_CONSUMERS = "table-consumer:"


class CommitLog:
    def __init__(self, store: Store, writer: Writer, owns_writer: bool = False) -> None:
        """`owns_writer`: `close` stops the writer and closes the store (for `follow`)."""
        self.store = store
        self.writer = writer
        self._owns_writer = owns_writer

    @classmethod
    def follow(cls, location: str | Path) -> CommitLog:
        """The log of the store at `location` (see `catalog.stores`), for a process that serves no
        warehouse's tables."""
        from isbre.catalog.stores import open_store

        store = open_store(location, migrate=False)
        return cls(store, Writer(store), owns_writer=True)

    def close(self) -> None:
        if self._owns_writer:
            self.writer.close()
            self.store.close()

    def commit_seq(self) -> int:
        with self.store.read(snapshot=False) as view:
            return view.commit_seq()

    def records(self, after: int = 0) -> Iterator[CommitRecord]:
        return self.store.scan_log(after)

    def commits_since(self, after: int, limit: int = 1000) -> list[CommitRecord]:
        """Up to `limit` records with `commit_seq > after`, in order."""
        with self.store.read() as view:
            return view.records(after, limit)

    def log_bounds(self) -> tuple[int, int]:
        """(lowest retained commit_seq, highest commit_seq); a cursor is valid from floor - 1 to high."""
        with self.store.read() as view:
            return view.log_floor(), view.commit_seq()

    def cursor_before(self, ts_us: int) -> int:
        """The cursor just before the first retained record at or after `ts_us`.

        Record timestamps never decrease, so this is a binary search over commit_seq.
        """
        with self.store.read() as view:
            low, high = view.log_floor(), view.commit_seq() + 1
            while low < high:
                middle = (low + high) // 2
                (record,) = view.records(middle - 1, 1)
                if record.ts < ts_us:
                    low = middle + 1
                else:
                    high = middle
        return low - 1

    def cursors(self) -> dict[str, int]:
        """Every durable cursor, by name."""
        with self.store.read() as view:
            return view.cursors()

    def consumer_cursor(self, name: str) -> int | None:
        return self.cursors().get(name)

    def set_consumer_cursor(self, name: str, commit_seq: int) -> None:
        """Record a consumer's durable position; the log keeps every record after it."""

        def mutation(batch: Batch) -> None:
            batch.view.put_cursor(name, commit_seq)

        self.writer.execute(mutation)

    def trim_log(self, keep_records: int, keep_us: int, chunk: int = 1000) -> int:
        """Drop records beyond the retention window, in small writer batches; returns how many went.

        Records a consumer with a durable cursor has not yet handled are kept, whatever their age.
        """

        def mutation(batch: Batch) -> int:
            high = batch.view.commit_seq()
            # A table's consumers read the table, not the log: an idle one holds no record back.
            held = (seq for name, seq in batch.view.cursors().items() if not name.startswith(TABLE_CONSUMERS))
            ceiling = min([high, *held])
            return batch.view.trim_log(high - keep_records, now_us() - keep_us, ceiling, chunk)

        return self._in_chunks(mutation, chunk)

    def trim_idempotency(self, keep_us: int, chunk: int = TRIM_CHUNK) -> int:
        """Forget the answers kept for retried requests (Idempotency-Key) older than `keep_us`."""

        def mutation(batch: Batch) -> int:
            return batch.view.trim_idempotency(now_us() - keep_us, chunk)

        return self._in_chunks(mutation, chunk)

    def _in_chunks(self, step: Callable[[Batch], int], chunk: int) -> int:
        removed = 0
        while True:
            done = self.writer.execute(step)
            removed += done
            if done < chunk:
                return removed
