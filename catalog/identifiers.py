"""Namespace and object names: validation, their keys in the store, and the path segment each becomes.

A name may hold anything the Iceberg spec allows (`/` and `\\` too) but
control characters and lone surrogates, which store keys use or cannot hold,
and `.` and `..`, which clients' URL handling rewrites. A name never reaches a
path as it is: a table's default location is made from `path_segment(name)`,
which keeps a plain name readable and replaces any other by a safe spelling
with a digest of the name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

# Names are limited in encoded bytes, not characters: a table's directory is `<name>-<32 hex digits>`,
# and most filesystems take 255 bytes a name.
MAX_NAME_BYTES = 200
MAX_NAMESPACE_DEPTH = 16
# An object's store key (namespace levels, separators and name) must fit LMDB's 511-byte keys.
MAX_KEY_BYTES = 500

# Separates namespace levels inside store keys; validation keeps it out of names.
_LEVEL = b"\x1f"
# Separates a namespace key from an object name inside store keys.
_OBJECT = b"\x00"


class InvalidIdentifierError(ValueError):
    """A namespace or object name that isbre will not store."""


def check_name(name: object, what: str = "name") -> str:
    if not isinstance(name, str):
        raise InvalidIdentifierError(f"{what} must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidIdentifierError(f"{what} must not be empty")
    if len(name.encode("utf-8", errors="surrogatepass")) > MAX_NAME_BYTES:
        raise InvalidIdentifierError(
            f"{what} is longer than {MAX_NAME_BYTES} bytes (UTF-8): {name[:40]!r}..."
        )
    if name in (".", ".."):
        raise InvalidIdentifierError(f"{what} must not be {name!r}")
    for ch in name:
        if ord(ch) < 0x20 or ord(ch) == 0x7F or 0xD800 <= ord(ch) <= 0xDFFF:
            raise InvalidIdentifierError(f"{what} {name!r} contains a control character")
    return name


_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def path_segment(name: str) -> str:
    """The directory name a namespace level or table name becomes: the name itself when it is plain
    (ASCII letters, digits, `_`, `.`, `-`, not starting with a dot), otherwise its plain characters
    with `_` for the rest, `~` and 16 hex digits of its SHA-256: distinct names, distinct segments,
    and nothing of the name (`/`, `\\`, `..`, `%`, spaces) reaches a path."""
    if _PLAIN.fullmatch(name):
        return name
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64].lstrip(".") or "_"
    return f"{readable}~{hashlib.sha256(name.encode()).hexdigest()[:16]}"


CONSUMER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_consumer_name(consumer: str) -> str:
    """A consumer's name, as a cursor's owner: here, not beside the cursors, so that a client
    (events/table_feed.py) checks it without importing the catalog's server side."""
    if not CONSUMER_NAME.fullmatch(consumer):
        raise ValueError(
            f"Invalid consumer name {consumer!r}: 1 to 128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return consumer


def check_namespace(namespace: object) -> tuple[str, ...]:
    if isinstance(namespace, str) or not isinstance(namespace, list | tuple):
        raise InvalidIdentifierError("namespace must be a list of strings")
    if not namespace:
        raise InvalidIdentifierError("namespace must have at least one level")
    if len(namespace) > MAX_NAMESPACE_DEPTH:
        raise InvalidIdentifierError(f"namespace is deeper than {MAX_NAMESPACE_DEPTH} levels")
    checked = tuple(check_name(level, "namespace level") for level in namespace)
    if len(namespace_key(checked)) > MAX_KEY_BYTES:
        raise InvalidIdentifierError(f"namespace is longer than {MAX_KEY_BYTES} bytes (UTF-8, all levels)")
    return checked


@dataclass(frozen=True, order=True)
class Identifier:
    """A table or view: the namespace it lives in and its name."""

    namespace: tuple[str, ...]
    name: str

    @classmethod
    def of(cls, namespace: object, name: object) -> Identifier:
        ident = cls(check_namespace(namespace), check_name(name))
        if len(ident.key) > MAX_KEY_BYTES:
            raise InvalidIdentifierError(
                f"{ident} is longer than {MAX_KEY_BYTES} bytes (UTF-8, with its namespace)"
            )
        return ident

    def __str__(self) -> str:
        return ".".join((*self.namespace, self.name))

    @property
    def parts(self) -> tuple[str, ...]:
        """Namespace levels and name, as PyIceberg's identifiers are."""
        return (*self.namespace, self.name)

    @property
    def key(self) -> bytes:
        return namespace_key(self.namespace) + _OBJECT + self.name.encode()

    @classmethod
    def from_key(cls, key: bytes) -> Identifier:
        namespace, _, name = key.partition(_OBJECT)
        return cls(namespace_from_key(namespace), name.decode())


def namespace_key(namespace: tuple[str, ...]) -> bytes:
    return _LEVEL.join(level.encode() for level in namespace)


def namespace_from_key(key: bytes) -> tuple[str, ...]:
    return tuple(level.decode() for level in key.split(_LEVEL))


def objects_prefix(namespace: tuple[str, ...]) -> bytes:
    """Key prefix of every table (or view) directly in `namespace`."""
    return namespace_key(namespace) + _OBJECT


def children_prefix(namespace: tuple[str, ...]) -> bytes:
    """Key prefix of every namespace nested (at any depth) under `namespace`."""
    return namespace_key(namespace) + _LEVEL if namespace else b""


def depth(key: bytes) -> int:
    return key.count(_LEVEL) + 1


def direct_children(
    keys: Iterable[bytes], parent: tuple[str, ...], limit: int | None
) -> list[tuple[str, ...]]:
    """The namespaces of `keys` (all under `parent`, in key order) one level below `parent`, at most
    `limit` of them."""
    found: list[tuple[str, ...]] = []
    for key in keys:
        if depth(key) == len(parent) + 1:
            found.append(namespace_from_key(key))
            if limit is not None and len(found) >= limit:
                break
    return found
