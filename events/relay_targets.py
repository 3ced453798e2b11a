"""Where a relay sends: a NATS JetStream stream, or a webhook signed as Standard Webhooks says.

A target is opened, sends messages in commit order, and is closed and opened again after any
failure. On opening, a target that can read back what it holds says which commit it holds last:
JetStream can, so a relay never publishes a commit twice into its stream, whatever happened
between a publish and the relay's note of it; a webhook receiver cannot, so a webhook may see a
message again (same id).

JetStream gets a relay's messages several at a time, without waiting for each acknowledgement
before the next publish: each names the message before it (`Nats-Expected-Last-Msg-Id`), so the
stream stores it only right after that one. A message the stream refuses makes it refuse every
later one in flight; the relay opens again and goes on from what the stream holds. A webhook gets
one POST at a time, each acknowledged (2xx) before the next, all of a batch on one thread.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from collections.abc import Callable, Sequence
from functools import partial
from http.client import HTTPConnection, HTTPSConnection
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from isbre.catalog.records import CommitRecord
from isbre.events.cloudevents import CONTENT_TYPE, EventSource
from isbre.events.relay_settings import NatsRelay, WebhookRelay, signing_key, subject_token

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

# JetStream's header naming a message for its duplicate window, and the one that makes the stream
# store a message only if the one it names is the stream's last.
MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST = "Nats-Expected-Last-Msg-Id"
# A message: a commit record and the body sent for it.
Message = tuple[CommitRecord, bytes]


class DeliveryError(Exception):
    """The target refused a message (it is sent again)."""


class Target(Protocol):
    async def open(self) -> int | None:
        """Connect; the commit_seq of the last message of this catalog the target holds, when it
        can tell (None: nothing, or it cannot say)."""

    async def send(self, messages: Sequence[Message], delivered: Callable[[CommitRecord], None]) -> None:
        """Deliver `messages` in order, calling `delivered(record)` for each as it is acknowledged;
        raises at the first that is not (no later one is then delivered before it)."""

    async def close(self) -> None: ...


class NatsTarget:
    def __init__(self, settings: NatsRelay, source: EventSource) -> None:
        self._settings = settings
        self._source = source
        self._client: Client | None = None
        self._stream: JetStreamContext | None = None
        # The id of the last message this connection published and saw acknowledged, which the next
        # publish names; None after opening, when the first publish goes alone (what the stream
        # holds last may be older than what it remembers ids of).
        self._last_id: str | None = None

    async def open(self) -> int | None:
        import nats
        from nats.js.errors import NotFoundError

        settings = self._settings
        # No reconnection inside the client: a relay that lost its server opens a new connection and
        # asks the stream what it holds before it publishes again.
        self._client = await nats.connect(
            settings.url, allow_reconnect=False, connect_timeout=settings.ack_timeout_seconds
        )
        stream = self._stream = self._client.jetstream(timeout=settings.ack_timeout_seconds)
        try:
            await stream.stream_info(settings.stream)
        except NotFoundError:
            await stream.add_stream(name=settings.stream, subjects=[f"{settings.subject}.>"])
        self._last_id = None
        try:
            last = await stream.get_last_msg(settings.stream, f"{settings.subject}.>")
        except NotFoundError:
            return None
        return self._source.commit_of((last.headers or {}).get(MSG_ID, ""))

    async def send(self, messages: Sequence[Message], delivered: Callable[[CommitRecord], None]) -> None:
        if self._last_id is None and messages:
            await self._publish([messages[0]], delivered)
            messages = messages[1:]
        await self._publish(messages, delivered)

    async def _publish(self, messages: Sequence[Message], delivered: Callable[[CommitRecord], None]) -> None:
        """Publish every message before waiting for the first acknowledgement, each naming the one
        before it."""
        from nats.errors import Error as NatsError

        assert self._stream is not None
        settings = self._settings
        acks: list[tuple[CommitRecord, str, asyncio.Future[Any]]] = []
        previous = self._last_id
        try:
            for record, body in messages:
                names = [*record.namespace, *([record.name] if record.name is not None else [])]
                subject = ".".join([settings.subject, *map(subject_token, names)])
                message_id = self._source.event_id(record.commit_seq)
                headers = {MSG_ID: message_id, "Content-Type": CONTENT_TYPE}
                if previous is not None:
                    headers[EXPECTED_LAST] = previous
                ack = await self._stream.publish_async(subject, body, stream=settings.stream, headers=headers)
                acks.append((record, message_id, ack))
                previous = message_id
            for record, message_id, ack in acks:
                try:
                    await asyncio.wait_for(ack, settings.ack_timeout_seconds)
                except (NatsError, TimeoutError) as exc:
                    raise DeliveryError(
                        f"JetStream did not take commit {record.commit_seq} into {settings.stream}: {exc!r}"
                    ) from exc
                self._last_id = message_id
                delivered(record)
        finally:
            for _, _, ack in acks:  # those behind a failure: refused by the stream, or still in flight
                if not ack.done():
                    ack.cancel()
                elif not ack.cancelled():
                    ack.exception()  # seen: a refusal behind the first is expected

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()


def webhook_signature(key: bytes, message_id: str, timestamp: str, body: bytes) -> str:
    """Standard Webhooks' signature: HMAC-SHA256 of `id.timestamp.body`, base64, version 1."""
    digest = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


class WebhookTarget:
    """POSTs over one kept-alive connection of the standard library's HTTP client, on a thread: a
    fifth of the CPU an httpx request takes, which a relay spends on every commit. Proxy variables
    are not read: the relay connects to the URL's host itself."""

    def __init__(self, settings: WebhookRelay, source: EventSource) -> None:
        self._settings = settings
        self._source = source
        self._key = signing_key(settings.secret)
        url = urlsplit(settings.url)
        self._path = url.path or "/"
        if url.query:
            self._path += "?" + url.query
        self._connect = partial(
            HTTPSConnection if url.scheme == "https" else HTTPConnection,
            url.hostname or "",
            url.port,
            timeout=settings.timeout_seconds,
        )
        self._connection: HTTPConnection | None = None

    async def open(self) -> int | None:
        self._connection = self._connect()
        return None

    async def send(self, messages: Sequence[Message], delivered: Callable[[CommitRecord], None]) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(
            self._post_all, messages, lambda record: loop.call_soon_threadsafe(delivered, record)
        )

    def _post_all(self, messages: Sequence[Message], delivered: Callable[[CommitRecord], object]) -> None:
        for record, body in messages:
            message_id = self._source.event_id(record.commit_seq)
            # Each try is signed at its own time: receivers refuse old timestamps (replay protection).
            timestamp = str(int(time.time()))
            headers = {
                "content-type": CONTENT_TYPE,
                "webhook-id": message_id,
                "webhook-timestamp": timestamp,
                "webhook-signature": webhook_signature(self._key, message_id, timestamp, body),
            }
            status = self._post(body, headers)
            if not 200 <= status < 300:
                raise DeliveryError(f"the webhook answered {status} to {message_id}")
            delivered(record)

    def _post(self, body: bytes, headers: dict[str, str]) -> int:
        assert self._connection is not None
        self._connection.request("POST", self._path, body=body, headers=headers)
        response = self._connection.getresponse()
        response.read()
        return response.status

    async def close(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            connection.close()


def target_for(settings: NatsRelay | WebhookRelay, source: EventSource) -> Target:
    if isinstance(settings, NatsRelay):
        return NatsTarget(settings, source)
    return WebhookTarget(settings, source)
