"""Which commit records a subscriber wants."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from isbre.catalog.identifiers import Identifier, check_namespace
from isbre.catalog.records import CommitRecord

# A level containing a dot can be given with the unit separator instead, as in REST paths.
_UNIT_SEPARATOR = "\x1f"


def parse_namespace(text: str) -> tuple[str, ...]:
    return check_namespace(text.split(_UNIT_SEPARATOR if _UNIT_SEPARATOR in text else "."))


def parse_table(text: str) -> Identifier:
    *namespace, name = text.split(_UNIT_SEPARATOR if _UNIT_SEPARATOR in text else ".")
    if not namespace:
        raise ValueError(f"Invalid table {text!r}: expected <namespace>.<table>")
    return Identifier.of(namespace, name)


@dataclass(frozen=True)
class EventFilter:
    """A record matches when it passes every filter that is set.

    `namespace` matches that namespace and everything nested under it; `tables`
    matches a table (or view) by name, before or after a rename; `kinds`
    matches record kinds such as `table.commit`.
    """

    namespace: tuple[str, ...] | None = None
    tables: frozenset[Identifier] = field(default_factory=frozenset)
    kinds: frozenset[str] = field(default_factory=frozenset)
    # What the subscriber may see at all: namespaces and everything under them (empty: everything).
    scopes: tuple[tuple[str, ...], ...] = ()
    # The warehouse tags of the records wanted (None: a record from before warehouses had names);
    # empty: every warehouse's.
    warehouses: frozenset[str | None] = field(default_factory=frozenset)

    @classmethod
    def parse(
        cls,
        namespace: str | None,
        tables: Iterable[str] = (),
        kinds: Iterable[str] = (),
        scopes: tuple[tuple[str, ...], ...] = (),
        warehouses: Iterable[str | None] = (),
    ) -> EventFilter:
        return cls(
            parse_namespace(namespace) if namespace else None,
            frozenset(parse_table(t) for t in tables),
            frozenset(kinds),
            scopes,
            frozenset(warehouses),
        )

    @property
    def everything(self) -> bool:
        return (
            self.namespace is None
            and not self.tables
            and not self.kinds
            and not self.scopes
            and not self.warehouses
        )

    def matches(self, record: CommitRecord) -> bool:
        if self.kinds and record.kind not in self.kinds:
            return False
        if self.warehouses and record.warehouse not in self.warehouses:
            return False
        names = [(tuple(record.namespace), record.name)]
        if record.previous:
            names.append((tuple(record.previous["namespace"]), record.previous["name"]))
        # Every name a record carries must be visible: a rename must not reveal where a table came from.
        if self.scopes and not all(any(ns[: len(s)] == s for s in self.scopes) for ns, _ in names):
            return False
        if self.namespace is not None:
            depth = len(self.namespace)
            if not any(ns[:depth] == self.namespace for ns, _ in names):
                return False
        if self.tables:
            return any(name is not None and Identifier(ns, name) in self.tables for ns, name in names)
        return True
