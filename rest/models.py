"""Request bodies of the REST API, on PyIceberg's own models where the spec shares them.

PyIceberg's client-side request classes make some optional fields required, so
the server declares its own envelopes around PyIceberg's schema, spec, update
and requirement models.
"""

from __future__ import annotations

from isbre.catalog.format_v3 import AnyTableUpdate
from isbre.catalog.identifiers import Identifier
from isbre.catalog.view_staging import ViewRequirement, ViewUpdate
from pydantic import ConfigDict, Field, model_validator
from pyiceberg.catalog.rest import scan_planning
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import SortOrder
from pyiceberg.table.update import TableRequirement
from pyiceberg.typedef import IcebergBaseModel
from pyiceberg.view.metadata import ViewVersion


class CreateNamespaceRequest(IcebergBaseModel):
    namespace: list[str]
    properties: dict[str, str] = Field(default_factory=dict)


class UpdateNamespacePropertiesRequest(IcebergBaseModel):
    removals: list[str] = Field(default_factory=list)
    updates: dict[str, str] = Field(default_factory=dict)


class TableIdentifierModel(IcebergBaseModel):
    namespace: list[str]
    name: str

    def to_identifier(self) -> Identifier:
        return Identifier.of(self.namespace, self.name)


class CreateTableRequest(IcebergBaseModel):
    name: str
    location: str | None = None
    table_schema: Schema = Field(alias="schema")
    partition_spec: PartitionSpec | None = Field(alias="partition-spec", default=None)
    write_order: SortOrder | None = Field(alias="write-order", default=None)
    stage_create: bool = Field(alias="stage-create", default=False)
    properties: dict[str, str] = Field(default_factory=dict)


class RegisterTableRequest(IcebergBaseModel):
    name: str
    metadata_location: str = Field(alias="metadata-location")
    overwrite: bool = False


class MaintenanceRequest(IcebergBaseModel):
    """isbre extension: the maintenance jobs to run on a table now, in order."""

    jobs: list[str] = Field(min_length=1)


class CommitTableRequest(IcebergBaseModel):
    identifier: TableIdentifierModel | None = None
    requirements: tuple[TableRequirement, ...] = ()
    updates: tuple[AnyTableUpdate, ...] = ()


class CommitTransactionRequest(IcebergBaseModel):
    table_changes: list[CommitTableRequest] = Field(alias="table-changes")


class RenameTableRequest(IcebergBaseModel):
    source: TableIdentifierModel
    destination: TableIdentifierModel


class CreateViewRequest(IcebergBaseModel):
    name: str
    location: str | None = None
    view_schema: Schema = Field(alias="schema")
    view_version: ViewVersion = Field(alias="view-version")
    properties: dict[str, str] = Field(default_factory=dict)


class CommitViewRequest(IcebergBaseModel):
    identifier: TableIdentifierModel | None = None
    requirements: tuple[ViewRequirement, ...] = ()
    updates: tuple[ViewUpdate, ...]


class RegisterViewRequest(IcebergBaseModel):
    name: str
    metadata_location: str = Field(alias="metadata-location")


class ReportMetricsRequest(IcebergBaseModel):
    report_type: str = Field(alias="report-type")
    table_name: str = Field(alias="table-name")


class SignRequest(IcebergBaseModel):
    """An S3 request to sign (the spec's RemoteSignRequest). Its body comes along only where the
    signer must judge it (DeleteObjects); rest/s3_signer.py bounds headers, URI and body."""

    model_config = ConfigDict(extra="ignore")

    method: str = Field(pattern=r"^[A-Za-z]{1,16}$")
    region: str
    uri: str
    headers: dict[str, list[str]] = Field(default_factory=dict)
    body: str | None = None
    provider: str | None = None
    properties: dict[str, str] = Field(default_factory=dict)


class PlanTableScanRequest(scan_planning.PlanTableScanRequest):
    """The spec's plan request, and isbre's commit cursor (`isbre-after-commit-seq`): the files the
    table's commits after that one added, or with `isbre-changes` what they inserted and deleted."""

    after_commit_seq: int | None = Field(None, alias="isbre-after-commit-seq", ge=0)
    changes: bool = Field(False, alias="isbre-changes")

    @model_validator(mode="after")
    def _one_kind_of_scan(self) -> PlanTableScanRequest:
        if self.changes and self.after_commit_seq is None:
            raise ValueError("isbre-changes plans changes after a commit: isbre-after-commit-seq is required")
        if self.after_commit_seq is not None and (
            self.snapshot_id is not None
            or self.start_snapshot_id is not None
            or self.end_snapshot_id is not None
        ):
            raise ValueError(
                "isbre-after-commit-seq cannot be combined with snapshot-id or start/end-snapshot-id"
            )
        if self.end_snapshot_id is not None and self.snapshot_id is not None:
            raise ValueError("Cannot specify both snapshot-id and end-snapshot-id")
        return self


class ConsumerCursorRequest(IcebergBaseModel):
    """isbre extension: move a table consumer's cursor to `commit-seq` if it is at
    `expected-commit-seq` (null or left out: if the consumer has no cursor yet)."""

    model_config = ConfigDict(extra="forbid")

    commit_seq: int = Field(alias="commit-seq", ge=0)
    expected_commit_seq: int | None = Field(None, alias="expected-commit-seq", ge=0)
