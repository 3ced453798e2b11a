"""The event fan-out process on its own, as the server starts it: a channel with connections
handed over on it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from isbre.catalog.stores import helper_environment
from isbre.events.fanout import FanoutOptions, StreamRequest

from tests.server import free_port

OPTIONS = FanoutOptions(retry_ms=3000, keepalive_seconds=15, ring_size=100, ring_bytes=1 << 20)


def test_a_process_that_cannot_start_answers_the_connections_handed_to_it_503() -> None:
    """Its store cannot be reached as it starts (the database is down, as when it is restarted
    during an outage): the streams already handed over are answered 503 before it exits, as the
    server answers while its store is down, never closed without an answer."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    wake_read, wake_write = os.pipe()
    unreachable = f"postgresql+psycopg://isbre@127.0.0.1:{free_port()}/isbre"  # nothing listens there
    command = [sys.executable, "-m", "isbre.events.fanout_process", f"--wake-fd={wake_read}"]
    command += [f"--channel-fd={theirs.fileno()}", *OPTIONS.arguments()]
    process = subprocess.Popen(
        command, pass_fds=(wake_read, theirs.fileno()), env=helper_environment(unreachable)
    )
    os.close(wake_read)
    theirs.close()
    subscribers = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        for _ in range(3):  # handed over while the process is still importing
            subscriber = socket.create_connection(listener.getsockname())
            accepted, _ = listener.accept()
            socket.send_fds(ours, [StreamRequest(cursor=0).encode()], [accepted.fileno()])
            accepted.close()
            subscribers.append(subscriber)
    try:
        assert process.wait(timeout=60) != 0  # it could not start: the server restarts it
        for subscriber in subscribers:
            subscriber.settimeout(30)
            answer = b"".join(iter(lambda s=subscriber: s.recv(1 << 16), b""))
            assert answer.startswith(b"HTTP/1.1 503 "), answer
            assert b"ServiceUnavailableException" in answer
    finally:
        process.kill()
        process.wait()
        for subscriber in subscribers:
            subscriber.close()
        ours.close()
        os.close(wake_write)
