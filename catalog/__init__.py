"""isbre's catalog core: the stores, the group-commit writer, the commit log and the operations.

The names below load on first use: importing one module of the package (the commit record, say)
does not load PyIceberg's table machinery and pyarrow with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from isbre.catalog.identifiers import Identifier, InvalidIdentifierError
    from isbre.catalog.records import CommitRecord
    from isbre.catalog.service import CatalogService, TableState, ViewState
    from isbre.catalog.table_staging import TableChange

_WHERE = {
    "CatalogService": "isbre.catalog.service",
    "CommitRecord": "isbre.catalog.records",
    "Identifier": "isbre.catalog.identifiers",
    "InvalidIdentifierError": "isbre.catalog.identifiers",
    "TableChange": "isbre.catalog.table_staging",
    "TableState": "isbre.catalog.service",
    "ViewState": "isbre.catalog.service",
}
__all__ = [
    "CatalogService",
    "CommitRecord",
    "Identifier",
    "InvalidIdentifierError",
    "TableChange",
    "TableState",
    "ViewState",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
