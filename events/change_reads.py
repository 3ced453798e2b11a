"""Reading a plan's file scan tasks with their files' deletes, equality deletes included.

PyIceberg 0.12 applies position deletes and deletion vectors, and refuses equality deletes; a table
an upsert sink writes holds them. They are applied here as the spec says: a row is deleted when its
values of the delete file's columns equal those of one of its rows, a null equal to a null.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from isbre.catalog.equality_deletes import DeletedKeys
from isbre.catalog.lru import Lru
from isbre.catalog.pyiceberg_internals import rows_per_task
from isbre.catalog.row_lineage import with_row_id_column
from pyiceberg.catalog.rest.scan_planning import RESTDeleteFile, RESTEqualityDeleteFile, RESTFileScanTask
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.table import FileScanTask, Table

# What the data files' rows kept by one FileRows may take in memory, Arrow's count.
KEPT_ROWS_BYTES = 64 << 20


class FileRows:
    """Data files' rows as a task reads them (position deletes applied, equality deletes not), kept
    by file, position deletes and schema: a file never changes. A change feed on a table an upsert
    sink writes reads every older data file again at each commit (its equality deletes apply to
    all of them); with these kept it reads only the commit's new files."""

    def __init__(self, capacity: int = KEPT_ROWS_BYTES) -> None:
        self._rows: Lru[tuple[int, str, tuple[str, ...], bool, int | None], pa.Table] = Lru(
            capacity, weigh=lambda t: t.nbytes
        )

    def read(
        self,
        table: Table,
        scan: ArrowScan,
        tasks: list[FileScanTask],
        first_row_ids: list[int | None] | None = None,
    ) -> list[pa.Table]:
        """The rows of each of `tasks`, read as `rows_per_task` reads them (with each row's
        `_row_id` given `first_row_ids`), those kept not read again."""
        schema_id = table.schema().schema_id
        ids = first_row_ids if first_row_ids is not None else [None] * len(tasks)
        keys = [
            (
                schema_id,
                task.file.file_path,
                tuple(sorted(d.file_path for d in task.delete_files)),
                first_row_ids is not None,
                row_id,
            )
            for task, row_id in zip(tasks, ids, strict=True)
        ]
        found: list[pa.Table | None] = [self._rows.peek(key) for key in keys]
        missing = [number for number, rows in enumerate(found) if rows is None]
        wanted = None if first_row_ids is None else [first_row_ids[n] for n in missing]
        for number, rows in zip(
            missing, rows_per_task(scan, table.io, [tasks[n] for n in missing], wanted), strict=True
        ):
            found[number] = rows
            self._rows.put(keys[number], rows)
        return [rows for rows in found if rows is not None]


def read_tasks(
    table: Table,
    tasks: Sequence[RESTFileScanTask],
    delete_files: Sequence[RESTDeleteFile],
    keys: DeletedKeys | None = None,
    kept: FileRows | None = None,
    row_ids: bool = False,
) -> pa.Table:
    """The rows of `tasks`, each data file read with the delete files it references, in the
    table's current schema (and with `row_ids`, each row's `_row_id` after it)."""
    read = read_each(table, tasks, delete_files, keys, kept, row_ids)
    return pa.concat_tables(read, promote_options="permissive")


def read_each(
    table: Table,
    tasks: Sequence[RESTFileScanTask],
    delete_files: Sequence[RESTDeleteFile],
    keys: DeletedKeys | None = None,
    kept: FileRows | None = None,
    row_ids: bool = False,
) -> list[pa.Table]:
    """The rows of each of `tasks` (at least one table, empty when there are none), read in one
    pass over the files (in parallel, by PyIceberg's reader, position deletes applied), then each
    task's equality deletes applied to its rows; `keys` keeps equality delete files' rows between
    calls, `kept` the data files' rows. With `row_ids` (a format v3 table), each row's `_row_id`
    after the table's columns."""
    keys = DeletedKeys(table.io, table.schema()) if keys is None else keys
    schema = with_row_id_column(table.schema()) if row_ids else table.schema()
    scan = ArrowScan(table.metadata, table.io, schema, AlwaysTrue())
    first_row_ids = [task.data_file.first_row_id for task in tasks] if row_ids else None
    equalities: list[list[RESTDeleteFile]] = []
    scan_tasks = []
    for task in tasks:
        references = task.delete_file_references or []
        equality = [i for i in references if isinstance(delete_files[i], RESTEqualityDeleteFile)]
        if equality:
            positional = [i for i in references if i not in equality]
            task = task.model_copy(update={"delete_file_references": positional or None})
        equalities.append([delete_files[i] for i in equality])
        scan_tasks.append(FileScanTask.from_rest_response(task, list(delete_files)))
    read = (
        kept.read(table, scan, scan_tasks, first_row_ids)
        if kept is not None
        else rows_per_task(scan, table.io, scan_tasks, first_row_ids)
    )
    found = [
        rows.filter(pa.array(~_any_matched(rows, equality, keys))) if equality else rows
        for rows, equality in zip(read, equalities, strict=True)
    ]
    # Even without tasks: an empty table of the columns the scan reads (not quite the schema's
    # own Arrow form: strings are large ones).
    return found or [scan.to_table([])]


def _any_matched(rows: pa.Table, equality: Sequence[RESTDeleteFile], keys: DeletedKeys) -> np.ndarray:
    """Which of `rows` one of the equality delete files `equality` deletes."""
    files = []
    for delete_file in equality:
        assert isinstance(delete_file, RESTEqualityDeleteFile)
        files.append((delete_file.file_path, delete_file.equality_ids or []))
    return keys.matched(rows, files)


def commit_rows(
    table: Table,
    tasks: Sequence[tuple[RESTFileScanTask, dict[str, Any]]],
    delete_files: Sequence[RESTDeleteFile],
    keys: DeletedKeys | None = None,
    kept: FileRows | None = None,
) -> tuple[pa.Table, np.ndarray]:
    """The rows one commit's change tasks (each with its `isbre-change`) read, and which of them
    were inserted (the others deleted). A file whose deletes changed is read with its deletes from
    before and from after, both; where the commit only added equality deletes to it (an upsert's),
    it is read once, and the rows they match are the deleted ones. On a format v3 table each row
    has its `_row_id` after the table's columns."""
    keys = DeletedKeys(table.io, table.schema()) if keys is None else keys
    row_ids = table.metadata.format_version >= 3
    deleted: list[RESTFileScanTask] = []
    inserted: list[RESTFileScanTask] = []
    upserted: list[tuple[RESTFileScanTask, tuple[int, ...]]] = []  # read before, and the deletes added
    for task, change in tasks:
        if change["type"] == "added-rows":
            inserted.append(task)
            continue
        if change["type"] == "deleted-data-file":  # its rows as they were, its own deletes applied
            deleted.append(task)
            continue
        before = list(change.get("existing-delete-file-references") or [])
        earlier = task.model_copy(update={"delete_file_references": before or None})
        after = task.delete_file_references or []
        added = tuple(i for i in after if i not in before)
        if set(before) <= set(after) and all(
            isinstance(delete_files[i], RESTEqualityDeleteFile) for i in added
        ):
            upserted.append((earlier, added))
            continue
        deleted.append(earlier)
        inserted.append(task)
    parts = [read_tasks(table, deleted, delete_files, keys, kept, row_ids)]
    if upserted:
        read = read_each(table, [task for task, _ in upserted], delete_files, keys, kept, row_ids)
        for rows, (_, added) in zip(read, upserted, strict=True):
            hit = _any_matched(rows, [delete_files[i] for i in added], keys)
            parts.append(rows.filter(pa.array(hit)))
    parts.append(read_tasks(table, inserted, delete_files, keys, kept, row_ids))
    rows = pa.concat_tables(parts, promote_options="permissive")
    flags = np.zeros(rows.num_rows, dtype=bool)
    flags[rows.num_rows - parts[-1].num_rows :] = True
    return rows, flags
