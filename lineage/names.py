"""Where isbre's datasets and jobs live in OpenLineage's naming: the one thing about lineage the
server's own processes need, kept apart from openlineage-python (which only the lineage worker and
`isbre lineage replay` load)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

# A transaction's job is named by its tables while their names fit in this many characters.
MAX_TRANSACTION_NAMES = 200


def transaction_job(tables: list[str]) -> str:
    """The job of a multi-table transaction: the same for every transaction over the same tables
    (`isbre.transaction.a.t,b.u`), so a job's history is that of the tables it changes together;
    past MAX_TRANSACTION_NAMES characters, the first table, how many more, and a digest of all."""
    named = sorted(set(tables))
    joined = ",".join(named)
    if len(joined) <= MAX_TRANSACTION_NAMES:
        return f"isbre.transaction.{joined}"
    digest = hashlib.sha256(joined.encode()).hexdigest()[:12]
    return f"isbre.transaction.{named[0]}+{len(named) - 1}.{digest}"


@dataclass(frozen=True)
class LineageNames:
    """Where isbre's datasets and jobs live in OpenLineage's naming."""

    namespace: str  # dataset and job namespace, e.g. file:///srv/lake or s3://bucket/lake
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
        """A declared dataset: {"namespace", "name"}, or "ns.table" (or {"table": "ns.table"})
        meaning a table of this catalog."""
        if isinstance(declared, dict) and isinstance(declared.get("table"), str):
            return self.namespace, declared["table"]
        if (
            isinstance(declared, dict)
            and isinstance(declared.get("namespace"), str)
            and isinstance(declared.get("name"), str)
        ):
            return declared["namespace"], declared["name"]
        if isinstance(declared, str):
            return self.namespace, declared
        raise ValueError(f"not a dataset: {declared!r}")
