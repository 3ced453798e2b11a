"""Where table and view files may live: under the warehouse, or under prefixes the operator allows.

A location comes from a client (create, a namespace's `location` property, a
`set-location` update, register, the paths inside metadata). Unchecked, it
would let any client make the server write, read or delete files anywhere the
process can. Every location is compared in one normal form (`normalized`), and
a spelling that one reader could take for another place is refused outright
rather than folded: `.` and `..` segments, percent-encoded separators, dots and
control characters, backslashes, `?`, `#` and `;` (which URI parsers read as a
query, fragment or parameters and drop from the path), and `%` in a local
location (file URIs are read as written, never percent-decoded: see
`catalog.metadata_files.local_path`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from urllib.parse import urlparse

from isbre.catalog.file_uris import local_path
from isbre.catalog.s3_options import HADOOP_SCHEMES

# Locations are keys of the store's location index: LMDB keys hold 511 bytes.
MAX_LOCATION_BYTES = 480


class LocationNotAllowedError(ValueError):
    pass


# Percent-encodings that decode to a separator, a dot or a control character.
_ENCODED = re.compile(r"%(2f|5c|2e|[01][0-9a-f]|7f)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_spelling(location: str) -> None:
    """Refuse a location that some reader could take for another place (see the module's doc)."""
    if _CONTROL.search(location) or "\\" in location:
        raise LocationNotAllowedError(f"Location {location!r} contains a control character or a backslash")
    if any(mark in location for mark in "?#;"):
        raise LocationNotAllowedError(f"Location {location!r} contains '?', '#' or ';'")
    if _ENCODED.search(location):
        raise LocationNotAllowedError(
            f"Location {location!r} contains a percent-encoded separator, dot or control character"
        )
    parsed = urlparse(location)
    if any(segment in (".", "..") for segment in parsed.path.split("/")):
        raise LocationNotAllowedError(f"Location {location!r} contains a '.' or '..' segment")


def normalized(location: str, literal_percent: bool = False) -> str:
    """`location` in the one normal form locations are compared in; LocationNotAllowedError for a
    spelling some reader could take for another place. `literal_percent`: a `%` is a character
    of the name (a file inside a table's place, named by the table's own engine, as PyIceberg
    and Spark name a file under a percent-encoded partition value), not a refusal; an encoded
    separator, dot or control character still is."""
    check_spelling(location)
    parsed = urlparse(location)
    if parsed.scheme == "file" and parsed.netloc:
        raise LocationNotAllowedError(f"Location {location!r} names a host: file URIs must be file:///path")
    path = local_path(location)
    if path is not None:
        if "%" in location and not literal_percent:
            raise LocationNotAllowedError(
                f"Location {location!r} contains '%': local paths are read as written, never "
                "percent-decoded, so name the directory without it"
            )
        found = "file://" + os.path.normpath(path)  # folds repeated and trailing slashes only
    else:
        if not parsed.scheme or not parsed.netloc:
            raise LocationNotAllowedError(f"Location {location!r} is not an absolute path or URI")
        if parsed.scheme in HADOOP_SCHEMES:
            raise LocationNotAllowedError(
                f"Location {location!r} uses Spark's {parsed.scheme}:// scheme: name the object as s3://"
            )
        found = location.rstrip("/")
    if len(found.encode()) > MAX_LOCATION_BYTES:
        raise LocationNotAllowedError(
            f"Location is longer than {MAX_LOCATION_BYTES} bytes: {location[:60]!r}..."
        )
    return found


def inside(location: str, root: str) -> bool:
    """Whether normalized `location` is `root` or under it."""
    return location == root or location.startswith(root + "/")


def _resolves_inside(location: str, root: str) -> bool:
    """For local places, whether the part of `location` that exists already resolves (symbolic
    links followed) inside `root` resolved: a link in the way must not lead files elsewhere."""
    path, root_path = local_path(location), local_path(root)
    if path is None or root_path is None:
        return True
    resolved, resolved_root = os.path.realpath(path), os.path.realpath(root_path)
    return resolved == resolved_root or resolved.startswith(resolved_root.rstrip("/") + "/")


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
        try:
            found = normalized(location)
        except LocationNotAllowedError as exc:  # say which of a table's places it was
            raise LocationNotAllowedError(f"{what}: {exc}") from exc
        if not any(inside(found, root) and _resolves_inside(found, root) for root in self.roots):
            hint = " (the allowed_locations setting adds more)" if self._parent is None else ""
            raise self._refusal(
                f"{what} {location!r} is outside {self._what}; allowed: {', '.join(self.roots)}{hint}"
            )
        return location
