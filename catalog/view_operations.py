"""View operations: like a table's, a view's commit writes its metadata file, then swaps the pointer."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from isbre.catalog.identifiers import Identifier
from isbre.catalog.metadata_files import (
    Loaded,
    metadata_json,
    remove_quietly,
    write_durably,
)
from isbre.catalog.objects import drop_object, list_objects, rename_object
from isbre.catalog.places import claim_places, named_places
from isbre.catalog.pointer_swap import Stale
from isbre.catalog.records import CommitRecord
from isbre.catalog.request_context import ANONYMOUS, RequestContext
from isbre.catalog.service_core import VIEW, ServiceCore, read_for_register, require_free, require_namespace
from isbre.catalog.store import Pointer
from isbre.catalog.table_commit import StagingLocks, retrying
from isbre.catalog.table_staging import next_metadata_location
from isbre.catalog.view_staging import ViewRequirement, ViewUpdate, new_view_metadata, update_view_metadata
from isbre.catalog.writer import Batch
from pyiceberg.exceptions import NoSuchViewError, ViewAlreadyExistsError
from pyiceberg.schema import Schema
from pyiceberg.view.metadata import ViewMetadata, ViewVersion


@dataclass(frozen=True)
class ViewState:
    ident: Identifier
    metadata_location: str
    metadata: ViewMetadata
    json: bytes


class Views:
    """A warehouse's views: loaded, created, replaced, registered, renamed and dropped."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core
        self.locks = StagingLocks()

    def load(self, ident: Identifier) -> ViewState:
        with self.core.store.read(self.core.scope) as view:
            pointer = view.pointer(VIEW, ident)
        if pointer is None:
            raise NoSuchViewError(f"View does not exist: {ident}")
        loaded = self.core.view_files.get(pointer.metadata_location)
        return ViewState(ident, pointer.metadata_location, loaded.metadata, loaded.json)

    def listing(self, namespace: tuple[str, ...], after: str | None = None, limit: int | None = None):
        return list_objects(self.core, VIEW, namespace, after, limit)

    def create(
        self,
        ident: Identifier,
        schema: Schema,
        version: ViewVersion,
        location: str | None = None,
        properties: dict[str, str] | None = None,
        context: RequestContext = ANONYMOUS,
    ) -> ViewState:
        view_uuid = uuid.uuid4()
        location = (location or "").rstrip("/") or self.core.default_location(
            ident.namespace, ident.name, view_uuid
        )
        self.core.places.check_all(named_places(location, properties or {}), "View", context.places)
        metadata = new_view_metadata(view_uuid, location, schema, version, dict(properties or {}))
        return self._swap_view(ident, None, metadata, True, context)

    def replace(
        self,
        ident: Identifier,
        requirements: tuple[ViewRequirement, ...],
        updates: tuple[ViewUpdate, ...],
        context: RequestContext = ANONYMOUS,
    ) -> ViewState:
        def attempt() -> ViewState:
            current = self.load(ident)
            for requirement in requirements:
                requirement.validate_against(current.metadata)
            metadata = update_view_metadata(current.metadata, updates)
            if metadata == current.metadata:
                return current
            where = named_places(metadata.location, metadata.properties)
            moved = where != named_places(current.metadata.location, current.metadata.properties)
            if moved:
                self.core.places.check_all(where, "View", context.places, str(metadata.view_uuid))
            base = Pointer(current.metadata_location, current.metadata.view_uuid)
            return self._swap_view(ident, base, metadata, moved, context)

        with self.locks.holding([ident]):
            return retrying(attempt)

    def _swap_view(
        self,
        ident: Identifier,
        base: Pointer | None,
        metadata: ViewMetadata,
        moved: bool,
        context: RequestContext,
    ) -> ViewState:
        data = metadata_json(metadata)
        self.core.limits.check_properties(metadata.properties, "View")
        self.core.limits.check_metadata(data, "View")
        self.core.limits.check_room(self.core.local_warehouse)
        previous = base.metadata_location if base else None
        location = next_metadata_location(metadata.location, metadata.properties, previous)
        pointer = Pointer(location, metadata.view_uuid)
        write_durably(self.core.io, self.core.roots, location, data)

        def mutation(batch: Batch) -> ViewState:
            if batch.view.pointer(VIEW, ident) != base:
                if base is None:
                    raise ViewAlreadyExistsError(f"View already exists: {ident}")
                raise Stale
            if base is None:
                require_namespace(batch.view, ident.namespace)
                require_free(batch.view, ident, VIEW)
            if moved:
                where = named_places(metadata.location, metadata.properties)
                claim_places(batch.view, metadata.view_uuid, where, "View")
            batch.view.put_pointer(VIEW, ident, pointer)
            batch.log(
                CommitRecord(
                    "view.create" if base is None else "view.replace",
                    list(ident.namespace),
                    ident.name,
                    table_uuid=metadata.view_uuid,
                    metadata_location=location,
                    previous_metadata_location=base.metadata_location if base else None,
                )
            )
            return ViewState(ident, location, metadata, data)

        try:
            state = self.core.mutate(mutation, context=context, answer=lambda state: state.metadata_location)
        except BaseException:
            remove_quietly(self.core.io, self.core.roots, location)
            raise
        self.core.view_files.put(location, Loaded(metadata, data))
        return state

    def drop(self, ident: Identifier, context: RequestContext = ANONYMOUS) -> None:
        drop_object(self.core, VIEW, ident, context)

    def rename(self, source: Identifier, target: Identifier, context: RequestContext = ANONYMOUS) -> None:
        rename_object(self.core, VIEW, source, target, context)

    def register(
        self,
        ident: Identifier,
        metadata_location: str,
        context: RequestContext = ANONYMOUS,
    ) -> ViewState:
        policy = context.places or self.core.places.policy
        loaded = read_for_register(self.core.view_files, policy, metadata_location)
        where = named_places(loaded.metadata.location, loaded.metadata.properties)
        self.core.places.check_all(where, "View", context.places, writes_to=None)

        def mutation(batch: Batch) -> ViewState:
            require_namespace(batch.view, ident.namespace)
            require_free(batch.view, ident, VIEW)
            claim_places(batch.view, loaded.metadata.view_uuid, where, "View", moving=False)
            batch.view.put_pointer(VIEW, ident, Pointer(metadata_location, loaded.metadata.view_uuid))
            batch.log(
                CommitRecord(
                    "view.register",
                    list(ident.namespace),
                    ident.name,
                    table_uuid=loaded.metadata.view_uuid,
                    metadata_location=metadata_location,
                )
            )
            return ViewState(ident, metadata_location, loaded.metadata, loaded.json)

        return self.core.mutate(mutation, context=context, answer=lambda state: state.metadata_location)
