"""One commit group for every worker process of a server.

Each worker stages its table commits itself (requirements, updates, the metadata file), in
parallel with the others, and hands the store transaction that swaps the pointers
(catalog/pointer_swap.py, plain data) to the server's supervisor process. The supervisor runs
them on its one writer, which puts every swap waiting, from any worker, in one transaction with
one sync, and answers each worker once it is durable. A worker's own writer still runs
everything else (namespaces, views, drops, its metadata files' settling): those are rare beside
table commits, and each takes LMDB's write lock as before.

The workers reach the supervisor over a Unix socket in the server's state directory, with
`multiprocessing.connection`: each message is pickled, and a connection is accepted only from a
process that proves it holds the key the supervisor handed its workers (an HMAC challenge), so
nothing else on the machine can hand it a transaction to run. A worker whose connection breaks
with commits in flight answers them as a store lost mid-commit: their outcome is asked of the
store before anything is removed (catalog/table_commit.py). The supervisor's end ends its
workers too (catalog/processes.py), so a worker never outlives its committer for long.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import threading
import time
from concurrent.futures import Future
from functools import partial
from multiprocessing.connection import Client, Connection, Listener
from multiprocessing.context import AuthenticationError
from pathlib import Path
from typing import Any, TypeVar

from isbre.catalog.store import StoreUnavailableError
from isbre.catalog.writer import Mutation, Origin, Prefetch, Writer, WriterStats

log = logging.getLogger(__name__)
T = TypeVar("T")

# In the server's state directory; a path too long for a Unix socket leaves each worker its own group.
SOCKET = "isbre-commits.sock"
SOCKET_PATH_MAX = 104
# Where the supervisor hands its workers the key (hex), with the settings.
KEY_ENV = "ISBRE_COMMITTER_KEY"
_NOWHERE = Origin()


def committer_socket(state: Path) -> Path | None:
    path = state / SOCKET
    return path if len(os.fsencode(path)) < SOCKET_PATH_MAX else None


class CommitServer:
    """The supervisor's end: runs the swaps every worker hands it on `writer`."""

    def __init__(self, writer: Writer, path: Path, key: bytes) -> None:
        path.unlink(missing_ok=True)  # a previous server's (the state directory's lock is ours)
        previous = os.umask(0o077)  # the socket is the server's user's alone
        try:
            self._listener = Listener(str(path), family="AF_UNIX", authkey=key)
        finally:
            os.umask(previous)
        self._writer = writer
        self._sources = itertools.count(1)
        self._connections: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="isbre-committer", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                connection = self._listener.accept()
            except AuthenticationError:
                log.warning("refused a connection to the committer that did not hold the server's key")
                continue
            except OSError:
                return  # closed
            with self._lock:
                self._connections.append(connection)
            source = next(self._sources)
            threading.Thread(
                target=self._serve, args=(connection, source), name=f"isbre-committer-{source}", daemon=True
            ).start()

    def _serve(self, connection: Connection, source: int) -> None:
        sending = threading.Lock()
        while True:
            try:
                number, mutation, prefetch, origin = connection.recv()
            except (EOFError, OSError):
                break  # the worker ended
            except Exception:  # not a message a worker sends: no answer can reach its sender
                log.exception("a worker's message to the committer could not be read; closing its connection")
                break
            try:
                future = self._writer.submit(mutation, prefetch, origin, source=source)
            except Exception as exc:  # the writer refused it (closed, overloaded)
                refused: Future[Any] = Future()
                refused.set_exception(exc)
                _answer(connection, sending, number, refused)
                continue
            future.add_done_callback(partial(_answer, connection, sending, number))
        with self._lock:
            if connection in self._connections:
                self._connections.remove(connection)
        connection.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()


def _answer(connection: Connection, sending: threading.Lock, number: int, done: Future[Any]) -> None:
    """Send a worker the outcome of its swap `number`: `done`."""
    error = done.exception()
    result = done.result() if error is None else None
    if error is not None:
        try:
            pickle.loads(pickle.dumps(error))
        except Exception:  # an exception that does not survive pickling is sent as its words
            error = RuntimeError(f"{type(error).__name__}: {error}")
    try:
        with sending:
            connection.send((number, result, error))
    except OSError:
        pass  # the worker ended: its commits' outcome is asked of the store there, if it is still up


class SharedWriter:
    """A worker's end: `execute` runs a swap on the supervisor's writer and answers once it is
    durable, as the worker's own writer would."""

    def __init__(self, path: Path, key: bytes, stats: WriterStats) -> None:
        self._path, self._key = path, key
        self._stats = stats  # the worker's: its latency, as seen by its requests
        self._numbers = itertools.count()
        self._pending: dict[int, Future[Any]] = {}
        self._lock = threading.Lock()
        self._connection = self._connect()

    def _connect(self) -> Connection:
        connection = Client(str(self._path), family="AF_UNIX", authkey=self._key)
        threading.Thread(
            target=self._read, args=(connection,), name="isbre-committer-answers", daemon=True
        ).start()
        return connection

    def execute(self, mutation: Mutation[T], prefetch: Prefetch = (), origin: Origin = _NOWHERE) -> T:
        started = time.perf_counter()
        future: Future[T] = Future()
        try:
            with self._lock:
                number = next(self._numbers)
                try:
                    if self._connection.closed:  # lost: the supervisor may take a new one
                        self._connection = self._connect()
                    self._pending[number] = future
                    self._connection.send((number, mutation, list(prefetch), origin))
                except (OSError, EOFError, AuthenticationError) as exc:
                    # Not sent whole: the committer cannot have run it.
                    self._pending.pop(number, None)
                    raise StoreUnavailableError(f"the server's committer cannot be reached ({exc})") from exc
            return future.result()
        finally:
            self._stats.latency.observe(time.perf_counter() - started)

    def _read(self, connection: Connection) -> None:
        while True:
            try:
                number, result, error = connection.recv()
            except Exception as exc:  # lost (or an answer that cannot be read: the same to a caller)
                self._lost(connection, str(exc) or "its connection closed")
                return
            with self._lock:
                future = self._pending.pop(number)
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    def _lost(self, connection: Connection, why: str) -> None:
        """Every commit handed over `connection` and not answered may or may not have landed."""
        with self._lock:
            connection.close()
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(StoreUnavailableError(f"the server's committer is gone ({why})", True))

    def close(self) -> None:
        self._connection.close()


def connect(state: Path, stats: WriterStats) -> SharedWriter | None:
    """The worker's end, where its supervisor runs a committer (it handed down a key)."""
    key = os.environ.get(KEY_ENV)
    path = committer_socket(state)
    if key is None or path is None:
        return None
    return SharedWriter(path, bytes.fromhex(key), stats)
