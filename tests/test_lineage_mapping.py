"""The mapping in-process: what a writer declares badly is ignored, not the whole run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from isbre.catalog.embedded import LmdbCatalog
from isbre.lineage.mapping import LineageMapper, group_runs
from isbre.lineage.names import LineageNames
from openlineage.client.serde import Serde
from pyiceberg.catalog import load_catalog

from tests.lineage_receiver import validate


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[LmdbCatalog]:
    opened = load_catalog(
        "x", **{"py-catalog-impl": "isbre.catalog.embedded.LmdbCatalog", "warehouse": str(tmp_path)}
    )
    assert isinstance(opened, LmdbCatalog)
    yield opened
    opened.close()


def test_malformed_declarations_are_ignored_but_the_run_is_kept(catalog: LmdbCatalog) -> None:
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=pa.schema([pa.field("a", pa.int64())]))
    declared = {
        "isbre.lineage.inputs": json.dumps(["db.source", {"namespace": "kafka://b"}, 42]),
        "isbre.lineage.column-lineage": json.dumps({"a": ["db.source"], "b": "not a list"}),
        "isbre.lineage.parent-run": json.dumps({"job": {"name": "no namespace"}}),
        "isbre.lineage.job": "kept.job",
    }
    table.append(pa.table({"a": pa.array([1], pa.int64())}), snapshot_properties=declared)
    service = catalog.service
    mapper = LineageMapper(LineageNames("isbre://test"), service.tables.metadata_or_none)
    (run,) = group_runs(list(service.core.commit_log.records()))[-1:]
    events = [json.loads(Serde.to_json(e)) for e in mapper.run_events(run)]

    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    for event in events:
        validate(event)
    complete = events[1]
    assert complete["job"]["name"] == "kept.job"
    assert [(i["namespace"], i["name"]) for i in complete["inputs"]] == [("isbre://test", "db.source")]
    assert "columnLineage" not in complete["outputs"][0]["facets"]
    assert "parent" not in complete["run"]["facets"]


def test_an_overwrite_is_an_overwrite_lifecycle_change(catalog: LmdbCatalog) -> None:
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=pa.schema([pa.field("a", pa.int64())]))
    table.append(pa.table({"a": pa.array([1, 2], pa.int64())}))
    table.overwrite(pa.table({"a": pa.array([3], pa.int64())}))
    service = catalog.service
    mapper = LineageMapper(LineageNames("isbre://test"), service.tables.metadata_or_none)
    runs = group_runs(list(service.core.commit_log.records()))
    lifecycles = []
    for run in runs:
        complete = json.loads(Serde.to_json(mapper.run_events(run)[1]))
        validate(complete)
        facet = complete["outputs"][0]["facets"].get("lifecycleStateChange")
        lifecycles.append((run[0].operation, facet["lifecycleStateChange"] if facet else None))
    assert lifecycles[0] == (None, "CREATE")
    assert ("append", None) in lifecycles
    assert ("overwrite", "OVERWRITE") in lifecycles


def test_a_table_of_another_warehouse_has_that_warehouses_namespace(catalog: LmdbCatalog) -> None:
    catalog.create_namespace("db")
    catalog.create_table("db.t", schema=pa.schema([pa.field("a", pa.int64())]))
    service = catalog.service
    names = LineageNames("isbre://test/isbre", {"scratch": "isbre://test/scratch"})
    mapper = LineageMapper(names, service.tables.metadata_or_none)
    (run,) = group_runs(list(service.core.commit_log.records()))
    assert run[0].warehouse == "isbre"  # the embedded catalog's one warehouse
    seen = {}
    for warehouse in ("isbre", "scratch", None):
        run[0].warehouse = warehouse
        complete = json.loads(Serde.to_json(mapper.run_events(run)[1]))
        validate(complete)
        seen[warehouse] = (complete["job"]["namespace"], complete["outputs"][0]["namespace"])
    assert seen == {
        "isbre": ("isbre://test/isbre", "isbre://test/isbre"),
        "scratch": ("isbre://test/scratch", "isbre://test/scratch"),
        None: ("isbre://test/isbre", "isbre://test/isbre"),  # a record from before warehouses had names
    }


def test_a_maintenance_job_s_run_is_named_after_the_job(catalog: LmdbCatalog) -> None:
    from isbre.catalog import Identifier

    catalog.create_namespace("db")
    properties = {"isbre.maintenance.compact.min-input-files": "2"}
    table = catalog.create_table("db.t", schema=pa.schema([pa.field("a", pa.int64())]), properties=properties)
    for a in (1, 2):
        table.append(pa.table({"a": pa.array([a], pa.int64())}))
    service = catalog.service
    (report,) = service.maintenance.run(Identifier.of(("db",), "t"), ["compact-data-files"])
    assert report.committed
    mapper = LineageMapper(LineageNames("isbre://test"), service.tables.metadata_or_none)
    *appends, compaction = group_runs(list(service.core.commit_log.records()))
    names = [
        json.loads(Serde.to_json(mapper.run_events(run)[1]))["job"]["name"]
        for run in (appends[-1], compaction)
    ]
    assert names == ["isbre.table.commit.db.t", "isbre.maintenance.compact-data-files.db.t"]


def test_names_last_across_ports_hosts_and_transactions(tmp_path: Path) -> None:
    """The default namespace is the warehouse's root, whatever serves it; a transaction's job is
    named by the tables it changes, the same for every transaction over them."""
    from isbre.lineage.names import MAX_TRANSACTION_NAMES, transaction_job
    from isbre.rest.settings import Settings
    from isbre.rest.startup import lineage_names

    warehouse = tmp_path / "lake"
    seen = set()
    for host, port in (("127.0.0.1", 8181), ("127.0.0.1", 8383), ("0.0.0.0", 9000)):
        names = lineage_names(Settings(host=host, port=port, warehouse=str(warehouse)))
        seen.add((names.namespace, tuple(names.warehouses.items())))
    assert seen == {(warehouse.resolve().as_uri(), ())}
    named = lineage_names(Settings(warehouse=str(warehouse), lineage_namespace="isbre_lake"))
    assert named.namespace == "isbre_lake"
    assert transaction_job(["b.u", "a.t", "b.u"]) == "isbre.transaction.a.t,b.u"
    many = [f"ns.table_{i:03d}" for i in range(40)]
    long = transaction_job(many)
    assert long.startswith("isbre.transaction.ns.table_000+39.") and long == transaction_job(many[::-1])
    assert len(long) < MAX_TRANSACTION_NAMES
