"""Format version 3 table metadata, which isbre writes itself.

PyIceberg parses v3 metadata and applies updates to it, but refuses to write
it (its `model_dump_json` raises) and has no model for the table's encryption
keys. `TableMetadataV3` here is PyIceberg's model with both: it serializes
with PyIceberg's own field serializers and carries `encryption-keys`, with the
`add-encryption-key` and `remove-encryption-key` updates of the REST spec.
Everything v3 isbre holds goes through `as_v3`, so no PyIceberg v3 object that
cannot be written ever reaches a metadata file or an answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, Union, get_args

from isbre.catalog.pyiceberg_internals import UpdateContext
from pydantic import Field
from pyiceberg.table import metadata as pyiceberg_metadata
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableUpdate
from pyiceberg.typedef import IcebergBaseModel

# Where a v3 table's row ids start (the spec's initial next-row-id).
INITIAL_ROW_ID = 0


class EncryptedKey(IcebergBaseModel):
    key_id: str = Field(alias="key-id")
    encrypted_key_metadata: str = Field(alias="encrypted-key-metadata")
    encrypted_by_id: str | None = Field(alias="encrypted-by-id", default=None)
    properties: dict[str, str] | None = Field(default=None)


class AddEncryptionKeyUpdate(IcebergBaseModel):
    action: Literal["add-encryption-key"] = Field(default="add-encryption-key")
    encryption_key: EncryptedKey = Field(alias="encryption-key")


class RemoveEncryptionKeyUpdate(IcebergBaseModel):
    action: Literal["remove-encryption-key"] = Field(default="remove-encryption-key")
    key_id: str = Field(alias="key-id")


class TableMetadataV3(pyiceberg_metadata.TableMetadataV3):
    encryption_keys: list[EncryptedKey] = Field(alias="encryption-keys", default_factory=list)

    # PyIceberg's own override (the one that raises) has this signature, narrower than pydantic's.
    def model_dump_json(  # type: ignore[override]
        self, exclude_none: bool = True, exclude: Any | None = None, by_alias: bool = True, **kwargs: Any
    ) -> str:
        if not self.encryption_keys:  # written only when there are some
            exclude = {*(exclude or ()), "encryption_keys"}
        return IcebergBaseModel.model_dump_json(
            self, exclude_none=exclude_none, exclude=exclude, by_alias=by_alias, **kwargs
        )


def as_v3(metadata: TableMetadata) -> TableMetadata:
    """`metadata` as isbre's v3 model when it is v3 (next-row-id set); anything else as it is."""
    if metadata.format_version != 3:
        return metadata
    fields: dict[str, Any] = dict(metadata)
    if fields.get("next_row_id") is None:
        fields["next_row_id"] = INITIAL_ROW_ID
    if isinstance(metadata, TableMetadataV3):
        return metadata if metadata.next_row_id is not None else metadata.model_copy(update=fields)
    return TableMetadataV3.model_construct(**fields, _fields_set=metadata.model_fields_set)


def apply_encryption_update(
    update: AddEncryptionKeyUpdate | RemoveEncryptionKeyUpdate,
    metadata: TableMetadata,
    context: UpdateContext,
) -> TableMetadata:
    if not isinstance(metadata, TableMetadataV3):
        raise ValueError(
            f"{update.action} needs format version 3 (this table is version {metadata.format_version})"
        )
    keys = list(metadata.encryption_keys)
    if isinstance(update, AddEncryptionKeyUpdate):
        if any(key.key_id == update.encryption_key.key_id for key in keys):
            raise ValueError(f"Encryption key {update.encryption_key.key_id!r} already exists")
        keys.append(update.encryption_key)
    else:
        if not any(key.key_id == update.key_id for key in keys):
            raise ValueError(f"Encryption key {update.key_id!r} does not exist")
        keys = [key for key in keys if key.key_id != update.key_id]
    context.add_update(update)  # type: ignore[arg-type]
    return metadata.model_copy(update={"encryption_keys": keys})


# Every update of the REST spec: PyIceberg's, and the encryption-key updates it lacks.
if TYPE_CHECKING:
    AnyTableUpdate: TypeAlias = TableUpdate | AddEncryptionKeyUpdate | RemoveEncryptionKeyUpdate
else:  # one flat union, for pydantic to pick the model by its `action`
    AnyTableUpdate = Annotated[
        Union[(*get_args(get_args(TableUpdate)[0]), AddEncryptionKeyUpdate, RemoveEncryptionKeyUpdate)],
        Field(discriminator="action"),
    ]
