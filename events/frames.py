"""A commit record as a Server-Sent Events message."""

from __future__ import annotations

from catalog.records import CommitRecord


def sse_frame(record: CommitRecord) -> bytes:
    # The record's JSON is compact (no newlines), so it is one `data:` line.
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (record.commit_seq, record.kind.encode(), record.to_json())


def retry_frame(milliseconds: int) -> bytes:
    return b"retry: %d\n\n" % milliseconds
