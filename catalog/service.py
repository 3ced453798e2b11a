"""The catalog's operations: what the REST API and the embedded PyIceberg catalog both call.

Reads go straight to a store read transaction and the metadata cache. Every write is a mutation
run by the writer, for the caller the `RequestContext` it is given names (catalog/request_context.py).
"""

from __future__ import annotations

from isbre.catalog.maintenance_operations import MaintenanceOperations
from isbre.catalog.namespace_operations import (
    ConflictingPropertiesError,
    NamespaceOperations,
    PropertiesChange,
)
from isbre.catalog.request_context import ANONYMOUS, RequestContext
from isbre.catalog.table_operations import TableCoverage, TableState
from isbre.catalog.view_operations import ViewOperations, ViewState

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


class CatalogService(NamespaceOperations, MaintenanceOperations, ViewOperations):
    """One warehouse's catalog (`warehouses.open_catalog` opens an embedded one). Services for
    several warehouses of one store share its writer."""
