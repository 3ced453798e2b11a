"""What a reader of a table's changes makes of them, row by row: the columns it adds to the table's,
and the kinds of change a row is (events/change_rows.py reads them; sinks/pipeline.py hands them to
a keyed sink), and how many rows the catalog nets for one commit of a change plan. A module of
its own, importing nothing: clients of the catalog use it.
"""

CHANGE_TYPE = "_change_type"
COMMIT_SEQ = "_commit_seq"
INSERT, DELETE, UPDATE_BEFORE, UPDATE_AFTER = "insert", "delete", "update_before", "update_after"
# The most rows a copy-on-write commit's files may hold for a change plan to net out the rows it
# carried over (catalog/carried_rows.py reads them in memory).
NET_MAX_ROWS = 1_000_000
