"""Reading a plan's file scan tasks with their files' deletes, equality deletes included.

PyIceberg 0.12 applies position deletes and deletion vectors, and refuses equality deletes; a table
an upsert sink writes holds them. They are applied here as the spec says: a row is deleted when its
values of the delete file's columns equal those of one of its rows, a null equal to a null.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog.rest.scan_planning import RESTDeleteFile, RESTEqualityDeleteFile, RESTFileScanTask
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.table import FileScanTask, Table

FIELD_ID = b"PARQUET:field_id"


def read_tasks(
    table: Table,
    tasks: Sequence[RESTFileScanTask],
    delete_files: Sequence[RESTDeleteFile],
) -> pa.Table:
    """The rows of `tasks`, each data file read with the delete files it references, in the
    table's current schema."""
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    plain: list[FileScanTask] = []
    parts: list[pa.Table] = []
    for task in tasks:
        references = task.delete_file_references or []
        equality = [
            delete_files[i] for i in references if isinstance(delete_files[i], RESTEqualityDeleteFile)
        ]
        if not equality:
            plain.append(FileScanTask.from_rest_response(task, list(delete_files)))
            continue
        positional = [i for i in references if not isinstance(delete_files[i], RESTEqualityDeleteFile)]
        only = task.model_copy(update={"delete_file_references": positional or None})
        rows = scan.to_table([FileScanTask.from_rest_response(only, list(delete_files))])
        for delete_file in equality:
            assert isinstance(delete_file, RESTEqualityDeleteFile)
            rows = _without(rows, _deleted_keys(table, delete_file))
        parts.append(rows)
    # Even without tasks: an empty table of the columns the scan reads (not quite the schema's
    # own Arrow form: strings are large ones).
    return pa.concat_tables([scan.to_table(plain), *parts], promote_options="permissive")


def _deleted_keys(table: Table, delete_file: RESTEqualityDeleteFile) -> pa.Table:
    """The equality delete file's rows, its columns named as the table names their fields now."""
    with table.io.new_input(delete_file.file_path).open() as stream:
        found = pq.read_table(stream)
    schema = table.schema()
    columns, names = [], []
    for number, field in enumerate(found.schema):
        field_id = int((field.metadata or {}).get(FIELD_ID, b"-1"))
        if field_id in (delete_file.equality_ids or []):
            columns.append(found.column(number))
            names.append(schema.find_column_name(field_id))
    if len(names) != len(delete_file.equality_ids or []) or None in names:
        raise ValueError(f"{delete_file.file_path}: its columns are not the fields its equality ids name")
    return pa.Table.from_arrays(columns, names=names)


def _without(rows: pa.Table, keys: pa.Table) -> pa.Table:
    """`rows` less those whose values of `keys`' columns equal one of its rows (null equals null)."""
    if not rows.num_rows or not keys.num_rows:
        return rows
    if keys.num_columns == 1:
        name = keys.column_names[0]
        deleted = keys.column(0).cast(rows.schema.field(name).type)
        matched = pc.is_in(rows[name], value_set=pa.concat_arrays(deleted.chunks), skip_nulls=False)
        return rows.filter(pc.invert(matched))
    gone = set(zip(*(keys[name].to_pylist() for name in keys.column_names), strict=True))
    kept = [
        found not in gone
        for found in zip(*(rows[name].to_pylist() for name in keys.column_names), strict=True)
    ]
    return rows.filter(pa.array(kept, pa.bool_()))
