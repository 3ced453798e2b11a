"""Keeps the commit log within its retention window, trimming in small writer batches."""

from __future__ import annotations

import asyncio
import logging

import anyio
from isbre.catalog.commit_log import CommitLog

log = logging.getLogger(__name__)


async def trim_periodically(
    commit_log: CommitLog, keep_records: int, keep_days: float, every: float, keep_keys_us: int
) -> None:
    """Trim the commit log to its retention window, and expired Idempotency-Keys."""
    keep_us = int(keep_days * 24 * 3600 * 10**6)
    while True:
        await asyncio.sleep(every)
        try:
            removed = await anyio.to_thread.run_sync(commit_log.trim_log, keep_records, keep_us)
            await anyio.to_thread.run_sync(commit_log.trim_idempotency, keep_keys_us)
        except Exception:
            log.exception("trimming failed; will try again in %ss", every)
            continue
        if removed:
            log.info("trimmed %d commit records beyond the retention window", removed)
