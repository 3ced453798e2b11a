"""Where table and view files may live: under the warehouse, or under prefixes the operator allows.

A location comes from a client (create, a namespace's `location` property, a
`set-location` update, register). Unchecked, it would let any client make
the server write, or read, files anywhere the process can. Locations are
compared in one normal form (`normalized`): `file:` URIs with `..` folded,
other URIs (`s3://bucket/prefix`) without a trailing slash and refused if
they hold a `..` segment.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from urllib.parse import urlparse

from catalog.metadata_files import local_path
from catalog.object_storage import HADOOP_SCHEMES

# Locations are keys of the store's location index: LMDB keys hold 511 bytes.
MAX_LOCATION_BYTES = 480


class LocationNotAllowedError(ValueError):
    pass


def normalized(location: str) -> str:
    parsed = urlparse(location)
    if parsed.scheme == "file" and parsed.netloc:
        raise LocationNotAllowedError(f"Location {location!r} names a host: file URIs must be file:///path")
    path = local_path(location)
    if path is not None:
        # normpath folds "..": "warehouse/../etc" must compare as "/etc". Not percent-encoded: the
        # form only compares, and multibyte names stay short.
        found = "file://" + os.path.normpath(path)
    else:
        if not parsed.scheme or not parsed.netloc:
            raise LocationNotAllowedError(f"Location {location!r} is not an absolute path or URI")
        if parsed.scheme in HADOOP_SCHEMES:
            raise LocationNotAllowedError(
                f"Location {location!r} uses Spark's {parsed.scheme}:// scheme: name the object as s3://"
            )
        if ".." in parsed.path.split("/"):
            raise LocationNotAllowedError(f"Location {location!r} contains '..'")
        found = location.rstrip("/")
    if len(found.encode()) > MAX_LOCATION_BYTES:
        raise LocationNotAllowedError(
            f"Location is longer than {MAX_LOCATION_BYTES} bytes: {location[:60]!r}..."
        )
    return found


def inside(location: str, root: str) -> bool:
    """Whether normalized `location` is `root` or under it."""
    return location == root or location.startswith(root + "/")


class LocationPolicy:
    def __init__(
        self,
        roots: Iterable[str],
        what: str = "the warehouse",
        parent: LocationPolicy | None = None,
        refusal: type[Exception] = LocationNotAllowedError,
    ) -> None:
        self.roots = [normalized(root) for root in roots]
        self._what = what
        self._parent = parent
        self._refusal = refusal

    @classmethod
    def of(cls, warehouse: str, allowed: Iterable[str] = ()) -> LocationPolicy:
        return cls([warehouse, *allowed])

    def narrowed(self, roots: Iterable[str], what: str, refusal: type[Exception]) -> LocationPolicy:
        """A policy that allows only what this one allows and lies under `roots` too."""
        return LocationPolicy(roots, what, self, refusal)

    def check(self, location: str, what: str = "Location") -> str:
        if self._parent is not None:
            self._parent.check(location, what)
        found = normalized(location)
        if not any(inside(found, root) for root in self.roots):
            hint = " (the allowed_locations setting adds more)" if self._parent is None else ""
            raise self._refusal(
                f"{what} {location!r} is outside {self._what}; allowed: {', '.join(self.roots)}{hint}"
            )
        return location
