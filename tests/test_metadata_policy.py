"""The metadata policy: which `_twg_` columns a sink table's rows carry (`all`, `locator`, the
default for new tables, or `none`), fixed once the table exists; exactly-once coverage holds
under each, since it lives in snapshot summaries and the coverage index, not in rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from isbre.sinks.columns import COLUMNS
from isbre.sinks.contract import SinkError
from isbre.sinks.iceberg import IcebergSink
from isbre.sinks.policies import POLICIES
from isbre.sinks.provisioning import POLICY_PROPERTY, PREFIX_PROPERTY
from pyiceberg.catalog.rest import RestCatalog

from tests.server import IsbreServer
from tests.sink_helpers import ingest, rows, span, write_once

LOCATOR = ["_twg_source_topic", "_twg_source_partition", "_twg_source_offset", "_twg_record_id"]


def metadata_columns(catalog: RestCatalog, ident: str) -> list[str]:
    return [f.name for f in catalog.load_table(ident).schema().fields if f.name.startswith("_twg_")]


@pytest.mark.parametrize("policy", [None, *POLICIES])
def test_each_policy_carries_its_columns_and_replays_write_nothing(
    rest_catalog: RestCatalog, namespace: str, policy: str | None
) -> None:
    ident = f"{namespace}.t_{policy or 'default'}"
    write_once(rest_catalog, ident, rows(0, 5), span(0, 5), metadata_policy=policy)
    expected = {
        None: LOCATOR,
        "locator": LOCATOR,
        "all": ["_twg_" + suffix for suffix, _, _ in COLUMNS],
        "none": [],
    }[policy]
    assert metadata_columns(rest_catalog, ident) == expected
    table = rest_catalog.load_table(ident)
    assert table.properties[POLICY_PROPERTY] == (policy or "locator")
    assert ("write.metadata.metrics.column._twg_record_id" in table.properties) == (policy != "none")

    write_once(rest_catalog, ident, rows(0, 5), span(0, 5))  # a replay, under the table's own policy
    write_once(rest_catalog, ident, rows(3, 8), span(3, 8))  # overlapping: only 5..8 is new
    data = rest_catalog.load_table(ident).scan().to_arrow()
    assert sorted(data["n"].to_pylist()) == list(range(8))
    assert metadata_columns(rest_catalog, ident) == expected


def test_a_sink_of_another_policy_is_refused_naming_both(rest_catalog: RestCatalog, namespace: str) -> None:
    ident = f"{namespace}.fixed"
    write_once(rest_catalog, ident, rows(0, 1), span(0, 1), metadata_policy="none")
    versions = len(rest_catalog.load_table(ident).metadata.metadata_log)
    with pytest.raises(SinkError, match=r"policy is 'none'.*metadata_policy='all'"):
        IcebergSink(rest_catalog, ident, metadata_policy="all").push(rows(1, 2), span(1, 2))
    assert len(rest_catalog.load_table(ident).metadata.metadata_log) == versions
    with pytest.raises(ValueError, match=r"Unknown metadata policy 'some'"):
        IcebergSink(rest_catalog, ident, metadata_policy="some")


def test_a_table_made_before_policies_keeps_every_column(rest_catalog: RestCatalog, namespace: str) -> None:
    """A sink table that records no policy (made by an earlier isbre) has all nine columns: a sink
    opened without a policy keeps writing them, and records the policy; one asking for another
    policy is refused."""
    ident = f"{namespace}.earlier"
    write_once(rest_catalog, ident, rows(0, 2), span(0, 2), metadata_policy="all")
    with rest_catalog.load_table(ident).transaction() as transaction:
        transaction.remove_properties(POLICY_PROPERTY)
    assert PREFIX_PROPERTY in rest_catalog.load_table(ident).properties
    with pytest.raises(SinkError, match=r"policy is 'all'.*metadata_policy='locator'"):
        IcebergSink(rest_catalog, ident, metadata_policy="locator").push(rows(2, 3), span(2, 3))
    write_once(rest_catalog, ident, rows(2, 4), span(2, 4))
    table = rest_catalog.load_table(ident)
    assert table.properties[POLICY_PROPERTY] == "all"
    assert len(metadata_columns(rest_catalog, ident)) == len(COLUMNS)
    assert table.scan().to_arrow()["_twg_emit_ts"].null_count == 0


def test_ingest_takes_a_metadata_policy(
    server: IsbreServer, rest_catalog: RestCatalog, tmp_path: Path
) -> None:
    csv = tmp_path / "a.csv"
    csv.write_text("id,city\n1,Oslo\n2,Bergen\n")
    done = ingest(server, str(csv), "--table", "policy_files.bare", "--metadata-policy", "none")
    assert done.returncode == 0, done.stderr
    assert metadata_columns(rest_catalog, "policy_files.bare") == []
    again = ingest(server, str(csv), "--table", "policy_files.bare")
    assert again.returncode == 0 and "nothing new" in again.stdout, again.stdout + again.stderr
    assert rest_catalog.load_table("policy_files.bare").scan().to_arrow().num_rows == 2
