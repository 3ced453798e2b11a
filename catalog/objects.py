"""What tables and views share beyond their own operations: listing them, dropping and renaming
them (one mutation each, the same for both kinds), and indexing the locations of a store made
before locations were indexed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from isbre.catalog.commit_log import TABLE_CONSUMERS
from isbre.catalog.identifiers import Identifier, check_namespace
from isbre.catalog.locations import normalized
from isbre.catalog.places import unplace
from isbre.catalog.records import CommitRecord
from isbre.catalog.request_context import RequestContext
from isbre.catalog.service_core import (
    TABLE,
    VIEW,
    ServiceCore,
    require_free,
    require_namespace,
    require_object,
)
from isbre.catalog.store import Pointer, ReadView
from isbre.catalog.writer import Batch
from pyiceberg.exceptions import NoSuchNamespaceError

log = logging.getLogger(__name__)


def list_objects(
    core: ServiceCore, kind: str, namespace: tuple[str, ...], after: str | None, limit: int | None
) -> list[Identifier]:
    namespace = check_namespace(namespace)
    with core.store.read(core.scope) as view:
        if view.namespace(namespace) is None:
            raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(namespace)}")
        return view.identifiers(kind, namespace, after, limit)


def drop_object(
    core: ServiceCore,
    kind: str,
    ident: Identifier,
    context: RequestContext,
    properties: dict[str, Any] | None = None,
) -> Pointer:
    def mutation(batch: Batch) -> Pointer:
        pointer = require_object(batch.view, kind, ident)
        batch.view.delete_pointer(kind, ident)
        unplace(batch.view, pointer.uuid)
        if kind == TABLE:
            batch.view.drop_coverage(pointer.uuid)
            for name in batch.view.cursors():  # the table's consumers go with it
                if name.startswith(f"{TABLE_CONSUMERS}{pointer.uuid}:"):
                    batch.view.delete_cursor(name)
        gone = {"previous_metadata_location": pointer.metadata_location, "properties": properties}
        batch.log(_record(kind, "drop", ident, pointer, **gone))
        return pointer

    return core.mutate(mutation, context=context)


def rename_object(
    core: ServiceCore, kind: str, source: Identifier, target: Identifier, context: RequestContext
) -> None:
    def mutation(batch: Batch) -> None:
        pointer = require_object(batch.view, kind, source)
        require_namespace(batch.view, target.namespace)
        require_free(batch.view, target, kind, renamed=source)
        batch.view.delete_pointer(kind, source)
        batch.view.put_pointer(kind, target, pointer)
        previous = {"namespace": list(source.namespace), "name": source.name}
        where = pointer.metadata_location
        batch.log(_record(kind, "rename", target, pointer, metadata_location=where, previous=previous))

    core.mutate(mutation, context=context)


def _record(kind: str, action: str, ident: Identifier, pointer: Pointer, **fields: Any) -> CommitRecord:
    return CommitRecord(
        f"{kind}.{action}", list(ident.namespace), ident.name, table_uuid=pointer.uuid, **fields
    )


def index_locations(core: ServiceCore) -> None:
    """Stores made before locations were indexed: index every table's and view's location, once."""
    with core.store.read(core.scope) as view:
        if view.marker("locations"):
            return
        pointers = [(kind, p) for kind in (TABLE, VIEW) for p in _every_pointer(view, kind)]
    placed = []
    for kind, pointer in pointers:
        cache = core.table_files if kind == TABLE else core.view_files
        try:
            placed.append((pointer.uuid, normalized(cache.get(pointer.metadata_location).metadata.location)))
        except Exception as exc:
            log.warning("cannot index the location of %s %s: %s", kind, pointer.uuid, exc)

    def mutation(batch: Batch) -> None:
        if not batch.view.marker("locations"):
            for owner, location in placed:
                batch.view.place(owner, location)
            batch.view.set_marker("locations")

    core.run(mutation)


def _every_pointer(view: ReadView, kind: str, parent: tuple[str, ...] = ()) -> Iterator[Pointer]:
    for namespace in view.namespaces(parent, None, None):
        for ident in view.identifiers(kind, namespace, None, None):
            pointer = view.pointer(kind, ident)
            if pointer is not None:
                yield pointer
        yield from _every_pointer(view, kind, namespace)
