"""Commit events: the live broadcast, replay from the commit log, SSE and the pull endpoint, a client,
and `TableFeed`, a table's appended rows as a stream (loaded on first use: the server does not need
PyIceberg's readers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from isbre.events.table_feed import TableFeed

__all__ = ["TableFeed"]


def __getattr__(name: str) -> Any:
    if name != "TableFeed":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from isbre.events.table_feed import TableFeed

    return TableFeed
