"""Metadata policies: which record metadata columns (sinks/columns.py) a sink table's rows carry.

Apart from the columns themselves, so that the command line can name the policies without
importing PyArrow. `locator` is what finds a row's record at its source again and deduplicates
it; `all` adds the source's key, timestamp and headers and the record's path through the sink;
`none` leaves the rows as the source gave them (exactly-once coverage lives in snapshot
summaries and the coverage index, not in rows).
"""

from __future__ import annotations

# Column suffixes, in table order.
POLICIES: dict[str, tuple[str, ...]] = {
    "all": (
        "source_topic",
        "source_partition",
        "source_offset",
        "source_key",
        "source_timestamp",
        "source_headers",
        "ingest_ts",
        "emit_ts",
        "record_id",
    ),
    "locator": ("source_topic", "source_partition", "source_offset", "record_id"),
    "none": (),
}
DEFAULT_POLICY = "locator"  # for tables created from now on
EARLIER_POLICY = "all"  # what sink tables made before the policy was recorded carry
