"""How the embedded store lays its state out in LMDB: the databases, how keys and values are
encoded, and the whole store read back as typed entries."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator

import isbre.catalog.store_entries as store_entries
import lmdb
from isbre.catalog.coverage import Range, SpanKey
from isbre.catalog.pending_files import PendingFile
from isbre.catalog.pointers import Pointer
from isbre.catalog.records import CommitRecord
from isbre.catalog.sink_rows import SinkRows

FORMAT_VERSION = b"1"
DATABASES = (
    "meta",
    "namespaces",
    "tables",
    "views",
    "commit_log",
    "coverage",
    "sink_rows",
    "cursors",
    "idempotency",
    "idempotency_by_time",
    "locations",
    "pending_files",
)
# A warehouse's own databases; the other ones (the log, locations, idempotency, …) are the store's.
# The first warehouse uses the unprefixed names, so a store made before warehouses had names still
# opens; another warehouse `w` has `w/namespaces`, `w/tables` and `w/views`.
PER_WAREHOUSE = ("namespaces", "tables", "views")
SEQ = struct.Struct(">Q")
HIGH_WATER = b"commit_seq"
RANGE = struct.Struct(">QQ")


SNAPSHOT = struct.Struct(">q")
# The locations database maps a normalized location to its owner's uuid, and `OWNER + uuid` back to
# the location (a location, being a URI, never starts with NUL).
OWNER = b"\x00"


# A table's coverage keys: `<uuid>\0S<source>\0<topic>\0<partition><start><end>` for ranges (the range
# lives in the key, so merging rewrites keys only) and `<uuid>\0C<snapshot id>` -> commit_seq for the
# commits that declared spans. NUL cannot occur in a uuid, a source id or a topic (spans are checked).
def ranges_prefix(table_uuid: str) -> bytes:
    return table_uuid.encode() + b"\x00S"


def stream_prefix(table_uuid: str, key: SpanKey) -> bytes:
    parts = (key.source_id.encode(), key.topic.encode(), SEQ.pack(key.partition))
    return ranges_prefix(table_uuid) + b"\x00".join(parts)


def commit_key(table_uuid: str, snapshot_id: int) -> bytes:
    return table_uuid.encode() + b"\x00C" + SNAPSHOT.pack(snapshot_id)


def stream_key(raw: bytes) -> tuple[SpanKey, Range]:
    _, marked_source_id, topic, rest = raw.split(b"\x00", 3)
    key = SpanKey(marked_source_id[1:].decode(), topic.decode(), SEQ.unpack(rest[: SEQ.size])[0])
    return key, RANGE.unpack(rest[SEQ.size :])


def pending_key(location: str) -> bytes:
    """A kept metadata file's key: its location's digest (a location may be longer than LMDB's
    largest key; the location itself is in the value)."""
    return hashlib.sha256(location.encode()).digest()


def pending_value(pending: PendingFile) -> bytes:
    # NUL-separated: no location or uuid holds NUL; the file's bytes come last, whatever they hold.
    return b"\x00".join((pending.location.encode(), pending.owner.encode(), pending.data))


def pending_file(value: bytes) -> PendingFile:
    location, owner, data = value.split(b"\x00", 2)
    return PendingFile(location.decode(), owner.decode(), data)


def as_bytes(value: bytes | memoryview) -> bytes:
    """What lmdb hands out: bytes, as the store never reads with buffers=True (lmdb's types also
    allow the memoryview that reading with buffers gives)."""
    assert isinstance(value, bytes)
    return value


def keys_after(cursor: lmdb.Cursor, prefix: bytes, after: bytes | None) -> Iterator[tuple[bytes, bytes]]:
    """Items whose key starts with `prefix`, strictly after `prefix + after`."""
    start = prefix + after if after is not None else prefix
    if not cursor.set_range(start):
        return
    for key, value in cursor:
        if not as_bytes(key).startswith(prefix):
            return
        if after is not None and key == start:
            continue
        yield as_bytes(key), as_bytes(value)


def index_idempotency_by_time(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> None:
    """Stores made before keys were indexed by time: index the keys they hold, once."""
    marker = b"marker:idempotency-by-time"
    if txn.get(marker, db=dbs["meta"]) is not None:
        return
    with txn.cursor(db=dbs["idempotency"]) as cursor:
        for key, value in cursor:
            txn.put(
                SEQ.pack(json.loads(as_bytes(value)).get("ts", 0)) + key, b"", db=dbs["idempotency_by_time"]
            )
    txn.put(marker, b"", db=dbs["meta"])


def export_entries(
    env: lmdb.Environment, dbs: dict[str, lmdb._Database], scopes: list[str]
) -> Iterator[store_entries.Entry]:
    """Everything the store holds, read in one snapshot, as typed entries (`Store.export`)."""
    with env.begin() as txn:
        for scope in scopes:
            for name in PER_WAREHOUSE:
                db = env.open_db(f"{scope}/{name}".removeprefix("/").encode(), txn=txn, create=False)
                for key, value in txn.cursor(db=db):
                    if name == "namespaces":
                        yield store_entries.NamespaceEntry(scope, as_bytes(key), json.loads(value))
                    else:
                        pointer = Pointer.from_json(as_bytes(value))
                        yield store_entries.PointerEntry(
                            scope, name.removesuffix("s"), as_bytes(key), pointer
                        )
        for _, value in txn.cursor(db=dbs["commit_log"]):
            yield store_entries.RecordEntry(CommitRecord.from_json(as_bytes(value)))
        high = txn.get(HIGH_WATER, db=dbs["meta"])
        yield store_entries.HighWaterEntry(0 if high is None else SEQ.unpack(high)[0])
        for key in txn.cursor(db=dbs["meta"]).iternext(values=False):
            if key.startswith(b"marker:"):
                yield store_entries.MarkerEntry(as_bytes(key).removeprefix(b"marker:").decode())
        for key, value in txn.cursor(db=dbs["cursors"]):
            yield store_entries.CursorEntry(as_bytes(key).decode(), SEQ.unpack(value)[0])
        for key, value in txn.cursor(db=dbs["idempotency"]):
            yield store_entries.IdempotencyEntry(as_bytes(key).decode(), json.loads(value))
        for key, value in txn.cursor(db=dbs["locations"]):
            if not key.startswith(OWNER):
                yield store_entries.LocationEntry(as_bytes(value).decode(), as_bytes(key).decode())
        for key, value in txn.cursor(db=dbs["coverage"]):
            table_uuid, kind = as_bytes(key).split(b"\x00", 1)
            if kind.startswith(b"C"):
                snapshot = SNAPSHOT.unpack(kind[1:])[0]
                yield store_entries.CoverageCommitEntry(table_uuid.decode(), snapshot, SEQ.unpack(value)[0])
            else:
                stream, (start, end) = stream_key(as_bytes(key))
                yield store_entries.CoverageEntry(table_uuid.decode(), stream, start, end)
        for key, value in txn.cursor(db=dbs["sink_rows"]):
            yield store_entries.SinkRowsEntry(SinkRows.from_json(as_bytes(key).decode(), as_bytes(value)))
        for value in txn.cursor(db=dbs["pending_files"]).iternext(keys=False):
            yield store_entries.PendingFileEntry(pending_file(as_bytes(value)))
