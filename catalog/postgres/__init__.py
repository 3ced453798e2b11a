"""The catalog's state in PostgreSQL (SQLAlchemy Core over psycopg 3), for servers on several hosts.

Same semantics as the LMDB store. Every write transaction first takes one
transaction-scoped advisory lock, so write transactions run one at a time, as
LMDB's single writer does: `commit_seq` is assigned inside the lock and becomes
visible when the lock is released at commit, so a reader that has seen N never
later finds N-1 appear. Reads run in REPEATABLE READ snapshots. Keys of
namespaces and objects are the same bytes the LMDB store uses (`bytea`, which
PostgreSQL orders bytewise), and locations use the C collation, so listings and
prefix scans order exactly as in LMDB.

A write transaction that appended to the log sends a NOTIFY on commit; servers
LISTEN on one connection each and read the log when woken (see `on_commit`).
A connection that fails raises `StoreUnavailableError`: the caller answers 503,
and the pool replaces dead connections once the database is back.
"""
