"""A TCP proxy in front of PostgreSQL that can lose the answer to a COMMIT: the COMMIT reaches the
database (which commits), and its answer never reaches the client, whose connection drops. While
`refusing` is set, new connections are refused, as by a database that is gone."""

from __future__ import annotations

import contextlib
import socket
import threading

# How a COMMIT statement ends in either of PostgreSQL's query protocols (a NUL-terminated string).
_COMMIT = b"COMMIT\x00"


class CommitDroppingProxy:
    def __init__(self, upstream_port: int) -> None:
        self._upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.drop_next_commit = threading.Event()
        self.refusing = threading.Event()
        self.dropped = 0
        self._closed = False

    def __enter__(self) -> CommitDroppingProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing.is_set():
                client.close()
                continue
            server = socket.create_connection(self._upstream)
            committed = threading.Event()  # this connection's COMMIT went through: drop its answer
            threading.Thread(target=self._to_server, args=(client, server, committed), daemon=True).start()
            threading.Thread(target=self._to_client, args=(server, client, committed), daemon=True).start()

    def _to_server(self, client: socket.socket, server: socket.socket, committed: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                server.sendall(data)
                if _COMMIT in data and self.drop_next_commit.is_set():
                    self.drop_next_commit.clear()
                    self.dropped += 1
                    committed.set()
                    return

    def _to_client(self, server: socket.socket, client: socket.socket, committed: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if committed.is_set():
                    break  # the database answered the COMMIT: the client never hears of it
                client.sendall(data)
        for each in (client, server):
            with contextlib.suppress(OSError):
                each.shutdown(socket.SHUT_RDWR)
            each.close()
