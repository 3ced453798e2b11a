"""What a reader of a table's changes makes of them, row by row: the columns it adds to the table's,
and the kinds of change a row is (events/change_rows.py reads them; sinks/pipeline.py hands them to
a keyed sink). A module of its own, importing nothing: clients of the catalog use it.
"""

CHANGE_TYPE = "_change_type"
COMMIT_SEQ = "_commit_seq"
INSERT, DELETE, UPDATE_BEFORE, UPDATE_AFTER = "insert", "delete", "update_before", "update_after"
