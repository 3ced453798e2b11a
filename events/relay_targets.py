"""Where a relay sends: a NATS JetStream stream, or a webhook signed as Standard Webhooks says.

A target is opened, sends one message at a time (the relay waits for each to be acknowledged, so
messages arrive in commit order), and is closed and opened again after any failure. On opening, a
target that can read back what it holds says which commit it holds last: JetStream can, so a relay
never publishes a commit twice into its stream, whatever happened between a publish and the
relay's note of it; a webhook receiver cannot, so a webhook may see a message again (same id).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from functools import partial
from http.client import HTTPConnection, HTTPSConnection
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from isbre.catalog.records import CommitRecord
from isbre.events.cloudevents import CONTENT_TYPE, EventSource
from isbre.events.relay_settings import NatsRelay, WebhookRelay, signing_key, subject_token

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

# JetStream's header naming a message for its duplicate window.
MSG_ID = "Nats-Msg-Id"


class DeliveryError(Exception):
    """The target refused a message (it is sent again)."""


class Target(Protocol):
    async def open(self) -> int | None:
        """Connect; the commit_seq of the last message of this catalog the target holds, when it
        can tell (None: nothing, or it cannot say)."""

    async def send(self, record: CommitRecord, body: bytes) -> None:
        """Deliver one message; returns once the target has acknowledged it (raises otherwise)."""

    async def close(self) -> None: ...


class NatsTarget:
    def __init__(self, settings: NatsRelay, source: EventSource) -> None:
        self._settings = settings
        self._source = source
        self._client: Client | None = None
        self._stream: JetStreamContext | None = None

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
        try:
            last = await stream.get_last_msg(settings.stream, f"{settings.subject}.>")
        except NotFoundError:
            return None
        return self._source.commit_of((last.headers or {}).get(MSG_ID, ""))

    async def send(self, record: CommitRecord, body: bytes) -> None:
        from nats.errors import NoRespondersError

        assert self._stream is not None
        names = [*record.namespace, *([record.name] if record.name is not None else [])]
        subject = ".".join([self._settings.subject, *map(subject_token, names)])
        headers = {MSG_ID: self._source.event_id(record.commit_seq), "Content-Type": CONTENT_TYPE}
        try:
            await self._stream.publish(subject, body, stream=self._settings.stream, headers=headers)
        except NoRespondersError as exc:
            raise DeliveryError(
                f"no JetStream stream takes {subject} (is it {self._settings.stream}'s?)"
            ) from exc

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

    async def send(self, record: CommitRecord, body: bytes) -> None:
        message_id = self._source.event_id(record.commit_seq)
        # Each try is signed at its own time: receivers refuse old timestamps (replay protection).
        timestamp = str(int(time.time()))
        headers = {
            "content-type": CONTENT_TYPE,
            "webhook-id": message_id,
            "webhook-timestamp": timestamp,
            "webhook-signature": webhook_signature(self._key, message_id, timestamp, body),
        }
        status = await asyncio.to_thread(self._post, body, headers)
        if not 200 <= status < 300:
            raise DeliveryError(f"the webhook answered {status} to {message_id}")

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
