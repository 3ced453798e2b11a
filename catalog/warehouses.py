"""The warehouses a server serves: each a storage root (a local directory or `s3://bucket/prefix`)
whose namespaces, tables and views live in one shared store, under one commit log."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from isbre.catalog.file_uris import file_uri
from isbre.catalog.limits import Limits
from isbre.catalog.manifest_cache import ManifestCache
from isbre.catalog.object_storage import ObjectStorageIO
from isbre.catalog.s3_options import S3Options
from isbre.catalog.service import MANIFEST_CACHE_BYTES, CatalogService
from isbre.catalog.service_core import METADATA_SYNC_S
from isbre.catalog.store import FIRST_WAREHOUSE
from isbre.catalog.stores import open_store, store_files
from isbre.catalog.warehouse_config import Warehouse, default_store
from pyiceberg.table.metadata import TableMetadata


def open_warehouses(
    store: str | Path | None,
    warehouses: Sequence[Warehouse],
    map_size: int = 256 << 20,
    max_batch: int = 512,
    max_queue: int = 10_000,
    allowed_locations: tuple[str, ...] = (),
    limits: Limits | None = None,
    on_fatal: Callable[[BaseException], None] | None = None,
    manifest_cache_bytes: int = MANIFEST_CACHE_BYTES,
    metadata_sync_s: float = METADATA_SYNC_S,
    commit_wait_s: float = 0.0,
) -> list[CatalogService]:
    """One service per warehouse, in order, sharing the store at `store` (an LMDB directory or a
    postgresql:// URL; default: see `default_store`) and its writer. The first warehouse owns the
    store's unnamed scope."""
    if not warehouses:
        raise ValueError("no warehouse to serve")
    names = [w.name for w in warehouses]
    if len(set(names)) != len(names):
        raise ValueError(f"warehouse names repeat: {names}")
    opened = open_store(store or default_store(warehouses[0]), map_size=map_size, warehouses=tuple(names[1:]))
    services: list[CatalogService] = []
    manifests = ManifestCache(manifest_cache_bytes)
    for position, warehouse in enumerate(warehouses):
        root = warehouse.local_root()
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
        services.append(
            CatalogService(
                opened,
                file_uri(root) if root is not None else warehouse.root,
                io=None if root is not None else ObjectStorageIO(warehouse.s3 or S3Options()),
                max_batch=max_batch,
                max_queue=max_queue,
                commit_wait_s=commit_wait_s,
                allowed_locations=allowed_locations,
                limits=limits,
                protected=store_files(opened),
                on_fatal=on_fatal,
                name=warehouse.name,
                scope=FIRST_WAREHOUSE if position == 0 else warehouse.name,
                writer=services[0].core.writer if services else None,
                metadata_sync_s=metadata_sync_s,
                settler=services[0].core.settler if services else None,
                table_defaults=warehouse.table_defaults,
                manifests=manifests,
            )
        )
    settler = services[0].core.settler
    if settler is not None:  # restores what a crash lost before anything is served
        settler.start(root for service in services for root in service.core.places.policy.roots)
    return services


def read_metadata(services: Sequence[CatalogService], location: str) -> TableMetadata | None:
    """Table metadata at `location`, read through the warehouse it lies in (the first by default)."""
    holder = next((s for s in services if location.startswith(s.core.warehouse + "/")), services[0])
    return holder.tables.metadata_or_none(location)


def open_catalog(warehouse: Path, **options: Any) -> CatalogService:
    """The embedded catalog: LMDB under `<warehouse>/isbre.lmdb`, tables under `<warehouse>/`;
    `options` are those of `open_warehouses`."""
    (service,) = open_warehouses(None, [Warehouse("isbre", str(warehouse))], **options)
    return service
