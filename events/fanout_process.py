"""The event fan-out process: `python -m events.fanout_process`, started and stopped by `isbre serve`.

It receives connections from the server over a Unix socket (each with the
request the server already validated), follows the commit log in the shared
LMDB file when the server's pipe says something was committed, and writes
each stream as a chunked `text/event-stream` response. It reports its number
of open streams back over the same socket, and exits when the server closes
it: the process never outlives the server.

With several workers (`--listen PATH`), one such process serves them all: each
worker connects its own channel to the socket at PATH, the process follows the
store's high-water itself (every worker's commits), and it exits when the
supervisor that started it has gone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import resource
import signal
import socket
from collections.abc import Callable
from pathlib import Path

from isbre.catalog.commit_log import CommitLog
from isbre.catalog.feed import CommitFeed
from isbre.catalog.processes import add_server_pid, die_with_parent
from isbre.catalog.store import StoreUnavailableError
from isbre.catalog.stores import helper_store
from isbre.events.broadcast import Broadcaster
from isbre.events.fanout import StreamRequest, until_expiry
from isbre.events.frames import PING_FRAME, STREAM_HEADERS, expired_frame, retry_frame, token_expired_frame
from isbre.events.subscription import CursorExpiredError, follow

log = logging.getLogger("isbre.events.fanout_process")  # by name: the module runs as __main__

SHUTDOWN_GRACE_S = 2.0
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
_HEAD += b"".join(b"%s: %s\r\n" % (k.lower().encode(), v.encode()) for k, v in STREAM_HEADERS.items())
_HEAD += b"transfer-encoding: chunked\r\n\r\n"
_LAST_CHUNK = b"0\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class FanoutServer:
    def __init__(self, commit_log: CommitLog, args: argparse.Namespace) -> None:
        self.commit_log = commit_log
        self.broadcaster = Broadcaster(commit_log, capacity=args.ring_size, max_bytes=args.ring_bytes)
        self.broadcaster.close()  # nothing commits in this process: the pipe says when to look
        self.retry_ms = args.retry_ms
        self.keepalive = args.keepalive_seconds
        self.wake_fd = args.wake_fd
        self.channel_fd = args.channel_fd
        self.listen: Path | None = args.listen
        self.channels: set[socket.socket] = set()
        self.shutdown = asyncio.Event()
        self.streams: dict[asyncio.Task[None], tuple[asyncio.Event, socket.socket]] = {}

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.shutdown.set)
        if self.listen is None:
            os.set_blocking(self.wake_fd, False)
            loop.add_reader(self.wake_fd, self._on_wake)
            self._add_channel(socket.socket(fileno=self.channel_fd))
            await self.shutdown.wait()
        else:
            await self._serve_workers(loop)
        for channel in list(self.channels):
            loop.remove_reader(channel)
        for ended, _ in self.streams.values():
            ended.set()
        if self.streams:
            _, late = await asyncio.wait(self.streams, timeout=SHUTDOWN_GRACE_S)
            for task in late:
                task.cancel()

    async def _serve_workers(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.listen is not None
        with contextlib.suppress(FileNotFoundError):
            self.listen.unlink()  # left by a process that died
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Created 0600 from the start: only this user's processes may hand streams over.
        umask = os.umask(0o177)
        try:
            listener.bind(str(self.listen))
        finally:
            os.umask(umask)
        listener.listen()
        listener.setblocking(False)
        loop.add_reader(listener, lambda: self._add_channel(listener.accept()[0]))
        feed = CommitFeed(self.commit_log)

        def wake() -> None:  # on the feed's thread
            loop.call_soon_threadsafe(self._on_commit)

        feed.follow(wake)
        feed.start()
        supervisor = os.getppid()
        try:
            while not self.shutdown.is_set() and os.getppid() == supervisor:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.shutdown.wait(), 0.5)
        finally:
            feed.close()
            loop.remove_reader(listener)
            listener.close()

    def _add_channel(self, channel: socket.socket) -> None:
        channel.setblocking(False)
        self.channels.add(channel)
        asyncio.get_running_loop().add_reader(channel, self._on_connection, channel)

    def _on_commit(self) -> None:
        if self.streams:  # with none, reading the log is left to the next stream's start
            self.broadcaster.publish_from_log()

    def _on_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # raised once the pipe is empty
            while True:
                if not os.read(self.wake_fd, 4096):  # the server closed its end: it has gone
                    asyncio.get_running_loop().remove_reader(self.wake_fd)
                    self.shutdown.set()
                    return
        self._on_commit()

    def _on_connection(self, channel: socket.socket) -> None:
        try:
            message, fds, _, _ = socket.recv_fds(channel, 1 << 16, 1)
        except BlockingIOError:
            return
        except OSError:
            message, fds = b"", []
        if not message:  # the server (or with several workers, one worker) has gone
            asyncio.get_running_loop().remove_reader(channel)
            self.channels.discard(channel)
            channel.close()
            if self.listen is None:
                self.shutdown.set()
            return
        if not fds:  # the kernel could not give this process another descriptor
            log.error("out of file descriptors: a subscriber was disconnected (raise `ulimit -n`)")
            return
        connection = socket.socket(fileno=fds[0])
        try:
            self._catch_up()
        except StoreUnavailableError as exc:
            _refuse_unavailable(connection, exc)
            return
        ended = asyncio.Event()
        task = asyncio.get_running_loop().create_task(
            self._stream(connection, StreamRequest.decode(message), ended)
        )
        self.streams[task] = (ended, channel)
        task.add_done_callback(self._forget)
        self._report(channel)

    def _catch_up(self) -> None:
        """Read what the log gained. After the database came back, the first query can meet a
        connection that died with it: that one is tried again on a fresh connection."""
        try:
            self.broadcaster.publish_from_log()
        except StoreUnavailableError:
            self.broadcaster.publish_from_log()

    def _forget(self, task: asyncio.Task[None]) -> None:
        _, channel = self.streams.pop(task, (None, None))
        if channel is not None:
            self._report(channel)

    def _report(self, channel: socket.socket) -> None:
        """The number of open streams `channel`'s server handed over."""
        count = sum(1 for _, owner in self.streams.values() if owner is channel)
        with contextlib.suppress(OSError):  # full or closed: the next report corrects the count
            channel.send(b"%d" % count)

    async def _stream(self, connection: socket.socket, request: StreamRequest, ended: asyncio.Event) -> None:
        reader, writer = await asyncio.open_connection(sock=connection)
        gone = asyncio.Event()

        async def watch_client() -> None:
            # A subscriber sends nothing after its request: end of input means it left.
            with contextlib.suppress(OSError):
                while await reader.read(1 << 12):
                    pass
            gone.set()
            ended.set()

        async def keep_alive() -> None:
            while True:
                await asyncio.sleep(self.keepalive)
                writer.write(_chunk(PING_FRAME))

        helpers: list[asyncio.Future[None] | asyncio.TimerHandle] = [
            asyncio.ensure_future(watch_client()),
            asyncio.ensure_future(keep_alive()),
        ]
        expired = asyncio.Event()

        def expire() -> None:
            expired.set()
            ended.set()

        if (delay := until_expiry(request.expires_at)) is not None:
            helpers.append(asyncio.get_running_loop().call_later(delay, expire))
        try:
            writer.write(_HEAD + _chunk(retry_frame(self.retry_ms)))
            try:
                async for entries in follow(
                    self.broadcaster, self.commit_log, request.cursor, request.event_filter(), ended
                ):
                    writer.write(_chunk(b"".join(entry.frame for entry in entries)))
                    await writer.drain()
            except CursorExpiredError as exc:
                writer.write(_chunk(expired_frame(exc)))
            except StoreUnavailableError:
                log.warning(
                    "a stream ended: the store cannot be reached (its client resumes from its cursor)"
                )
            if expired.is_set() and not gone.is_set():
                writer.write(_chunk(token_expired_frame()))
            if not gone.is_set():
                writer.write(_LAST_CHUNK)
                await writer.drain()
        except OSError:
            pass  # the subscriber went away mid-write
        finally:
            for helper in helpers:
                helper.cancel()
            writer.close()


def _refuse_unavailable(connection: socket.socket, exc: StoreUnavailableError) -> None:
    """Answer a handed-over connection 503, as the server answers any request while its store is down."""
    body = json.dumps({"error": {"message": str(exc), "type": "ServiceUnavailableException", "code": 503}})
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        connection.setblocking(True)
        connection.settimeout(1.0)
        connection.sendall(head.encode() + body.encode())
    connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="isbre.events.fanout_process")
    parser.add_argument("--wake-fd", type=int)
    parser.add_argument("--channel-fd", type=int)
    parser.add_argument("--listen", type=Path, help="serve the channels of several workers on this socket")
    parser.add_argument("--retry-ms", type=int, required=True)
    parser.add_argument("--keepalive-seconds", type=float, required=True)
    parser.add_argument("--ring-size", type=int, required=True)
    parser.add_argument("--ring-bytes", type=int, required=True)
    add_server_pid(parser)
    args = parser.parse_args(argv)
    die_with_parent(server=args.server_pid)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Ctrl-C reaches the whole process group: the server decides when streams end, not this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # One descriptor per subscriber: take all the system allows, not the usual soft limit of 1024.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    commit_log = CommitLog.follow(helper_store())
    try:
        try:
            server = FanoutServer(commit_log, args)
        except StoreUnavailableError as exc:
            if args.channel_fd is not None:
                _refuse_handed_over(socket.socket(fileno=args.channel_fd), exc)
            raise
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(server.run())
    finally:
        commit_log.close()
    return 0


def _refuse_handed_over(channel: socket.socket, exc: StoreUnavailableError) -> None:
    """A process that cannot start answers 503 to the connections its server handed over already.
    Reading is shut first, so that the server's next hand-over fails and it serves that stream
    itself: none is left in the channel to be closed without an answer when this process exits."""
    channel.shutdown(socket.SHUT_RD)
    channel.setblocking(False)
    with contextlib.suppress(OSError):
        while (handed := socket.recv_fds(channel, 1 << 16, 1))[0]:
            for fd in handed[1]:
                _refuse_unavailable(socket.socket(fileno=fd), exc)
    channel.close()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed, as uvicorn chooses."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


if __name__ == "__main__":
    raise SystemExit(main())
