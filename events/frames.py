"""A commit record as a Server-Sent Events message."""

from __future__ import annotations

import json

from isbre.catalog.records import CommitRecord


def sse_frame(record: CommitRecord) -> bytes:
    # The record's JSON is compact (no newlines), so it is one `data:` line.
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (record.commit_seq, record.kind.encode(), record.to_json())


def retry_frame(milliseconds: int) -> bytes:
    return b"retry: %d\n\n" % milliseconds


# A comment line: EventSource ignores it, proxies and load balancers see the connection in use.
PING_FRAME = b": ping\n\n"

# Response headers of every stream, besides its content type.
STREAM_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def expired_frame(exc: Exception) -> bytes:
    """The last message of a stream whose cursor fell out of the retained log while it caught up."""
    error = {"error": {"message": str(exc), "type": "CursorExpiredException", "code": 410}}
    return b"event: error\ndata: %s\n\n" % json.dumps(error).encode()


def token_expired_frame() -> bytes:
    """The last message of a stream whose access token expired: the client reconnects with a new one."""
    message = (
        "The access token of this stream has expired; reconnect with a fresh token (Last-Event-ID resumes)"
    )
    error = {"error": {"message": message, "type": "NotAuthorizedException", "code": 401}}
    return b"event: error\ndata: %s\n\n" % json.dumps(error).encode()
