"""isbre's catalog core: the LMDB store, the group-commit writer and the commit log."""

from isbre.catalog.identifiers import Identifier, InvalidIdentifierError
from isbre.catalog.records import CommitRecord
from isbre.catalog.service import CatalogService, TableState, ViewState
from isbre.catalog.tables import TableChange

__all__ = [
    "CatalogService",
    "CommitRecord",
    "Identifier",
    "InvalidIdentifierError",
    "TableChange",
    "TableState",
    "ViewState",
]
