"""Sinks: Arrow batches into tables with record provenance and exactly-once offset coverage.

contract.py (the contract every sink implements), columns.py, policies.py and record_id.py (the
metadata columns), iceberg.py (the Iceberg sink), lane.py (the pipelined ack lane), parquet.py (the
Parquet raw lane), files.py and ingest.py (`isbre ingest`). docs/sinks.md is the user guide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from isbre.sinks.quality import Rule

__all__ = ["Rule"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the command line imports this package without PyArrow.
    if name == "Rule":
        from isbre.sinks.quality import Rule

        return Rule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
