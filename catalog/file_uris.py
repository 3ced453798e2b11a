"""Local locations: a `file:` URI or an absolute path, and the path it names.

Light on purpose (no PyIceberg, no Arrow): the store's helper processes use it too.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse


def local_path(location: str) -> Path | None:
    """The filesystem path of a `file:` URI or bare absolute path; None for other schemes.

    The URI's path as written, never percent-decoded: that is the path PyIceberg's Arrow FileIO
    reads and writes, so isbre's own files, the engines' and every check agree on one spelling
    (catalog/locations.py refuses local locations whose decoded reading would differ)."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme == "" and location.startswith("/"):
        return Path(location)
    return None


def file_uri(path: Path) -> str:
    """The `file:` location of an absolute path, written as `local_path` reads it back (not
    percent-encoded)."""
    return "file://" + str(path)
