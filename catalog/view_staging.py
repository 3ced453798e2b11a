"""View metadata changes: the spec's view updates and requirements, applied to PyIceberg's ViewMetadata.

PyIceberg models view metadata but has no update machinery for it, so the
actions of the REST spec's `ViewUpdate` are applied here. Updates shared with
tables reuse PyIceberg's update classes.
"""

from __future__ import annotations

import uuid
from functools import singledispatch
from typing import Annotated, Literal

from pydantic import Field
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AssignUUIDUpdate,
    RemovePropertiesUpdate,
    SetLocationUpdate,
    SetPropertiesUpdate,
    UpgradeFormatVersionUpdate,
)
from pyiceberg.typedef import IcebergBaseModel
from pyiceberg.view.metadata import ViewHistoryEntry, ViewMetadata, ViewVersion

LAST_ADDED = -1


class AddViewVersionUpdate(IcebergBaseModel):
    action: Literal["add-view-version"] = Field(default="add-view-version")
    view_version: ViewVersion = Field(alias="view-version")


class SetCurrentViewVersionUpdate(IcebergBaseModel):
    action: Literal["set-current-view-version"] = Field(default="set-current-view-version")
    view_version_id: int = Field(alias="view-version-id")


ViewUpdate = Annotated[
    AssignUUIDUpdate
    | UpgradeFormatVersionUpdate
    | AddSchemaUpdate
    | SetLocationUpdate
    | SetPropertiesUpdate
    | RemovePropertiesUpdate
    | AddViewVersionUpdate
    | SetCurrentViewVersionUpdate,
    Field(discriminator="action"),
]


class AssertViewUUID(IcebergBaseModel):
    type: Literal["assert-view-uuid"] = Field(default="assert-view-uuid")
    uuid: uuid.UUID

    def validate_against(self, metadata: ViewMetadata) -> None:
        if str(self.uuid) != metadata.view_uuid:
            raise CommitFailedException(
                f"Requirement failed: view UUID does not match: expected {metadata.view_uuid} != {self.uuid}"
            )


ViewRequirement = Annotated[AssertViewUUID, Field(discriminator="type")]


class _Builder:
    """Mutable working copy; tracks the ids "last added" refers to."""

    def __init__(self, base: ViewMetadata) -> None:
        self.fields = base.model_dump(by_alias=False)
        self.schemas: list[Schema] = list(base.schemas)
        self.versions: list[ViewVersion] = list(base.versions)
        self.log: list[ViewHistoryEntry] = list(base.version_log)
        self.last_schema_id: int | None = None
        self.last_version_id: int | None = None

    def build(self) -> ViewMetadata:
        return ViewMetadata(
            **{
                **self.fields,
                "schemas": self.schemas,
                "versions": self.versions,
                "version_log": self.log,
            }
        )


@singledispatch
def _apply(update: object, builder: _Builder) -> None:
    raise ValueError(f"Unsupported view update: {update}")


@_apply.register
def _(update: AssignUUIDUpdate, builder: _Builder) -> None:
    current = builder.fields.get("view_uuid")
    if current and current != str(update.uuid):
        raise ValueError(f"Cannot reassign view UUID {current} to {update.uuid}")
    builder.fields["view_uuid"] = str(update.uuid)


@_apply.register
def _(update: UpgradeFormatVersionUpdate, builder: _Builder) -> None:
    if update.format_version != 1:
        raise ValueError(f"Unsupported view format version: {update.format_version}")


@_apply.register
def _(update: AddSchemaUpdate, builder: _Builder) -> None:
    schema = update.schema_
    for known in builder.schemas:
        if known.fields == schema.fields and known.identifier_field_ids == schema.identifier_field_ids:
            builder.last_schema_id = known.schema_id
            return
    new_id = max((s.schema_id for s in builder.schemas), default=-1) + 1
    builder.schemas.append(schema.model_copy(update={"schema_id": new_id}))
    builder.last_schema_id = new_id


@_apply.register
def _(update: SetLocationUpdate, builder: _Builder) -> None:
    builder.fields["location"] = update.location


@_apply.register
def _(update: SetPropertiesUpdate, builder: _Builder) -> None:
    builder.fields["properties"] = {**builder.fields["properties"], **update.updates}


@_apply.register
def _(update: RemovePropertiesUpdate, builder: _Builder) -> None:
    builder.fields["properties"] = {
        k: v for k, v in builder.fields["properties"].items() if k not in set(update.removals)
    }


def _same_definition(a: ViewVersion, b: ViewVersion) -> bool:
    keys = ("schema_id", "representations", "default_catalog", "default_namespace", "summary")
    return all(getattr(a, key) == getattr(b, key) for key in keys)


class InvalidViewVersionError(ValueError):
    """A view version the Java reference refuses with IllegalArgumentException (400, that type)."""


def check_dialects(version: ViewVersion) -> None:
    dialects = [r.root.dialect.lower() for r in version.representations]
    for dialect in dialects:
        if dialects.count(dialect) > 1:
            raise InvalidViewVersionError(
                f"Invalid view version: Cannot add multiple queries for dialect {dialect}"
            )


@_apply.register
def _(update: AddViewVersionUpdate, builder: _Builder) -> None:
    version = update.view_version
    if version.schema_id == LAST_ADDED:
        if builder.last_schema_id is None:
            raise ValueError("Cannot use the last added schema: no schema was added")
        version = version.model_copy(update={"schema_id": builder.last_schema_id})
    if version.schema_id not in {s.schema_id for s in builder.schemas}:
        raise ValueError(f"View version refers to an unknown schema: {version.schema_id}")
    check_dialects(version)
    for known in builder.versions:
        if _same_definition(known, version):
            builder.last_version_id = known.version_id
            return
    new_id = max((v.version_id for v in builder.versions), default=0) + 1
    builder.versions.append(version.model_copy(update={"version_id": new_id}))
    builder.last_version_id = new_id


@_apply.register
def _(update: SetCurrentViewVersionUpdate, builder: _Builder) -> None:
    version_id = update.view_version_id
    if version_id == LAST_ADDED:
        if builder.last_version_id is None:
            raise ValueError("Cannot set the last added view version: no version was added")
        version_id = builder.last_version_id
    version = next((v for v in builder.versions if v.version_id == version_id), None)
    if version is None:
        raise ValueError(f"Cannot set current view version to unknown version: {version_id}")
    if builder.fields["current_version_id"] != version_id or not builder.log:
        builder.fields["current_version_id"] = version_id
        builder.log.append(ViewHistoryEntry(timestamp_ms=version.timestamp_ms, version_id=version_id))


def update_view_metadata(base: ViewMetadata, updates: tuple[ViewUpdate, ...]) -> ViewMetadata:
    builder = _Builder(base)
    for update in updates:
        _apply(update, builder)
    return builder.build()


def new_view_metadata(
    view_uuid: uuid.UUID, location: str, schema: Schema, version: ViewVersion, properties: dict[str, str]
) -> ViewMetadata:
    """Metadata for a new view, built by the same updates a commit would use."""
    empty = ViewMetadata(
        view_uuid=str(view_uuid),
        format_version=1,
        location=location,
        schemas=[],
        current_version_id=version.version_id,
        versions=[],
        version_log=[],
        properties={},
    )
    return update_view_metadata(
        empty,
        (
            AddSchemaUpdate(schema_=schema),
            SetPropertiesUpdate(updates=properties),
            AddViewVersionUpdate(view_version=version.model_copy(update={"schema_id": LAST_ADDED})),
            SetCurrentViewVersionUpdate(view_version_id=LAST_ADDED),
        ),
    )
