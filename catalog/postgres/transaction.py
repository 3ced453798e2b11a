"""A write transaction's rows, buffered until it commits (or a savepoint is undone) and then sent in
few statements."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from sqlalchemy import (
    Connection,
    Table,
    and_,
    bindparam,
    delete,
)
from sqlalchemy.dialects.postgresql import insert

MISSING: Any = object()


@dataclass
class _Frame:
    """A savepoint: where the transaction's buffer and log stood when it began, and whether a
    SAVEPOINT was sent for it (only once something inside it had to reach the database)."""

    name: str
    ops: int
    undo: int
    appended: int
    sent: bool = False


@dataclass
class Transaction:
    """A write transaction's buffer, shared by its views.

    Writes by key (pointers, namespaces, log records, idempotency keys, cursors, …) wait in
    `ops` and are answered from `overlay` until they are sent, together, in a few statements:
    before any statement that could see them (a listing, a range), and at commit. A mutation of a
    batch thus costs only its reads, and its savepoint costs nothing unless something inside it
    reached the database (a SAVEPOINT is then sent first). A lookup by key that misses the overlay
    goes to the database without sending the buffer: no buffered write touches that key.
    """

    high_water: int | None = None
    appended: list[int] = field(default_factory=list)
    ops: list[tuple[Table, dict[str, Any], bool]] = field(default_factory=list)  # (table, row, delete)
    sent: int = 0
    overlay: dict[tuple[Any, ...], dict[str, Any] | None] = field(default_factory=dict)
    undo: list[tuple[tuple[Any, ...], Any]] = field(default_factory=list)
    frames: list[_Frame] = field(default_factory=list)

    @staticmethod
    def _key(table: Table, row: dict[str, Any]) -> tuple[Any, ...]:
        return (table.name, *(row[column.name] for column in table.primary_key.columns))

    def buffer(self, table: Table, row: dict[str, Any], delete: bool = False) -> None:
        key = self._key(table, row)
        self.undo.append((key, self.overlay.get(key, MISSING)))
        self.overlay[key] = None if delete else row
        self.ops.append((table, row, delete))

    def overlaid(self, table: Table, *key: Any) -> tuple[bool, dict[str, Any] | None]:
        found = self.overlay.get((table.name, *key), MISSING)
        return (False, None) if found is MISSING else (True, found)

    def flush(self, db: Connection) -> None:
        for frame in self.frames:
            if not frame.sent:
                self._send(db, frame.ops)  # what came before the savepoint goes before it
                db.exec_driver_sql(f"SAVEPOINT {frame.name}")
                frame.sent = True
        self._send(db, len(self.ops))

    def _send(self, db: Connection, until: int) -> None:
        pending, self.sent = self.ops[self.sent : until], max(self.sent, until)
        by_table: dict[Table, list[tuple[dict[str, Any], bool]]] = {}
        for table, row, deleting in pending:  # tables are independent: only each one's order matters
            by_table.setdefault(table, []).append((row, deleting))
        for table, changes in by_table.items():
            for deleting, run in groupby(changes, key=lambda change: change[1]):
                # Within a run of upserts (or deletes) of one table, the last write of a key wins.
                rows = list({self._key(table, row): row for row, _ in run}.values())
                db.execute(_delete_by_key(table) if deleting else _upsert_by_key(table), rows)

    @contextmanager
    def savepoint(self, db: Connection) -> Iterator[None]:
        frame = _Frame(f"isbre_{len(self.frames)}", len(self.ops), len(self.undo), len(self.appended))
        self.frames.append(frame)
        try:
            yield
        except BaseException:
            self.frames.pop()
            for key, previous in reversed(self.undo[frame.undo :]):
                if previous is MISSING:
                    del self.overlay[key]
                else:
                    self.overlay[key] = previous
            del self.undo[frame.undo :], self.ops[frame.ops :], self.appended[frame.appended :]
            self.sent = min(self.sent, frame.ops)
            if frame.sent:
                db.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {frame.name}")
                db.exec_driver_sql(f"RELEASE SAVEPOINT {frame.name}")
            raise
        self.frames.pop()
        if frame.sent:
            db.exec_driver_sql(f"RELEASE SAVEPOINT {frame.name}")


@functools.cache
def _upsert_by_key(table: Table) -> Any:
    statement = insert(table)
    keys = [column.name for column in table.primary_key.columns]
    changed = {c.name: statement.excluded[c.name] for c in table.columns if c.name not in keys}
    if not changed:
        return statement.on_conflict_do_nothing(index_elements=keys)
    return statement.on_conflict_do_update(index_elements=keys, set_=changed)


@functools.cache
def _delete_by_key(table: Table) -> Any:
    return delete(table).where(
        and_(*(column == bindparam(column.name) for column in table.primary_key.columns))
    )
