"""Where isbre's datasets and jobs live in OpenLineage's naming: the one thing about lineage the
server's own processes need, kept apart from openlineage-python (which only the lineage worker and
`isbre lineage replay` load)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LineageNames:
    """Where isbre's datasets and jobs live in OpenLineage's naming."""

    namespace: str  # dataset and job namespace, e.g. isbre://127.0.0.1:8181/isbre
    # The namespaces of other warehouses than the default one, by warehouse name.
    warehouses: dict[str, str] = field(default_factory=dict)

    def of(self, warehouse: str | None) -> LineageNames:
        """The names of `warehouse`'s datasets (the default warehouse's for None or an unknown one)."""
        if warehouse in self.warehouses:
            return LineageNames(self.warehouses[warehouse])  # one warehouse's names: nothing to resolve
        return self

    def dataset_name(self, namespace: list[str], name: str) -> str:
        return ".".join([*namespace, name])

    def resolve(self, declared: Any) -> tuple[str, str]:
        """A declared dataset: {"namespace", "name"}, or "ns.table" meaning a table of this catalog."""
        if (
            isinstance(declared, dict)
            and isinstance(declared.get("namespace"), str)
            and isinstance(declared.get("name"), str)
        ):
            return declared["namespace"], declared["name"]
        if isinstance(declared, str):
            return self.namespace, declared
        raise ValueError(f"not a dataset: {declared!r}")
