"""The catalog's operations: what the REST API and the embedded PyIceberg catalog both call.

Reads go straight to a store read transaction and the metadata cache. Every write is a mutation
run by the writer, for the caller the `RequestContext` it is given names (catalog/request_context.py).
"""

from __future__ import annotations

from typing import Any

from isbre.catalog.consumers import Consumers
from isbre.catalog.maintenance_operations import Maintenance
from isbre.catalog.manifest_cache import ManifestCache
from isbre.catalog.namespace_operations import ConflictingPropertiesError, Namespaces, PropertiesChange
from isbre.catalog.objects import index_locations
from isbre.catalog.plans import Plans
from isbre.catalog.request_context import ANONYMOUS, RequestContext
from isbre.catalog.service_core import ServiceCore
from isbre.catalog.store import Store
from isbre.catalog.table_commit import TableState
from isbre.catalog.table_operations import TableCoverage, Tables
from isbre.catalog.view_operations import Views, ViewState

__all__ = [
    "ANONYMOUS",
    "CatalogService",
    "ConflictingPropertiesError",
    "PropertiesChange",
    "RequestContext",
    "TableCoverage",
    "TableState",
    "ViewState",
]


# The default bound of the decoded manifests kept for scan plans.
MANIFEST_CACHE_BYTES = 256 << 20


class CatalogService:
    """One warehouse's catalog (`warehouses.open_catalog` opens an embedded one): its namespaces,
    tables, views, scan plans, table consumers and maintenance, each an object over the
    warehouse's `core` (the store, the writer, the metadata caches and the places objects may
    live). Services for several warehouses of one store share its writer."""

    def __init__(
        self, store: Store, warehouse: str, manifests: ManifestCache | None = None, **options: Any
    ) -> None:
        """`manifests`: the decoded manifest lists and manifests that scan plans and the appends made
        again read (services of one process share one);
        `options`: those of `ServiceCore`."""
        self.core = ServiceCore(store, warehouse, **options)
        if not self.core.scope:
            index_locations(self.core)
        manifests = manifests or ManifestCache(MANIFEST_CACHE_BYTES)
        self.namespaces = Namespaces(self.core)
        self.tables = Tables(self.core, manifests)
        self.views = Views(self.core)
        self.plans = Plans(self.core, manifests)
        self.consumers = Consumers(self.core, self.plans)
        self.maintenance = Maintenance(self.core, self.tables, self.consumers)

    @property
    def name(self) -> str:
        """The warehouse's name, in records, events and URLs."""
        return self.core.name

    def close(self) -> None:
        self.core.close()
