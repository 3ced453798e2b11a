"""Namespace operations."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from isbre.catalog.identifiers import check_namespace
from isbre.catalog.locations import LocationPolicy
from isbre.catalog.records import CommitRecord
from isbre.catalog.request_context import ANONYMOUS, RequestContext
from isbre.catalog.service_core import ServiceCore, require_namespace
from isbre.catalog.writer import Batch
from pyiceberg.exceptions import (
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
)


class ConflictingPropertiesError(ValueError):
    """A property key appears in both the updates and the removals of one request."""


@dataclass(frozen=True)
class PropertiesChange:
    updated: list[str]
    removed: list[str]
    missing: list[str]


class Namespaces:
    """A warehouse's namespaces: created, read, listed, changed and dropped through its core."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core

    def _check_namespace_properties(self, properties: dict[str, str], places: LocationPolicy | None) -> None:
        self.core.limits.check_properties(properties, "Namespace")
        if "location" in properties:
            self.core.places.check(properties["location"], "Namespace location", places, writes_to=None)

    def create(
        self,
        namespace: tuple[str, ...],
        properties: dict[str, str],
        context: RequestContext = ANONYMOUS,
    ) -> dict[str, str]:
        namespace = check_namespace(namespace)
        self._check_namespace_properties(properties, context.places)

        def mutation(batch: Batch) -> dict[str, str]:
            if batch.view.namespace(namespace) is not None:
                raise NamespaceAlreadyExistsError(f"Namespace already exists: {'.'.join(namespace)}")
            if len(namespace) > 1:
                require_namespace(batch.view, namespace[:-1])
            batch.view.put_namespace(namespace, properties)
            batch.log(CommitRecord("namespace.create", list(namespace), properties=dict(properties)))
            return properties

        return self.core.mutate(mutation, context=context, answer=lambda properties: properties)

    def load(self, namespace: tuple[str, ...]) -> dict[str, str]:
        namespace = check_namespace(namespace)
        with self.core.store.read(self.core.scope) as view:
            properties = view.namespace(namespace)
        if properties is None:
            raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(namespace)}")
        return properties

    def listing(
        self, parent: tuple[str, ...], after: tuple[str, ...] | None = None, limit: int | None = None
    ) -> list[tuple[str, ...]]:
        with self.core.store.read(self.core.scope) as view:
            if parent and view.namespace(check_namespace(parent)) is None:
                raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(parent)}")
            return view.namespaces(parent, after, limit)

    def drop(self, namespace: tuple[str, ...], context: RequestContext = ANONYMOUS) -> None:
        namespace = check_namespace(namespace)

        def mutation(batch: Batch) -> None:
            require_namespace(batch.view, namespace)
            if not batch.view.is_empty(namespace):
                raise NamespaceNotEmptyError(f"Namespace is not empty: {'.'.join(namespace)}")
            batch.view.delete_namespace(namespace)
            batch.log(CommitRecord("namespace.drop", list(namespace)))

        self.core.mutate(mutation, context=context)

    def update_properties(
        self,
        namespace: tuple[str, ...],
        removals: list[str],
        updates: dict[str, str],
        context: RequestContext = ANONYMOUS,
    ) -> PropertiesChange:
        namespace = check_namespace(namespace)
        overlap = set(removals) & set(updates)
        if overlap:
            raise ConflictingPropertiesError(f"Properties are both updated and removed: {sorted(overlap)}")
        self._check_namespace_properties(updates, context.places)

        def mutation(batch: Batch) -> PropertiesChange:
            properties = dict(require_namespace(batch.view, namespace))
            removed = [key for key in removals if key in properties]
            missing = [key for key in removals if key not in properties]
            for key in removed:
                del properties[key]
            properties.update(updates)
            batch.view.put_namespace(namespace, properties)
            batch.log(
                CommitRecord(
                    "namespace.update", list(namespace), properties={"updated": updates, "removed": removed}
                )
            )
            return PropertiesChange(sorted(updates), removed, missing)

        return self.core.mutate(mutation, context=context, answer=dataclasses.asdict)
