"""Sinks: Arrow batches into tables with record provenance and exactly-once offset coverage.

contract.py (the contract every sink implements), columns.py, policies.py and record_id.py (the
metadata columns), iceberg.py (the Iceberg sink), lane.py (the pipelined ack lane), parquet.py (the
Parquet raw lane), files.py and ingest.py (`isbre ingest`). docs/sinks.md is the user guide.
"""
