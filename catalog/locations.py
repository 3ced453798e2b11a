"""Where table and view files may live: under the warehouse, or under prefixes the operator allows.

A location comes from a client (create, a namespace's `location` property, a
`set-location` update, register). Unchecked, it would let any client make
the server write, or read, files anywhere the process can.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from catalog.metadata_files import local_path


class LocationNotAllowedError(ValueError):
    pass


def _normalized(location: str) -> str:
    path = local_path(location)
    if path is not None:
        # normpath folds "..": "warehouse/../etc" must compare as "/etc".
        return Path(os.path.normpath(path)).as_uri()
    parsed = urlparse(location)
    if not parsed.scheme or not parsed.netloc:
        raise LocationNotAllowedError(f"Location {location!r} is not an absolute path or URI")
    if ".." in parsed.path.split("/"):
        raise LocationNotAllowedError(f"Location {location!r} contains '..'")
    return location.rstrip("/")


class LocationPolicy:
    def __init__(self, warehouse: str, allowed: list[str] | tuple[str, ...] = ()) -> None:
        self.roots = [_normalized(root) for root in (warehouse, *allowed)]

    def check(self, location: str, what: str = "Location") -> str:
        normalized = _normalized(location)
        if not any(normalized == root or normalized.startswith(root + "/") for root in self.roots):
            raise LocationNotAllowedError(
                f"{what} {location!r} is outside the warehouse; allowed: {', '.join(self.roots)} "
                "(the allowed_locations setting adds more)"
            )
        return location
