"""Commit records -> OpenLineage RunEvents, with openlineage-python's event and facet classes.

A table commit (or a multi-table transaction) is one run: a START and a
COMPLETE event sharing the record's stable `run_id`, the changed tables as
output datasets. What a writer declares in the snapshot summary under the
`isbre.lineage.*` keys adds the job name, inputs, column lineage and parent run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

from isbre.catalog.records import TABLE_KINDS, CommitRecord
from isbre.lineage.names import LineageNames, transaction_job
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    column_lineage_dataset,
    dataset_version_dataset,
    datasource_dataset,
    documentation_dataset,
    job_type_job,
    lifecycle_state_change_dataset,
    nominal_time_run,
    output_statistics_output_dataset,
    parent_run,
    schema_dataset,
    storage_dataset,
)
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import IcebergType, ListType, MapType, NestedField, StructType

log = logging.getLogger(__name__)
T = TypeVar("T")

# Snapshot-summary keys a writer sets to declare lineage (Spark: the `snapshot-property.<key>`
# write option; PyIceberg: `snapshot_properties`).
JOB_KEY = "isbre.lineage.job"
INPUTS_KEY = "isbre.lineage.inputs"
COLUMN_LINEAGE_KEY = "isbre.lineage.column-lineage"
PARENT_RUN_KEY = "isbre.lineage.parent-run"

_LIFECYCLE = {
    "table.create": lifecycle_state_change_dataset.LifecycleStateChange.CREATE,
    "table.drop": lifecycle_state_change_dataset.LifecycleStateChange.DROP,
    "table.rename": lifecycle_state_change_dataset.LifecycleStateChange.RENAME,
}


def _producer() -> str:
    try:
        return f"https://pypi.org/project/isbre/{version('isbre')}/"
    except PackageNotFoundError:
        return "https://pypi.org/project/isbre/"


PRODUCER = _producer()


def type_string(field_type: IcebergType) -> str:
    if isinstance(field_type, StructType):
        return "struct"
    if isinstance(field_type, ListType):
        return f"list<{type_string(field_type.element_type)}>"
    if isinstance(field_type, MapType):
        return f"map<{type_string(field_type.key_type)}, {type_string(field_type.value_type)}>"
    return str(field_type)


def _schema_fields(
    fields: tuple[NestedField, ...] | list[NestedField],
) -> list[schema_dataset.SchemaDatasetFacetFields]:
    result = []
    for field in fields:
        nested: list[NestedField] = []
        if isinstance(field.field_type, StructType):
            nested = list(field.field_type.fields)
        elif isinstance(field.field_type, ListType):
            nested = [field.field_type.element_field]
        elif isinstance(field.field_type, MapType):
            nested = [field.field_type.key_field, field.field_type.value_field]
        result.append(
            schema_dataset.SchemaDatasetFacetFields(
                name=field.name,
                type=type_string(field.field_type),
                description=field.doc,
                fields=_schema_fields(nested) if nested else [],
            )
        )
    return result


def _summary(metadata: TableMetadata | None, snapshot_id: int | None) -> dict[str, str]:
    if metadata is None or snapshot_id is None:
        return {}
    snapshot = metadata.snapshot_by_id(snapshot_id)
    if snapshot is None or snapshot.summary is None:
        return {}
    return dict(snapshot.summary.additional_properties)


def _declared(summary: dict[str, str], key: str, build: Callable[[Any], T]) -> T | None:
    """What a writer declared under `key`, built into facets; a malformed declaration is
    logged and ignored, and the run goes out without it."""
    raw = summary.get(key)
    if raw is None:
        return None
    try:
        return build(json.loads(raw))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("ignoring snapshot-summary key %s (%s): %.200s", key, exc, raw)
        return None


class LineageMapper:
    def __init__(self, names: LineageNames, load_metadata: Callable[[str], TableMetadata | None]) -> None:
        self.names = names
        self._load = load_metadata

    def _output(
        self, record: CommitRecord, metadata: TableMetadata | None, summary: dict[str, str]
    ) -> OutputDataset:
        facets: dict[str, Any] = {
            "dataSource": datasource_dataset.DatasourceDatasetFacet(
                name=self.names.namespace, uri=self.names.namespace
            ),
        }
        if metadata is not None:
            facets["schema"] = schema_dataset.SchemaDatasetFacet(
                fields=_schema_fields(metadata.schema().fields)
            )
            facets["storage"] = storage_dataset.StorageDatasetFacet(
                storageLayer="iceberg", fileFormat=metadata.properties.get("write.format.default", "parquet")
            )
            if metadata.current_snapshot_id is not None:
                facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
                    datasetVersion=str(metadata.current_snapshot_id)
                )
            if comment := metadata.properties.get("comment"):
                facets["documentation"] = documentation_dataset.DocumentationDatasetFacet(description=comment)
        lifecycle = _LIFECYCLE.get(record.kind)
        if record.kind == "table.commit" and record.operation == "overwrite":
            lifecycle = lifecycle_state_change_dataset.LifecycleStateChange.OVERWRITE
        if lifecycle is not None:
            previous = None
            if record.previous:
                previous = lifecycle_state_change_dataset.PreviousIdentifier(
                    name=self.names.dataset_name(record.previous["namespace"], record.previous["name"]),
                    namespace=self.names.namespace,
                )
            facets["lifecycleStateChange"] = lifecycle_state_change_dataset.LifecycleStateChangeDatasetFacet(
                lifecycleStateChange=lifecycle, previousIdentifier=previous
            )
        if column_lineage := _declared(summary, COLUMN_LINEAGE_KEY, self._column_lineage):
            facets["columnLineage"] = column_lineage
        output_facets: dict[str, Any] = {}
        if record.summary:
            output_facets["outputStatistics"] = (
                output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                    rowCount=record.summary.get("added_records"),
                    size=record.summary.get("added_files_size"),
                    fileCount=record.summary.get("added_data_files"),
                )
            )
        return OutputDataset(
            namespace=self.names.namespace,
            name=self.names.dataset_name(record.namespace, record.name or ""),
            facets=facets,
            outputFacets=output_facets,
        )

    def _column_lineage(self, declared: dict[str, Any]) -> column_lineage_dataset.ColumnLineageDatasetFacet:
        fields = {}
        for column, sources in declared.items():
            inputs = []
            for source in sources:
                namespace, name = self.names.resolve(source)
                inputs.append(
                    column_lineage_dataset.InputField(
                        namespace=namespace, name=name, field=str(source["field"])
                    )
                )
            fields[column] = column_lineage_dataset.Fields(inputFields=inputs)
        return column_lineage_dataset.ColumnLineageDatasetFacet(fields=fields)

    def _inputs(self, declared: list[Any]) -> list[InputDataset]:
        if not isinstance(declared, list):
            raise TypeError("expected a list of datasets")
        inputs = []
        for entry in declared:
            try:
                namespace, name = self.names.resolve(entry)
            except ValueError as exc:
                log.warning("ignoring a declared input: %s", exc)
                continue
            inputs.append(InputDataset(namespace=namespace, name=name))
        return inputs

    @staticmethod
    def _parent(declared: dict[str, Any]) -> parent_run.ParentRunFacet:
        return parent_run.ParentRunFacet(
            run=parent_run.Run(runId=str(declared["run"]["runId"])),
            job=parent_run.Job(
                namespace=str(declared["job"]["namespace"]), name=str(declared["job"]["name"])
            ),
        )

    def run_events(self, records: list[CommitRecord]) -> list[RunEvent]:
        """START and COMPLETE for one run: one table record, or every record of one transaction."""
        names = self.names.of(records[0].warehouse)
        if names is not self.names:
            return LineageMapper(names, self._load).run_events(records)
        outputs, inputs, summaries = [], [], []
        for record in records:
            location = record.metadata_location or record.previous_metadata_location
            metadata = self._load(location) if location else None
            summary = _summary(metadata, record.snapshot_id)
            summaries.append(summary)
            outputs.append(self._output(record, metadata, summary))
            inputs += _declared(summary, INPUTS_KEY, self._inputs) or []
        first = records[0]
        declared_job = next((s[JOB_KEY] for s in summaries if JOB_KEY in s), None)
        dataset = self.names.dataset_name(first.namespace, first.name or "")
        if declared_job:
            job_name = declared_job
        elif first.job:  # the catalog's own maintenance
            job_name = f"isbre.maintenance.{first.job}.{dataset}"
        elif first.txn:
            job_name = transaction_job([self.names.dataset_name(r.namespace, r.name or "") for r in records])
        else:
            job_name = f"isbre.{first.kind}.{dataset}"
        event_time = datetime.fromtimestamp(first.ts / 1_000_000, UTC).isoformat()
        run_facets: dict[str, Any] = {
            "nominalTime": nominal_time_run.NominalTimeRunFacet(
                nominalStartTime=event_time, nominalEndTime=event_time
            )
        }
        parent = next((p for s in summaries if (p := _declared(s, PARENT_RUN_KEY, self._parent))), None)
        if parent:
            run_facets["parent"] = parent
        job = Job(
            namespace=self.names.namespace,
            name=job_name,
            facets={
                "jobType": job_type_job.JobTypeJobFacet(
                    processingType="BATCH", integration="ISBRE", jobType="CATALOG_COMMIT"
                )
            },
        )
        run = Run(runId=first.run_id, facets=run_facets)
        return [
            RunEvent(
                eventType=state,
                eventTime=event_time,
                run=run,
                job=job,
                producer=PRODUCER,
                inputs=inputs,
                outputs=outputs,
            )
            for state in (RunState.START, RunState.COMPLETE)
        ]


def group_runs(records: list[CommitRecord]) -> list[list[CommitRecord]]:
    """Table records grouped into runs: a transaction's records together, every other record alone.

    Records of other kinds (namespaces, views) are not runs and are left out.
    """
    runs: list[list[CommitRecord]] = []
    for record in records:
        if record.kind not in TABLE_KINDS:
            continue
        if record.txn and runs and runs[-1][0].txn == record.txn:
            runs[-1].append(record)
        else:
            runs.append([record])
    return runs
