"""The Iceberg sink against a real isbre server: exactly-once, coverage, provisioning, columns."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pytest
from isbre.sinks.contract import SchemaDriftError, SinkError, SourceFields
from isbre.sinks.iceberg import IcebergSink
from isbre.sinks.provisioning import COMMENT_HASH_PROPERTY, MANAGED_PROPERTY, PREFIX_PROPERTY
from isbre.sinks.record_id import record_ids
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.types import (
    BinaryType,
    FixedType,
    ListType,
    LongType,
    StringType,
    StructType,
    TimestamptzType,
)

from tests.answer_dropping_proxy import AnswerDroppingProxy
from tests.server import IsbreServer
from tests.sink_helpers import crash_and_replay, offsets_in, rows, span, write_once

# Run against a server on each store.
SERVER_STORES = ("lmdb", "postgresql")


@pytest.mark.parametrize("crash", ["after-commit", "mid-push"])
def test_replay_after_a_crash_writes_nothing_twice(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str, crash: str
) -> None:
    crash_and_replay(server, rest_catalog, f"{namespace}.events", crash)


def test_two_sinks_on_disjoint_partitions_merge_coverage_with_gaps(
    rest_catalog: RestCatalog, namespace: str
) -> None:
    ident = f"{namespace}.shared"
    rest_catalog.create_table(ident, pa.schema([pa.field("n", pa.int64()), pa.field("label", pa.string())]))

    def produce(partition: int, ranges: list[tuple[int, int]]) -> None:
        for start, end in ranges:  # each range its own session: a gap between sessions stays a gap
            with IcebergSink(rest_catalog, ident) as sink:
                for first in range(start, end, 25):
                    sink.push(rows(first, first + 25), span(first, first + 25, partition))
                sink.finish()

    plans = {0: [(0, 100), (200, 300), (300, 350)], 1: [(0, 50), (75, 100)], 2: [(1000, 1050)]}
    threads = [threading.Thread(target=produce, args=item) for item in plans.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    coverage = {entry["partition"]: entry for entry in rest_catalog_coverage(rest_catalog, ident)}
    assert coverage[0]["ranges"] == [[0, 100], [200, 350]] and coverage[0]["gaps"] == [[100, 200]]
    assert coverage[1]["ranges"] == [[0, 50], [75, 100]] and coverage[1]["gaps"] == [[50, 75]]
    assert coverage[2]["ranges"] == [[1000, 1050]] and coverage[2]["gaps"] == []
    expected = sorted((p, o) for p, ranges in plans.items() for a, b in ranges for o in range(a, b))
    assert offsets_in(rest_catalog.load_table(ident)) == expected


def rest_catalog_coverage(catalog: RestCatalog, ident: str) -> list[dict]:
    from isbre.sinks.catalogs import coverage_source

    source = coverage_source(catalog, ident)
    assert source.indexed, "isbre's REST coverage endpoint was not found"
    return source.coverage(catalog.load_table(ident)).to_json()


def test_metadata_columns_have_the_documented_types_and_values(
    rest_catalog: RestCatalog, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    ident = f"{namespace}.meta"
    headers = pa.array(
        [[{"key": "a", "value": b"1"}, {"key": "a", "value": None}, {"key": "b", "value": b""}], [], None],
        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
    )
    source = SourceFields(
        keys=pa.array([b"k0", None, b""], pa.binary()),
        timestamps=pa.array([datetime(2026, 1, 1, tzinfo=UTC), None, datetime(1969, 12, 31, tzinfo=UTC)]),
        headers=headers,
    )
    pushed = datetime.now(UTC)
    with IcebergSink(rest_catalog, ident, metadata_policy="all") as sink:
        sink.push(rows(40, 43), span(40, 43, partition=7, topic="payments"), source)
        info, _ = sink.finish()
    table = rest_catalog.load_table(ident)
    schema = table.schema()
    expected = {
        "_twg_source_topic": StringType(),
        "_twg_source_partition": LongType(),
        "_twg_source_offset": LongType(),
        "_twg_source_key": BinaryType(),
        "_twg_source_timestamp": TimestamptzType(),
        "_twg_ingest_ts": TimestamptzType(),
        "_twg_emit_ts": TimestamptzType(),
        "_twg_record_id": FixedType(16),
    }
    for name, kind in expected.items():
        assert schema.find_field(name).field_type == kind, name
        assert schema.find_field(name).doc, f"{name} has no doc"
    header_type = schema.find_field("_twg_source_headers").field_type
    assert isinstance(header_type, ListType) and isinstance(header_type.element_type, StructType)
    assert [f.name for f in header_type.element_type.fields] == ["key", "value"]
    assert table.properties[MANAGED_PROPERTY] == "true" and table.properties[PREFIX_PROPERTY] == "_twg_"
    assert table.properties["write.metadata.metrics.column._twg_record_id"] == "none"
    assert "statistics missing" not in caplog.text

    data = table.scan().to_arrow().sort_by("_twg_source_offset").to_pylist()
    assert [r["_twg_source_offset"] for r in data] == [40, 41, 42]
    assert {r["_twg_source_topic"] for r in data} == {"payments"}
    assert {r["_twg_source_partition"] for r in data} == {7}
    assert [r["_twg_source_key"] for r in data] == [b"k0", None, b""]
    assert data[0]["_twg_source_timestamp"] == datetime(2026, 1, 1, tzinfo=UTC)
    assert data[1]["_twg_source_timestamp"] is None
    assert data[0]["_twg_source_headers"] == [
        {"key": "a", "value": b"1"},
        {"key": "a", "value": None},
        {"key": "b", "value": b""},
    ]
    assert data[1]["_twg_source_headers"] == []
    snapshot_ms = table.snapshot_by_id(info.snapshot_id).timestamp_ms
    for row in data:
        assert pushed <= row["_twg_ingest_ts"] <= row["_twg_emit_ts"]
        assert row["_twg_emit_ts"].timestamp() * 1000 <= snapshot_ms + 1
    # The record id is the documented function of source id, topic, partition, offset and payload.
    ids = record_ids("kafka-1", "payments", 7, np.array([40, 41, 42]), rows(40, 43).columns)
    assert [r["_twg_record_id"] for r in data] == ids.to_pylist()
    assert len(set(ids.to_pylist())) == 3


@pytest.mark.xfail(
    strict=True,
    reason="apache/iceberg-python#3833: PyIceberg's writer stores a null list<struct> as an empty list",
)
def test_a_null_header_list_stays_null(rest_catalog: RestCatalog, namespace: str) -> None:
    headers = pa.array([None], pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    source = SourceFields(headers=headers)
    write_once(rest_catalog, f"{namespace}.t", rows(0, 1), span(0, 1), source, metadata_policy="all")
    stored = rest_catalog.load_table(f"{namespace}.t").scan().to_arrow()["_twg_source_headers"]
    assert stored.to_pylist() == [None]


def test_a_payload_column_under_the_prefix_is_refused(rest_catalog: RestCatalog, namespace: str) -> None:
    sink = IcebergSink(rest_catalog, f"{namespace}.t")
    clash = rows(0, 2, _twg_source_offset=pa.array([1, 2]))
    with pytest.raises(SinkError, match=r"'_twg_source_offset'.*reserved"):
        sink.push(clash, span(0, 2))
    assert not rest_catalog.table_exists(f"{namespace}.t")


def test_the_prefix_is_fixed_once_the_table_exists(rest_catalog: RestCatalog, namespace: str) -> None:
    ident = f"{namespace}.t"
    write_once(rest_catalog, ident, rows(0, 2), span(0, 2), prefix="_meta_")
    assert "_meta_source_offset" in rest_catalog.load_table(ident).schema().column_names
    with pytest.raises(SchemaDriftError, match=r"prefix '_meta_'.*'_twg_'"):
        IcebergSink(rest_catalog, ident).push(rows(2, 4), span(2, 4))


def _metadata_versions(catalog: RestCatalog, ident: str) -> int:
    return len(catalog.load_table(ident).metadata.metadata_log)


def test_drift_adds_documented_columns_and_a_resync_commits_nothing(
    rest_catalog: RestCatalog, namespace: str
) -> None:
    ident = f"{namespace}.drift"
    documented = pa.field("n", pa.int64(), metadata={"comment": "the sequence number"})
    first = pa.RecordBatch.from_arrays([pa.array([0, 1], pa.int64())], schema=pa.schema([documented]))
    write_once(rest_catalog, ident, first, span(0, 2))
    assert rest_catalog.load_table(ident).schema().find_field("n").doc == "the sequence number"
    hashed = rest_catalog.load_table(ident).properties[COMMENT_HASH_PROPERTY]

    versions = _metadata_versions(rest_catalog, ident)
    write_once(rest_catalog, ident, first, span(2, 4))
    assert _metadata_versions(rest_catalog, ident) == versions + 1

    wider = pa.schema([documented, pa.field("city", pa.string(), metadata={"description": "where"})])
    second = pa.RecordBatch.from_arrays([pa.array([4], pa.int64()), pa.array(["Oslo"])], schema=wider)
    write_once(rest_catalog, ident, second, span(4, 5))
    table = rest_catalog.load_table(ident)
    assert table.schema().find_field("city").doc == "where"
    assert table.properties[COMMENT_HASH_PROPERTY] != hashed
    assert table.scan().to_arrow().sort_by("n")["city"].to_pylist() == [None, None, None, None, "Oslo"]


def test_a_schema_change_inside_one_commit(rest_catalog: RestCatalog, namespace: str) -> None:
    ident = f"{namespace}.midway"
    with IcebergSink(rest_catalog, ident) as sink:
        sink.push(rows(0, 3), span(0, 3))
        sink.push(rows(3, 5, city=pa.array(["Oslo", "Bergen"])), span(3, 5))
        sink.finish()
    data = rest_catalog.load_table(ident).scan().to_arrow().sort_by("n")
    assert data["city"].to_pylist() == [None, None, None, "Oslo", "Bergen"]
    assert offsets_in(rest_catalog.load_table(ident)) == [(0, i) for i in range(5)]


def test_widening_only_when_opted_in_and_narrowing_never(rest_catalog: RestCatalog, namespace: str) -> None:
    ident = f"{namespace}.widen"

    def batch(kind: pa.DataType, start: int) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"amount": pa.array([start], kind)})

    write_once(rest_catalog, ident, batch(pa.int32(), 0), span(0, 1))
    with pytest.raises(SchemaDriftError, match=r"'amount'.*long.*int.*narrow"):
        IcebergSink(rest_catalog, ident).push(batch(pa.int64(), 1), span(1, 2))
    with pytest.raises(SchemaDriftError, match=r"'amount'.*double.*int"):
        IcebergSink(rest_catalog, ident, widen=True).push(batch(pa.float64(), 1), span(1, 2))
    assert str(rest_catalog.load_table(ident).schema().find_field("amount").field_type) == "int"
    write_once(rest_catalog, ident, batch(pa.int64(), 1), span(1, 2), widen=True)
    assert rest_catalog.load_table(ident).schema().find_field("amount").field_type == LongType()
    write_once(rest_catalog, ident, batch(pa.int32(), 2), span(2, 3))
    assert sorted(rest_catalog.load_table(ident).scan().to_arrow()["amount"].to_pylist()) == [0, 1, 2]


def test_whole_numbers_go_into_a_double_column_when_it_holds_them_exactly(
    rest_catalog: RestCatalog, namespace: str
) -> None:
    ident = f"{namespace}.doubles"
    write_once(rest_catalog, ident, pa.RecordBatch.from_pydict({"amount": [1.5]}), span(0, 1))
    ints = pa.RecordBatch.from_pydict({"amount": pa.array([2, 3], pa.int64())})
    write_once(rest_catalog, ident, ints, span(1, 3))
    table = rest_catalog.load_table(ident)
    assert str(table.schema().find_field("amount").field_type) == "double"
    assert sorted(table.scan().to_arrow()["amount"].to_pylist()) == [1.5, 2.0, 3.0]
    inexact = pa.RecordBatch.from_pydict({"amount": pa.array([2**53 + 1], pa.int64())})
    with pytest.raises(SinkError, match=r"column 'amount': a whole number its double column cannot hold"):
        IcebergSink(rest_catalog, ident).push(inexact, span(3, 4))


def test_write_boundary_mismatches_fail_loudly(rest_catalog: RestCatalog, namespace: str) -> None:
    ident = f"{namespace}.boundary"
    initial = pa.RecordBatch.from_pydict(
        {"payload": pa.array(["{}"]), "at": pa.array([datetime(2026, 1, 1)], pa.timestamp("us"))}
    )
    write_once(rest_catalog, ident, initial, span(0, 1))
    nested = pa.RecordBatch.from_pydict(
        {
            "payload": pa.array([{"a": 1, "b": [1, 2]}]),
            "at": pa.array([datetime(2026, 1, 2)], pa.timestamp("us")),
        }
    )
    with pytest.raises(SchemaDriftError, match=r"'payload'.*struct.*string.*to_json"):
        IcebergSink(rest_catalog, ident).push(nested, span(1, 2))
    aware = pa.RecordBatch.from_pydict(
        {
            "payload": pa.array(["x"]),
            "at": pa.array([datetime(2026, 1, 2, tzinfo=UTC)], pa.timestamp("us", "UTC")),
        }
    )
    with pytest.raises(SchemaDriftError, match=r"'at'.*time-zone-aware"):
        IcebergSink(rest_catalog, ident).push(aware, span(1, 2))
    write_once(rest_catalog, ident, nested, span(1, 2), to_json=True)
    payloads = rest_catalog.load_table(ident).scan().to_arrow().sort_by("at")["payload"].to_pylist()
    assert payloads == ["{}", '{"a":1,"b":[1,2]}']


def test_a_missing_column_is_refused_unless_nulls_are_allowed(
    rest_catalog: RestCatalog, namespace: str
) -> None:
    ident = f"{namespace}.missing"
    write_once(rest_catalog, ident, rows(0, 1), span(0, 1))
    only_n = pa.RecordBatch.from_pydict({"n": pa.array([1], pa.int64())})
    with pytest.raises(SchemaDriftError, match=r"'label'.*not in the batch"):
        IcebergSink(rest_catalog, ident).push(only_n, span(1, 2))
    write_once(rest_catalog, ident, only_n, span(1, 2), fill_missing=True)
    labels = rest_catalog.load_table(ident).scan().to_arrow().sort_by("n")["label"].to_pylist()
    assert labels == ["row 0", None]


def test_a_batch_sink_takes_one_stream_in_order(rest_catalog: RestCatalog, namespace: str) -> None:
    sink = IcebergSink(rest_catalog, f"{namespace}.order")
    sink.push(rows(0, 2), span(0, 2))
    with pytest.raises(SinkError, match=r"does not continue"):
        sink.push(rows(5, 6), span(5, 6))
    with pytest.raises(SinkError, match=r"does not continue"):
        sink.push(rows(2, 3), span(2, 3, partition=1))
    with pytest.raises(SinkError, match=r"3 rows for 2 offsets"):
        sink.push(rows(2, 5), span(2, 4))
    sink.close()


def test_a_partitioned_table_takes_sink_rows_too(rest_catalog: RestCatalog, namespace: str) -> None:
    from pyiceberg.transforms import IdentityTransform

    ident = f"{namespace}.by_label"
    first = rows(0, 4, shard=pa.array(["a", "b", "a", "b"]))
    write_once(rest_catalog, ident, first, span(0, 4))
    table = rest_catalog.load_table(ident)
    with table.update_spec() as spec:  # ...then partitioned by hand
        spec.add_field("shard", IdentityTransform(), "shard")
    assert not rest_catalog.load_table(ident).spec().is_unpartitioned()
    write_once(rest_catalog, ident, rows(4, 8, shard=pa.array(["a", "b", "c", "c"])), span(4, 8))
    assert offsets_in(rest_catalog.load_table(ident)) == [(0, i) for i in range(8)]
    files = rest_catalog.load_table(ident).inspect.files().to_pylist()
    assert {f["partition"]["shard"] for f in files if f["partition"].get("shard")} == {"a", "b", "c"}


def test_a_commit_whose_answer_is_lost_is_found_not_repeated(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    ident = f"{namespace}.lost"
    write_once(rest_catalog, ident, rows(0, 10), span(0, 10))
    table_path = f"/v1/isbre/namespaces/{namespace}/tables/lost"
    first = {"drop": True}

    def drop_first_commit(method: str, path: str) -> bool:
        if method == "POST" and path == table_path and first["drop"]:
            first["drop"] = False
            return True
        return False

    with AnswerDroppingProxy(server.url, drop_first_commit) as proxy:
        through_proxy = RestCatalog("isbre", uri=proxy.url)
        info = write_once(through_proxy, ident, rows(10, 20), span(10, 20))
        assert proxy.dropped == 1
    assert info.snapshot_id == rest_catalog.load_table(ident).metadata.current_snapshot_id
    assert offsets_in(rest_catalog.load_table(ident)) == [(0, i) for i in range(20)]
    assert rest_catalog.load_table(ident).scan().to_arrow().num_rows == 20  # its data files are there


def test_declared_lineage_rides_in_the_commit(rest_catalog: RestCatalog, namespace: str) -> None:
    import json

    from isbre.lineage.mapping import COLUMN_LINEAGE_KEY, INPUTS_KEY, JOB_KEY

    source_column = {"namespace": "isbre", "name": "staging.orders", "field": "id"}
    declared = {
        JOB_KEY: "orders_clean",
        INPUTS_KEY: json.dumps(["staging.orders"]),
        COLUMN_LINEAGE_KEY: json.dumps({"n": [source_column]}),
    }
    ident = f"{namespace}.clean"
    info = write_once(rest_catalog, ident, rows(0, 3), span(0, 3), snapshot_properties=declared)
    summary = rest_catalog.load_table(ident).snapshot_by_id(info.snapshot_id).summary
    assert {k: summary[k] for k in declared} == declared
    assert json.loads(summary["isbre.sink.spans"])[0]["end"] == 3
