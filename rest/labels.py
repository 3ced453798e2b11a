"""Prometheus label values: bounded sets, escaped where they are printed.

Label values come from clients (a report's type, a request's method): each is
one of a known set, and anything else counts as "other", so no client can grow
the number of series; every value is escaped as the text format requires, so
none can end a line and forge another.
"""

from __future__ import annotations

REPORT_TYPES = frozenset({"scan-report", "commit-report"})
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
OTHER = "other"


def report_type(value: str) -> str:
    return value if value in REPORT_TYPES else OTHER


def method_label(value: str) -> str:
    return value if value in METHODS else OTHER


def _escaped(value: object) -> str:
    """A label value as the Prometheus text format writes it: backslash, quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def labels(**pairs: object) -> str:
    return "{" + ",".join(f'{name}="{_escaped(value)}"' for name, value in pairs.items()) + "}"
