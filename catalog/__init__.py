"""isbre's catalog core: the LMDB store, the group-commit writer and the commit log."""

from catalog.identifiers import Identifier, InvalidIdentifierError
from catalog.records import CommitRecord
from catalog.service import CatalogService, TableState, ViewState
from catalog.tables import TableChange

__all__ = [
    "CatalogService",
    "CommitRecord",
    "Identifier",
    "InvalidIdentifierError",
    "TableChange",
    "TableState",
    "ViewState",
]
