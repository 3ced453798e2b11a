"""The web console: a read-only page at /ui over isbre's own API (catalog, events, lineage, coverage)."""
