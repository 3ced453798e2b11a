"""A table as a stream of rows: everything appended to it, once, from where a named consumer left off.

`TableFeed(uri, "ns.table", consumer="billing")` keeps its position as the consumer's commit cursor
in the catalog (`commit()` stores it, compare-and-set), asks the server for a plan from that cursor,
reads the planned files with PyIceberg, and sleeps on the table's commit events in between: an idle
feed makes no request but its open event stream.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from isbre.catalog.equality_deletes import DeletedKeys
from isbre.catalog.identifiers import check_consumer_name
from isbre.catalog.pyiceberg_internals import rest_extension
from isbre.events.change_reads import FileRows, commit_rows, read_tasks
from isbre.events.change_rows import INSERT, change_schema, commit_changes, with_change
from isbre.events.client import subscribe
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.rest.scan_planning import (
    PlanCompleted,
    PlanTableScanRequest,
    RESTFileScanTask,
    ScanTasks,
)
from pyiceberg.expressions import BooleanExpression
from pyiceberg.expressions.parser import parse
from pyiceberg.expressions.visitors import bind
from pyiceberg.io.pyarrow import expression_to_pyarrow
from pyiceberg.table import Table

_TABLE = "namespaces/{namespace}/tables/{table}"
# The position of a feed that has read nothing: commits are numbered from 1.
BEFORE_ANY_COMMIT = 0
log = logging.getLogger(__name__)


class FeedError(Exception):
    """The feed cannot go on from where it is without the caller deciding how."""


class RowsRewrittenError(FeedError):
    """Commits after the cursor rewrote rows (an overwrite or a delete) and `on_rewrite` is "raise"."""


class FeedResyncError(FeedError):
    """Snapshots the feed had not read were expired: read the table whole, then start anew."""


class TableFeed:
    def __init__(
        self,
        uri: str,
        table: str,
        consumer: str | None,
        *,
        token: str | None = None,
        credential: str | None = None,
        from_start: bool = False,
        on_rewrite: Literal["raise", "skip"] = "raise",
        on_expired: Literal["raise", "resync"] = "raise",
        changes: bool = False,
        row_filter: str | BooleanExpression | None = None,
        **properties: str,
    ) -> None:
        """`table`: "namespace.table"; `consumer`: the cursor's name (a new one starts at the
        table's next commit, or with `from_start` with the table as it is; None: a feed that keeps
        no cursor); `on_rewrite`: what an overwrite or delete after the cursor does ("raise":
        RowsRewrittenError before any of its rows are returned; "skip": its appended rows are
        read, its removals ignored); `on_expired`: what a feed whose unread snapshots were
        expired does ("raise": FeedResyncError; "resync": reads the table as it is, rows it had
        read included, and follows from there); `changes`: read what each commit inserted,
        deleted and updated, each row with `_change_type` and `_commit_seq` (overwrites and
        deletes are changes: `on_rewrite` does not apply); `row_filter`: only the rows that match
        it (an expression or its text, as PyIceberg's `scan(row_filter=...)` takes; the server
        leaves out the files it rules out, and a change moving a row out of it is a delete);
        `properties`: more of PyIceberg's catalog properties (vended credentials' header, say)."""
        if on_rewrite not in ("raise", "skip"):
            raise ValueError(f"on_rewrite is 'raise' or 'skip', not {on_rewrite!r}")
        if on_expired not in ("raise", "resync"):
            raise ValueError(f"on_expired is 'raise' or 'resync', not {on_expired!r}")
        self.uri, self.table = uri.rstrip("/"), table
        self.consumer = None if consumer is None else check_consumer_name(consumer)
        self.on_rewrite, self.on_expired, self.changes = on_rewrite, on_expired, changes
        self.row_filter = parse(row_filter) if isinstance(row_filter, str) else row_filter
        # The filter as a plan request carries it.
        self._filter: dict[str, Any] = {}
        if self.row_filter is not None:
            request = PlanTableScanRequest(filter=self.row_filter).model_dump(by_alias=True, mode="json")
            self._filter["filter"] = request["filter"]
        auth = {"token": token} if token else {"credential": credential} if credential else {}
        self._catalog = RestCatalog("feed", uri=self.uri, **auth, **properties)
        self._token, self._credential = token, credential
        found = None
        if self.consumer is not None:
            found = self._call("GET", f"{_TABLE}/consumers/{self.consumer}", missing_ok=True)
        self._stored: int | None = None if found is None else int(found["commit-seq"])
        if self._stored is not None:
            self.position = self._stored
        elif from_start:
            self.position = BEFORE_ANY_COMMIT
        else:
            self.position = self._head()
        if self._stored is None and self.consumer is not None:
            # A new consumer's cursor is stored at once: from now on, expiry keeps what it has not read.
            self.commit()
        self._arrow_schema: pa.Schema | None = None
        # Files a change plan reads again at later commits (an upsert table's), kept between plans.
        self._deleted_keys: DeletedKeys | None = None
        self._file_rows = FileRows()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._stream_error: BaseException | None = None  # what ended the event stream, if anything did
        self._listener = threading.Thread(target=self._listen, name=f"feed-{table}", daemon=True)
        self._listener.start()

    def read(self, timeout: float | None = None) -> pa.Table:
        """The rows appended since the position (the cursor, or what the last `read` returned),
        as soon as there are some; an empty table when none came within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._wake.clear()  # before planning: an event that comes meanwhile wakes the wait
            rows = self._read_new()
            if rows is not None:
                return rows
            if self._stream_error is not None:
                raise FeedError(
                    f"the table's event stream ended: {self._stream_error}"
                ) from self._stream_error
            remaining = None if deadline is None else deadline - time.monotonic()
            if self._closed.is_set() or (remaining is not None and remaining <= 0):
                return self._empty()
            if not self._wake.wait(remaining) or self._closed.is_set():
                return self._empty()

    def commit(self) -> None:
        """Store the position as the consumer's cursor: what `read` returned is done."""
        if self.consumer is None:
            raise ValueError("a feed without a consumer name keeps no cursor")
        body = {"commit-seq": self.position, "expected-commit-seq": self._stored}
        self._call("PUT", f"{_TABLE}/consumers/{self.consumer}", body=body)
        self._stored = self.position

    def __iter__(self) -> Iterator[pa.Table]:
        """One table of rows per batch of commits, for as long as the feed is open."""
        while not self._closed.is_set():
            rows = self.read(timeout=1.0)
            if rows.num_rows:
                yield rows

    def close(self) -> None:
        self._closed.set()
        self._wake.set()

    def __enter__(self) -> TableFeed:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _read_new(self) -> pa.Table | None:
        """The rows of the commits after the position (None when nothing was appended since);
        the position moves past every commit looked at. Before any commit, the rows are the table
        as it is: its current snapshot, whatever expiry removed before it."""
        if self.position == BEFORE_ANY_COMMIT:
            return self._read_whole()
        body: dict[str, Any] = {"isbre-after-commit-seq": self.position, **self._filter}
        if self.changes:
            body["isbre-changes"] = True
        try:
            answer = self._call("POST", f"{_TABLE}/plan", body=body)
        except FeedResyncError as expired:
            if self.on_expired == "raise":
                raise
            log.warning(
                "%s: %s; reading %s as it is, rows read before included", self.table, expired, self.table
            )
            return self._read_whole()
        if self.changes:
            return self._changes(answer)
        if answer.get("isbre-rewrites") and self.on_rewrite == "raise":
            operations = sorted({rewrite["operation"] for rewrite in answer["isbre-rewrites"]})
            raise RowsRewrittenError(
                f"Commits to {self.table} after {self.position} rewrote rows ({', '.join(operations)}); "
                "open the feed with on_rewrite='skip' to read on past them"
            )
        return self._rows(self._pages(answer), int(answer["isbre-commit-seq"]))

    def _read_whole(self) -> pa.Table | None:
        """The table's current snapshot, read whole; the position moves to the commit that made it."""
        answer = self._call("POST", f"{_TABLE}/plan", body=dict(self._filter))
        if "isbre-commit-seq" not in answer:
            raise FeedError(
                f"{self.table}'s current snapshot was not made through this catalog's commit log "
                "(a registered table's): there is no commit to follow it from"
            )
        after = int(answer["isbre-commit-seq"])
        rows = self._rows(self._pages(answer), after)
        if rows is None or not self.changes:
            return rows
        return with_change(rows, INSERT, after)

    def _rows(self, pages: list[ScanTasks], after: int) -> pa.Table | None:
        """The rows of `pages`' tasks (None when there are none); the position moves to `after`
        either way."""
        if not any(page.file_scan_tasks for page in pages):
            self.position = after
            return None
        table = self._load()
        self._arrow_schema = table.schema().as_arrow()
        read = [read_tasks(table, page.file_scan_tasks, page.delete_files) for page in pages]
        rows = pa.concat_tables(read, promote_options="permissive")
        if self.row_filter is not None:
            rows = rows.filter(self._matches(table, rows))
        self.position = after
        return rows if rows.num_rows else None

    def _changes(self, answer: dict[str, Any]) -> pa.Table | None:
        """The changes a change plan's tasks read, commit by commit (None when there are none);
        the position moves to the commit the plan covers up to either way."""
        after = int(answer["isbre-commit-seq"])
        page = PlanCompleted.model_validate(answer)
        if not page.file_scan_tasks:
            self.position = after
            return None
        table = self._load()
        self._arrow_schema = table.schema().as_arrow()
        schema = table.schema()
        # Updates are paired by the identifier fields when they are top-level columns.
        top = {field.field_id: field.name for field in schema.fields}
        ids = schema.identifier_field_ids
        key = [top[field_id] for field_id in ids] if all(i in top for i in ids) else []
        commits: dict[int, list[tuple[RESTFileScanTask, dict[str, Any]]]] = {}
        for task, raw in zip(page.file_scan_tasks, answer["file-scan-tasks"], strict=True):
            change = raw["isbre-change"]
            commits.setdefault(int(change["commit-seq"]), []).append((task, change))
        keys = self._deleted_keys
        if keys is None or keys.schema_id != schema.schema_id:
            keys = self._deleted_keys = DeletedKeys(table.io, schema)
        keys.io = table.io
        found = []
        for commit_seq, tasks in commits.items():
            read, inserted = commit_rows(table, tasks, page.delete_files, keys, self._file_rows)
            if self.row_filter is not None:
                matching = self._matches(table, read)
                read, inserted = read.filter(matching), inserted[matching]
            found.append(commit_changes(read, inserted, commit_seq, key))
        self.position = after
        rows = pa.concat_tables(found, promote_options="permissive")
        return rows if rows.num_rows else None

    def _matches(self, table: Table, rows: pa.Table) -> np.ndarray:
        """Which of `rows` the feed's filter keeps (a task's residual is the filter less what its
        file's partition decides: the whole filter keeps the same rows); a null is no match."""
        assert self.row_filter is not None
        bound = expression_to_pyarrow(bind(table.schema(), self.row_filter, case_sensitive=True))
        found = ds.dataset(rows).to_table(columns={"matches": bound}).column("matches")
        return np.asarray(pc.fill_null(found, False).to_numpy(zero_copy_only=False), dtype=bool)

    def _pages(self, answer: dict[str, Any]) -> list[ScanTasks]:
        pages: list[ScanTasks] = [PlanCompleted.model_validate(answer)]
        pending = list(pages[0].plan_tasks)
        while pending:
            found = self._call("POST", f"{_TABLE}/tasks", body={"plan-task": pending.pop(0)})
            pages.append(ScanTasks.model_validate(found))
            pending += pages[-1].plan_tasks
        return pages

    @property
    def table_uuid(self) -> str:
        """The table's uuid (a table dropped and made again under the same name is another)."""
        return str(self._load().metadata.table_uuid)

    def _load(self) -> Table:
        return self._catalog.load_table(self.table)

    def _schema(self) -> pa.Schema:
        """The table's columns as of the last rows read (loaded once when none were)."""
        if self._arrow_schema is None:
            self._arrow_schema = self._load().schema().as_arrow()
        return self._arrow_schema

    def _empty(self) -> pa.Table:
        schema = self._schema()
        return (change_schema(schema) if self.changes else schema).empty_table()

    def _head(self) -> int:
        """The commit of the table's current snapshot (a plan that keeps no file says it without
        reading a manifest); 0 for a table without one."""
        answer = self._call("POST", f"{_TABLE}/plan", body={"filter": False})
        return int(answer.get("isbre-commit-seq", 0))

    def _call(self, method: str, endpoint: str, body: Any = None, missing_ok: bool = False) -> Any:
        response = rest_extension(self._catalog, method, endpoint, self.table, body=body)
        if response.status_code == 404 and missing_ok:
            return None
        if response.status_code == 410:
            raise FeedResyncError(response.json()["error"]["message"])
        if response.status_code >= 400:
            error = response.json().get("error", {}) if response.content else {}
            raise FeedError(
                f"{method} {endpoint}: {response.status_code} {error.get('message', response.text)}"
            )
        return response.json() if response.content else None

    def _listen(self) -> None:
        """Wake `read` on each commit to the table, for as long as the feed is open. The stream
        starts at the log's head (plans cover what came before), and each time it (re)connects
        `read` plans again, for what came while it was not connected. An error that retrying
        cannot help (refused credentials) wakes `read` to raise it."""
        events = subscribe(
            self.uri,
            tables=[self.table],
            token=self._token,
            credential=self._credential,
            on_connect=lambda _: self._wake.set(),
        )
        try:
            for _ in events:
                self._wake.set()
                if self._closed.is_set():
                    return
        except Exception as exc:
            self._stream_error = exc
            self._wake.set()
