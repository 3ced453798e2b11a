"""isbre\x27s Iceberg REST API, settings and command line."""
