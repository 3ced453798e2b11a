"""The catalog's tables in PostgreSQL, and the statements the hot paths run, built once."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    LargeBinary,
    MetaData,
    Table,
    Text,
    bindparam,
    func,
    select,
    tuple_,
)

# pg_advisory_xact_lock key of the one writer at a time ("isbre" in ASCII).
WRITER_LOCK = 0x6973627265
SCHEMA_VERSION = 1
# Leases are advisory locks (LEASES, crc32 of the name): a key space apart from WRITER_LOCK's.
LEASES = 0x69736272
CHANNEL = "isbre_commits"  # NOTIFY channel of committed log appends
# A connection that cannot be made, or a peer that stops answering, fails within seconds (an answer
# then is a 503, not a request hanging on a dead database).
CONNECT_ARGS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 2,
}
# No byte of UTF-8 is 0xFF: `prefix <= key < prefix + END` is "key starts with prefix".
END = b"\xff"

schema = MetaData()
meta = Table(
    "isbre_meta", schema, Column("key", Text, primary_key=True), Column("value", Text, nullable=False)
)
namespaces = Table(
    "isbre_namespaces",
    schema,
    Column("warehouse", Text, primary_key=True),
    Column("key", LargeBinary, primary_key=True),
    Column("properties", Text, nullable=False),
)
pointers = Table(
    "isbre_pointers",
    schema,
    Column("warehouse", Text, primary_key=True),
    Column("kind", Text, primary_key=True),
    Column("key", LargeBinary, primary_key=True),
    Column("pointer", Text, nullable=False),
)
log_table = Table(
    "isbre_log",
    schema,
    Column("commit_seq", BigInteger, primary_key=True, autoincrement=False),
    Column("ts", BigInteger, nullable=False),
    Column("record", LargeBinary, nullable=False),
)
cursors_table = Table(
    "isbre_cursors",
    schema,
    Column("name", Text, primary_key=True),
    Column("commit_seq", BigInteger, nullable=False),
)
idempotency = Table(
    "isbre_idempotency",
    schema,
    Column("key", Text, primary_key=True),
    Column("response", Text, nullable=False),
    Column("ts", BigInteger, nullable=False),
    Index("isbre_idempotency_by_time", "ts"),
)
locations = Table(
    "isbre_locations",
    schema,
    Column("location", Text(collation="C"), primary_key=True),
    Column("owner", Text, nullable=False, unique=True),
)
ranges = Table(
    "isbre_coverage",
    schema,
    Column("table_uuid", Text, primary_key=True),
    Column("source_id", Text, primary_key=True),
    Column("topic", Text, primary_key=True),
    Column("partition", BigInteger, primary_key=True),
    Column("start_offset", BigInteger, primary_key=True),
    Column("end_offset", BigInteger, nullable=False),
)
coverage_commits = Table(
    "isbre_coverage_commits",
    schema,
    Column("table_uuid", Text, primary_key=True),
    Column("snapshot_id", BigInteger, primary_key=True),
    Column("commit_seq", BigInteger, nullable=False),
)

sink_rows = Table(
    "isbre_sink_rows",
    schema,
    Column("table_uuid", Text, primary_key=True),
    Column("totals", Text, nullable=False),
)
pending_files = Table(
    "isbre_pending_files",
    schema,
    Column("location", Text, primary_key=True),
    Column("owner", Text, nullable=False),
    Column("data", LargeBinary, nullable=False),
)

# The hot statements, built once: SQLAlchemy then finds their compiled form at once, where a
# statement built anew for each call costs more than the database's answer to it.
WRITER_LOCK_STATEMENT = select(func.pg_advisory_xact_lock(WRITER_LOCK))
NOTIFY = select(func.pg_notify(CHANNEL, bindparam("commit_seq")))
HIGH_WATER = select(meta.c.value).where(meta.c.key == "commit_seq")
POINTER = select(pointers.c.pointer).where(
    pointers.c.warehouse == bindparam("warehouse"),
    pointers.c.kind == bindparam("kind"),
    pointers.c.key == bindparam("key"),
)
POINTERS = select(pointers.c.warehouse, pointers.c.kind, pointers.c.key, pointers.c.pointer).where(
    tuple_(pointers.c.warehouse, pointers.c.kind, pointers.c.key).in_(bindparam("keys", expanding=True))
)
NAMESPACE = select(namespaces.c.properties).where(
    namespaces.c.warehouse == bindparam("warehouse"), namespaces.c.key == bindparam("key")
)
IDEMPOTENT = select(idempotency.c.response).where(idempotency.c.key == bindparam("key"))
