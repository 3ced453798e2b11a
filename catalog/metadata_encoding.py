"""Table metadata as JSON, in time that grows with what a commit changed rather than with history.

A commit rewrites the whole metadata file, and most of it is the table's snapshots and snapshot
log; PyIceberg serializes each snapshot's summary in Python (about 7 µs a snapshot). Snapshots and
log entries are immutable and shared from one version of a table's metadata to the next
(catalog/metadata_updates.py never copies them), so each one's JSON is kept for as long as the
object lives, and a file is assembled from the rest of the metadata, serialized whole, with the
kept pieces in place of its two empty lists. The bytes are exactly PyIceberg's own serialization
(tests/test_metadata_encoding.py compares them after every kind of update).
"""

from __future__ import annotations

import weakref

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import IcebergBaseModel

# id() of a live snapshot or log entry -> its JSON. An entry is removed by a weak reference's
# callback while its object is being freed, before the id can name another object.
_pieces: dict[int, bytes] = {}
_references: dict[int, weakref.ref[IcebergBaseModel]] = {}
# The lists spliced in, by field name and by the key their empty form is written as.
_LISTS = (("snapshots", b'"snapshots":[]'), ("snapshot_log", b'"snapshot-log":[]'))


def _forget(key: int) -> None:
    _pieces.pop(key, None)
    _references.pop(key, None)


def piece_json(model: IcebergBaseModel) -> bytes:
    """`model`'s JSON, kept while it lives."""
    key = id(model)
    data = _pieces.get(key)
    if data is None:
        data = model.model_dump_json(exclude_none=True).encode()
        _references[key] = weakref.ref(model, lambda _, key=key: _forget(key))  # type: ignore[misc]
        _pieces[key] = data
    return data


def _joined(items: list[IcebergBaseModel]) -> bytes:
    found = list(map(_pieces.get, map(id, items)))
    missing = found.count(None)
    for index in range(len(items) - 1, -1, -1):  # what a commit adds is at the end
        if not missing:
            break
        if found[index] is None:
            found[index] = piece_json(items[index])
            missing -= 1
    return b",".join(found)  # type: ignore[arg-type]  # no None is left


def table_metadata_json(metadata: TableMetadata) -> bytes:
    # exclude_none drops "current-snapshot-id": null, as PyIceberg and the Java library write it
    emptied: dict[str, list[IcebergBaseModel]] = {
        field: [] for field, _ in _LISTS if getattr(metadata, field)
    }
    if not emptied:
        return metadata.model_dump_json(exclude_none=True).encode()
    frame = metadata.model_copy(update=emptied).model_dump_json(exclude_none=True).encode()
    parts: list[bytes] = []
    rest = frame
    for field, empty in _LISTS:
        if field in emptied:
            # The first occurrence is the key: the fields before it (location, schemas, specs,
            # properties...) hold that spelling only inside strings, where JSON escapes its quotes.
            before, _, rest = rest.partition(empty)
            parts += (before, empty[:-1], _joined(getattr(metadata, field)), b"]")
    parts.append(rest)
    return b"".join(parts)
