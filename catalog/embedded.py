"""isbre as an in-process PyIceberg catalog: the LMDB warehouse with no server.

    from pyiceberg.catalog import load_catalog
    catalog = load_catalog("local", **{"py-catalog-impl": "isbre.catalog.embedded.LmdbCatalog",
                                       "warehouse": "./warehouse"})

It shares the group-commit writer and commit log with the server, so commits
made here are numbered, logged and seen by a server opened later on the same
warehouse.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
from isbre.catalog.coverage import Coverage
from isbre.catalog.file_uris import local_path
from isbre.catalog.identifiers import Identifier
from isbre.catalog.service import CatalogService, TableState
from isbre.catalog.table_staging import TableChange
from isbre.catalog.warehouses import open_catalog
from pyiceberg.catalog import MetastoreCatalog, PropertiesUpdateSummary
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableResponse, Table, TableProperties
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import EMPTY_DICT, Properties
from pyiceberg.typedef import Identifier as IdentifierTuple
from pyiceberg.view import View
from pyiceberg.view.metadata import ViewVersion

# LMDB must not be opened twice in one process: catalogs on one warehouse share a service.
_open: dict[Path, tuple[CatalogService, int]] = {}
_open_lock = threading.Lock()


def _acquire(warehouse: Path) -> CatalogService:
    with _open_lock:
        service, users = _open.get(warehouse) or (open_catalog(warehouse), 0)
        _open[warehouse] = (service, users + 1)
        return service


def _release(warehouse: Path) -> None:
    with _open_lock:
        service, users = _open[warehouse]
        if users == 1:
            del _open[warehouse]
            service.close()
        else:
            _open[warehouse] = (service, users - 1)


def _ident(identifier: str | IdentifierTuple) -> Identifier:
    parts = MetastoreCatalog.identifier_to_tuple(identifier)
    return Identifier.of(parts[:-1], parts[-1])


def _namespace(namespace: str | IdentifierTuple) -> tuple[str, ...]:
    return MetastoreCatalog.identifier_to_tuple(namespace)


class LmdbCatalog(MetastoreCatalog):
    def __init__(self, name: str, **properties: str) -> None:
        super().__init__(name, **properties)
        warehouse = properties.get("warehouse")
        if not warehouse:
            raise ValueError("LmdbCatalog needs a 'warehouse' directory")
        path = local_path(warehouse) or Path(warehouse)
        self._warehouse = path.resolve()
        self._service = _acquire(self._warehouse)
        self._closed = False
        self.properties["warehouse"] = self._service.core.warehouse

    @property
    def service(self) -> CatalogService:
        return self._service

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _release(self._warehouse)

    def _table(self, state: TableState) -> Table:
        return Table(
            identifier=(*state.ident.namespace, state.ident.name),
            metadata=state.metadata,
            metadata_location=state.metadata_location or "",
            io=self._load_file_io(state.metadata.properties, state.metadata_location),
            catalog=self,
        )

    # -- tables

    def create_table(
        self,
        identifier: str | IdentifierTuple,
        schema: Schema | pa.Schema,
        location: str | None = None,
        partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
        sort_order: SortOrder = UNSORTED_SORT_ORDER,
        properties: Properties = EMPTY_DICT,
    ) -> Table:
        format_version = int(
            properties.get(TableProperties.FORMAT_VERSION, TableProperties.DEFAULT_FORMAT_VERSION)
        )
        iceberg_schema: Schema = self._convert_schema_if_needed(schema, format_version)  # type: ignore[arg-type]
        state = self._service.tables.create(
            _ident(identifier), iceberg_schema, partition_spec, sort_order, location, dict(properties)
        )
        return self._table(state)

    def load_table(self, identifier: str | IdentifierTuple) -> Table:
        return self._table(self._service.tables.load(_ident(identifier)))

    def register_table(
        self, identifier: str | IdentifierTuple, metadata_location: str, overwrite: bool = False
    ) -> Table:
        return self._table(self._service.tables.register(_ident(identifier), metadata_location, overwrite))

    def coverage(self, identifier: str | IdentifierTuple) -> Coverage:
        """The source offsets the table holds, as sinks declared them in their commits."""
        return self._service.tables.coverage(_ident(identifier)).coverage

    def commit_seq_of(self, identifier: str | IdentifierTuple, snapshot_id: int) -> int | None:
        """The `commit_seq` of the commit that added `snapshot_id` with sink spans, if one did."""
        return self._service.tables.coverage(_ident(identifier), snapshot_id).commit_seq

    def drop_table(self, identifier: str | IdentifierTuple) -> None:
        self._service.tables.drop(_ident(identifier))

    def purge_table(self, identifier: str | IdentifierTuple) -> None:
        self._service.tables.drop(_ident(identifier), purge=True)

    def rename_table(
        self, from_identifier: str | IdentifierTuple, to_identifier: str | IdentifierTuple
    ) -> Table:
        self._service.tables.rename(_ident(from_identifier), _ident(to_identifier))
        return self.load_table(to_identifier)

    def commit_table(
        self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]
    ) -> CommitTableResponse:
        state = self._service.tables.commit(TableChange(_ident(table.name()), requirements, updates))
        return CommitTableResponse(metadata=state.metadata, metadata_location=state.metadata_location)

    def list_tables(self, namespace: str | IdentifierTuple) -> list[IdentifierTuple]:
        return [(*i.namespace, i.name) for i in self._service.tables.listing(_namespace(namespace))]

    # -- namespaces

    def create_namespace(self, namespace: str | IdentifierTuple, properties: Properties = EMPTY_DICT) -> None:
        self._service.namespaces.create(_namespace(namespace), dict(properties))

    def drop_namespace(self, namespace: str | IdentifierTuple) -> None:
        self._service.namespaces.drop(_namespace(namespace))

    def list_namespaces(self, namespace: str | IdentifierTuple = ()) -> list[IdentifierTuple]:
        return self._service.namespaces.listing(_namespace(namespace))

    def load_namespace_properties(self, namespace: str | IdentifierTuple) -> Properties:
        return self._service.namespaces.load(_namespace(namespace))

    def update_namespace_properties(
        self,
        namespace: str | IdentifierTuple,
        removals: set[str] | None = None,
        updates: Properties = EMPTY_DICT,
    ) -> PropertiesUpdateSummary:
        change = self._service.namespaces.update_properties(
            _namespace(namespace), sorted(removals or ()), dict(updates)
        )
        return PropertiesUpdateSummary(removed=change.removed, updated=change.updated, missing=change.missing)

    # -- views

    def create_view(
        self,
        identifier: str | IdentifierTuple,
        schema: Schema | pa.Schema,
        view_version: ViewVersion,
        location: str | None = None,
        properties: Properties = EMPTY_DICT,
    ) -> View:
        iceberg_schema: Schema = self._convert_schema_if_needed(schema)  # type: ignore[arg-type]
        state = self._service.views.create(
            _ident(identifier), iceberg_schema, view_version, location, dict(properties)
        )
        return View((*state.ident.namespace, state.ident.name), state.metadata)

    def load_view(self, identifier: str | IdentifierTuple) -> View:
        state = self._service.views.load(_ident(identifier))
        return View((*state.ident.namespace, state.ident.name), state.metadata)

    def list_views(self, namespace: str | IdentifierTuple) -> list[IdentifierTuple]:
        return [(*i.namespace, i.name) for i in self._service.views.listing(_namespace(namespace))]

    def view_exists(self, identifier: str | IdentifierTuple) -> bool:
        try:
            self._service.views.load(_ident(identifier))
        except Exception:
            return False
        return True

    def drop_view(self, identifier: str | IdentifierTuple) -> None:
        self._service.views.drop(_ident(identifier))

    def register_view(self, identifier: str | IdentifierTuple, metadata_location: str) -> View:
        state = self._service.views.register(_ident(identifier), metadata_location)
        return View((*state.ident.namespace, state.ident.name), state.metadata)

    def __getstate__(self) -> Any:
        raise TypeError("LmdbCatalog holds an open LMDB environment and cannot be pickled")
