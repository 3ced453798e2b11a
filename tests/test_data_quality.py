"""Data-quality rules on a sink: the same batch under strict, quarantine and annotate, the audit
table's rows, and replays that write nothing twice in the clean, quarantine and audit tables."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import textwrap
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from isbre.catalog.sink_rows import ROWS_PROPERTY
from isbre.sinks import Rule
from isbre.sinks.contract import SchemaDriftError, SinkError, SourceFields
from isbre.sinks.iceberg import IcebergSink
from isbre.sinks.lane import PipelinedSink
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import BadRequestError
from pyiceberg.types import LongType

from tests import zygote
from tests.http_client import http
from tests.server import IsbreServer
from tests.sink_helpers import offsets_in, rows, span

AMOUNTS = [5, -1, 3, 250, -7, 8]  # row 1 and 4 fail `positive`, row 3 fails `small`
RULES = [
    Rule("positive", "1", lambda batch: pc.greater(batch["amount"], 0)),
    Rule(
        "small",
        "2",
        lambda batch: [value is not None and value < 100 for value in batch["amount"].to_pylist()],
    ),
]


def orders() -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"n": pa.array(range(len(AMOUNTS)), pa.int64()), "amount": pa.array(AMOUNTS, pa.int64())}
    )


def table_rows(catalog: RestCatalog, ident: str) -> list[dict]:
    return sorted(catalog.load_table(ident).scan().to_arrow().to_pylist(), key=lambda row: row.get("n", 0))


def test_strict_takes_nothing_of_a_batch_with_a_failing_row(
    rest_catalog: RestCatalog, namespace: str
) -> None:
    ident = f"{namespace}.strict"
    matched = pytest.raises(SinkError, match=r"'positive' \(2 rows\), 'small' \(1 rows\)")
    with IcebergSink(rest_catalog, ident, rules=RULES) as sink, matched:
        sink.push(orders(), span(0, 6))
    assert not rest_catalog.table_exists(ident)


def run_quarantine(catalog: RestCatalog, namespace: str) -> None:
    quarantine = IcebergSink(catalog, f"{namespace}.quarantined")
    audit = IcebergSink(catalog, f"{namespace}.audit")
    with IcebergSink(
        catalog,
        f"{namespace}.clean",
        rules=RULES,
        enforcement="quarantine",
        quarantine=quarantine,
        audit=audit,
    ) as sink:
        sink.push(orders(), span(0, 6))
        sink.finish()


def test_quarantine_diverts_failing_rows_and_a_replay_writes_nothing_twice(
    rest_catalog: RestCatalog, namespace: str
) -> None:
    run_quarantine(rest_catalog, namespace)
    clean = table_rows(rest_catalog, f"{namespace}.clean")
    assert [row["amount"] for row in clean] == [5, 3, 8]
    diverted = table_rows(rest_catalog, f"{namespace}.quarantined")
    assert [(r["amount"], r["_twg_reason"], r["_twg_rule"], r["_twg_rule_version"]) for r in diverted] == [
        (-1, "dq", "positive", "1"),
        (250, "dq", "small", "2"),
        (-7, "dq", "positive", "1"),
    ]
    assert [r["_twg_source_offset"] for r in diverted] == [1, 3, 4]

    audit = rest_catalog.load_table(f"{namespace}.audit").scan().to_arrow()
    assert audit.column_names == ["_twg_record_id", "rule", "rule_version", "verdict", "disposition"]
    assert audit.num_rows == len(AMOUNTS) * len(RULES)
    by_record = {}
    for row in audit.to_pylist():
        by_record.setdefault(row["_twg_record_id"], {})[row["rule"]] = (row["verdict"], row["disposition"])
    clean_ids = {row["_twg_record_id"] for row in clean}
    assert len(by_record) == len(AMOUNTS) and clean_ids <= set(by_record)
    assert {row["_twg_record_id"] for row in diverted} == set(by_record) - clean_ids  # one id everywhere
    for record_id, verdicts in by_record.items():
        accepted = record_id in clean_ids
        assert {d for _, d in verdicts.values()} == {"accepted" if accepted else "quarantined"}
        assert all(v == "pass" for v, _ in verdicts.values()) == accepted

    run_quarantine(rest_catalog, namespace)  # the same span again, as after a crash
    assert len(table_rows(rest_catalog, f"{namespace}.clean")) == 3
    assert len(table_rows(rest_catalog, f"{namespace}.quarantined")) == 3
    assert rest_catalog.load_table(f"{namespace}.audit").scan().to_arrow().num_rows == len(AMOUNTS) * len(
        RULES
    )


def required_orders(catalog: RestCatalog, ident: str) -> pa.RecordBatch:
    """A table whose `customer` is required, and a batch where rows 2 and 5 leave it null."""
    schema = pa.schema(
        [pa.field("n", pa.int64()), pa.field("amount", pa.int64()), pa.field("customer", pa.string(), False)]
    )
    catalog.create_table(ident, schema)
    customers = pa.array(["a", "b", None, "d", "e", None], pa.string())
    return orders().append_column("customer", customers)


def test_a_null_in_a_required_column_is_refused_naming_it(rest_catalog: RestCatalog, namespace: str) -> None:
    ident = f"{namespace}.required"
    batch = required_orders(rest_catalog, ident)
    matched = pytest.raises(SinkError, match=r"'customer' is required and is null: 2 rows \(offsets 2, 5\)")
    with IcebergSink(rest_catalog, ident) as sink, matched:
        sink.push(batch, span(0, 6))
        sink.finish()
    assert table_rows(rest_catalog, ident) == []


def sink_rows(server: IsbreServer, ident: str) -> dict[str, int]:
    namespace, name = ident.rsplit(".", 1)
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{name}/coverage"
    return http.get(url).raise_for_status().json()["rows"]


def metrics_lines(server: IsbreServer, name: str) -> list[str]:
    text = http.get(f"{server.url}/metrics").raise_for_status().text
    return [line for line in text.splitlines() if line.startswith(f"isbre_sink_rows_total{{{name}")]


def push_judged(
    catalog: RestCatalog, ident: str, quarantined: str, batch: pa.RecordBatch, first: int
) -> None:
    """`batch` from offset `first` through a sink judging RULES, quarantining into `quarantined`."""
    quarantine = IcebergSink(catalog, quarantined)
    with IcebergSink(catalog, ident, rules=RULES, enforcement="quarantine", quarantine=quarantine) as sink:
        sink.push(batch, span(first, first + batch.num_rows))
        sink.finish()


def one_order(catalog: RestCatalog, ident: str) -> None:
    """The table `ident` made by a sink, holding the first of orders()."""
    with IcebergSink(catalog, ident) as sink:
        sink.push(orders().slice(0, 1), span(0, 1))
        sink.finish()


def test_quarantine_takes_the_rows_that_break_the_tables_contract(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    """And each table counts the rows by disposition, once."""
    ident = f"{namespace}.contract"
    batch = required_orders(rest_catalog, ident)
    for _ in range(2):  # and again, as after a crash: nothing twice
        push_judged(rest_catalog, ident, f"{namespace}.contract_quarantine", batch, 0)
        assert [(r["n"], r["customer"]) for r in table_rows(rest_catalog, ident)] == [(0, "a")]
        diverted = table_rows(rest_catalog, f"{namespace}.contract_quarantine")
        null_customer = "'customer' is required and is null"
        assert [(r["n"], r["_twg_reason"], r["_twg_rule"], r["_twg_error"]) for r in diverted] == [
            (1, "dq", "positive", None),
            (2, "contract", None, null_customer),  # it passes the rules; the table cannot hold it
            (3, "dq", "small", None),
            (4, "dq", "positive", None),
            (5, "contract", None, null_customer),
        ]
        assert sink_rows(server, ident) == {"accepted": 1, "quarantined.contract": 2, "quarantined.dq": 3}
        assert sink_rows(server, f"{namespace}.contract_quarantine") == {"accepted": 5}
    where = f'warehouse="isbre",table="{ident}"'
    assert metrics_lines(server, where) == [
        f'isbre_sink_rows_total{{{where},disposition="accepted"}} 1',
        f'isbre_sink_rows_total{{{where},disposition="quarantined",reason="contract"}} 2',
        f'isbre_sink_rows_total{{{where},disposition="quarantined",reason="dq"}} 3',
    ]


def test_a_quarantine_without_rules_takes_contract_failures_alone(
    rest_catalog: RestCatalog, namespace: str
) -> None:
    ident = f"{namespace}.contract_only"
    batch = required_orders(rest_catalog, ident)
    quarantine = IcebergSink(rest_catalog, f"{namespace}.contract_only_quarantine")
    with IcebergSink(rest_catalog, ident, enforcement="quarantine", quarantine=quarantine) as sink:
        sink.push(batch, span(0, 6))
        sink.finish()
    assert [r["n"] for r in table_rows(rest_catalog, ident)] == [0, 1, 3, 4]
    diverted = table_rows(rest_catalog, f"{namespace}.contract_only_quarantine")
    assert [(r["n"], r["_twg_reason"]) for r in diverted] == [(2, "contract"), (5, "contract")]


def text_orders(amounts: list[str]) -> pa.RecordBatch:
    """Orders numbered from 1 whose amounts came as text (a CSV source, say)."""
    numbers = pa.array(range(1, len(amounts) + 1), pa.int64())
    return pa.RecordBatch.from_pydict({"n": numbers, "amount": pa.array(amounts, pa.string())})


def test_a_value_that_does_not_take_its_columns_type_is_quarantined_row_by_row(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    """Text into a long column: the values that are whole numbers are written, each other row goes
    to the quarantine for the contract naming the column and the value; the rules judge the
    values as the table holds them. A second run writes nothing twice."""
    ident = f"{namespace}.typed"
    one_order(rest_catalog, ident)  # the table: n long, amount long
    batch = text_orders(["7", "x7", "-2", "12.5", "9"])
    for _ in range(2):
        push_judged(rest_catalog, ident, f"{namespace}.typed_quarantine", batch, 1)
        assert [(r["n"], r["amount"]) for r in table_rows(rest_catalog, ident)] == [(0, 5), (1, 7), (5, 9)]
        diverted = table_rows(rest_catalog, f"{namespace}.typed_quarantine")
        assert [(r["n"], r["_twg_reason"], r["_twg_rule"], r["_twg_error"]) for r in diverted] == [
            (2, "contract", None, "'amount' is long; 'x7' is not"),
            (3, "dq", "positive", None),
            (4, "contract", None, "'amount' is long; '12.5' is not"),
        ]
        assert sink_rows(server, ident) == {"accepted": 3, "quarantined.contract": 2, "quarantined.dq": 1}
    assert rest_catalog.load_table(ident).schema().find_field("amount").field_type == LongType()


def test_values_of_another_type_are_refused_whole_without_a_quarantine(
    rest_catalog: RestCatalog, namespace: str
) -> None:
    ident = f"{namespace}.typed_strict"
    one_order(rest_catalog, ident)
    refused = pytest.raises(
        SchemaDriftError, match="'amount': the batch's string cannot be written to the table's long"
    )
    with IcebergSink(rest_catalog, ident) as sink, refused:
        sink.push(text_orders(["7", "x7"]), span(1, 3))
    assert len(table_rows(rest_catalog, ident)) == 1


def test_the_ack_lane_quarantines_values_of_another_type(rest_catalog: RestCatalog, namespace: str) -> None:
    ident = f"{namespace}.lane_typed"
    one_order(rest_catalog, ident)
    quarantine = IcebergSink(rest_catalog, f"{namespace}.lane_typed_quarantine")

    async def send() -> None:
        async with PipelinedSink(
            rest_catalog, ident, enforcement="quarantine", quarantine=quarantine
        ) as sink:
            receipt = await sink.send(text_orders(["1", "one", "3"]), span(1, 4))
            await sink.flush()
            assert (await receipt).span == span(1, 4)

    asyncio.run(send())
    assert sorted(r["amount"] for r in table_rows(rest_catalog, ident)) == [1, 3, 5]
    diverted = table_rows(rest_catalog, f"{namespace}.lane_typed_quarantine")
    assert [(r["amount"], r["_twg_error"]) for r in diverted] == [(None, "'amount' is long; 'one' is not")]


def keyed_orders(push: int) -> tuple[pa.RecordBatch, SourceFields]:
    """orders() numbered from 6 * push, with a key per row naming its push and row."""
    batch = orders().set_column(0, "n", pa.array(range(6 * push, 6 * push + 6), pa.int64()))
    return batch, SourceFields(keys=pa.array([f"{6 * push + i}".encode() for i in range(6)], pa.binary()))


def test_each_row_of_many_pushes_keeps_its_source_fields_on_either_side(
    rest_catalog: RestCatalog, namespace: str
) -> None:
    """The quarantine takes a commit's pushes as one batch, and the clean side selects its rows on
    the write thread: keys and offsets still follow their rows, also where a replayed push
    overlaps what a commit already holds."""
    ident, quarantined = f"{namespace}.keyed", f"{namespace}.keyed_quarantine"
    for pushes in (range(3), range(2, 5)):  # the second run replays push 2, then goes on
        options = {"rules": RULES, "enforcement": "quarantine", "metadata_policy": "all"}
        with IcebergSink(
            rest_catalog,
            ident,
            quarantine=IcebergSink(rest_catalog, quarantined, metadata_policy="all"),
            **options,
        ) as sink:
            for push in pushes:
                batch, source = keyed_orders(push)
                sink.push(batch, span(6 * push, 6 * push + 6), source)
            sink.finish()
    for table, kept in ((ident, {0, 2, 5}), (quarantined, {1, 3, 4})):
        found = [
            (r["n"], r["_twg_source_key"], r["_twg_source_offset"]) for r in table_rows(rest_catalog, table)
        ]
        assert found == [(n, str(n).encode(), n) for n in range(30) if n % 6 in kept]


def test_annotate_lands_every_row_with_its_verdicts(rest_catalog: RestCatalog, namespace: str) -> None:
    """And the audit names each row by the id it has in the table: the verdicts are not part of it."""
    ident = f"{namespace}.annotated"
    audit = IcebergSink(rest_catalog, f"{namespace}.annotated_audit")
    with IcebergSink(rest_catalog, ident, rules=RULES, enforcement="annotate", audit=audit) as sink:
        sink.push(orders(), span(0, 6))
        sink.finish()
    rows = table_rows(rest_catalog, ident)
    assert [(r["amount"], r["_twg_dq_passed"], r["_twg_dq_failed"]) for r in rows] == [
        (5, True, []),
        (-1, False, ["positive"]),
        (3, True, []),
        (250, False, ["small"]),
        (-7, False, ["positive"]),
        (8, True, []),
    ]
    audited = rest_catalog.load_table(f"{namespace}.annotated_audit").scan().to_arrow()
    assert set(audited["_twg_record_id"].to_pylist()) == {row["_twg_record_id"] for row in rows}
    assert set(audited["disposition"].to_pylist()) == {"annotated"}


def test_a_rule_that_answers_wrongly_is_named(rest_catalog: RestCatalog, namespace: str) -> None:
    short = Rule("short", "1", lambda batch: [True])
    matched = pytest.raises(SinkError, match=r"'short' \(version 1\) must answer one boolean per row")
    with IcebergSink(rest_catalog, f"{namespace}.t", rules=[short]) as sink, matched:
        sink.push(orders(), span(0, 6))
    broken = Rule("broken", "3", lambda batch: batch["missing"])
    matched = pytest.raises(SinkError, match=r"'broken' \(version 3\) failed: KeyError")
    with IcebergSink(rest_catalog, f"{namespace}.t", rules=[broken]) as sink, matched:
        sink.push(orders(), span(0, 6))
    assert Rule("versioned", 1, lambda batch: [True]).version == "1"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"A rule's version must be a non-empty string: ''"):
        Rule("versioned", "", lambda batch: [True])
    with pytest.raises(ValueError, match=r"enforcement='quarantine' takes a quarantine sink"):
        IcebergSink(rest_catalog, f"{namespace}.t", rules=RULES, enforcement="quarantine")


def test_an_audit_sink_with_its_own_record_ids_is_refused(rest_catalog: RestCatalog, namespace: str) -> None:
    audit = IcebergSink(rest_catalog, f"{namespace}.audit", metadata_policy="locator")
    matched = pytest.raises(SinkError, match=r"'_twg_record_id' use the reserved metadata prefix")
    with IcebergSink(rest_catalog, f"{namespace}.clean", rules=RULES, audit=audit) as sink, matched:
        sink.push(orders().filter(pa.array([True, False, True, False, False, True])), span(0, 3))


# A producer with a quarantine and an audit that commits offsets 0..300 and is killed before it
# hears back; with "mid-push" also while a further push has data files written and not
# committed, with "between-commits" after the quarantine and audit of 300..400 committed and
# before the clean table did.
CRASHING_PRODUCER = textwrap.dedent(
    """
    import os, signal, sys
    from pyiceberg.catalog.rest import RestCatalog
    from tests.sink_helpers import rows, span
    from tests.test_data_quality import sinks

    catalog = RestCatalog("isbre", uri=sys.argv[1])
    sink = sinks(catalog, sys.argv[2])
    for start in range(0, 300, 100):
        sink.push(rows(start, start + 100), span(start, start + 100))
    sink.finish()
    sink = sinks(catalog, sys.argv[2], target_file_bytes=1)
    sink.push(rows(300, 400), span(300, 400))
    if sys.argv[3] == "between-commits":
        sink.quality.commit(sink.writer)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)
NOT_THREE = Rule("not_three", "1", lambda batch: [n % 10 != 3 for n in batch["n"].to_pylist()])


def sinks(catalog: RestCatalog, namespace: str, **options: object) -> IcebergSink:
    """The clean sink of `namespace`, quarantining rows whose `n` ends in 3, audited."""
    quarantine = IcebergSink(catalog, f"{namespace}.quarantined", **options)
    audit = IcebergSink(catalog, f"{namespace}.audit", **options)
    return IcebergSink(
        catalog,
        f"{namespace}.clean",
        rules=[NOT_THREE],
        enforcement="quarantine",
        quarantine=quarantine,
        audit=audit,
        **options,
    )


@pytest.mark.parametrize("crash", ["mid-push", "between-commits"])
def test_a_replay_after_a_crash_writes_nothing_twice_in_any_table(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str, crash: str
) -> None:
    command = [sys.executable, "-c", CRASHING_PRODUCER, server.url, namespace, crash]
    child = zygote.run(command, timeout=120)
    assert child.returncode == -signal.SIGKILL
    with sinks(rest_catalog, namespace) as sink:
        for start in range(0, 400, 50):
            sink.push(rows(start, start + 50), span(start, start + 50))
        sink.finish()
    clean = offsets_in(rest_catalog.load_table(f"{namespace}.clean"))
    diverted = offsets_in(rest_catalog.load_table(f"{namespace}.quarantined"))
    assert clean == [(0, i) for i in range(400) if i % 10 != 3]
    assert diverted == [(0, i) for i in range(400) if i % 10 == 3]
    audit = rest_catalog.load_table(f"{namespace}.audit").scan().to_arrow()
    assert audit.num_rows == 400 and len(set(audit["_twg_record_id"].to_pylist())) == 400
    assert audit["verdict"].to_pylist().count("fail") == 40


def test_the_ack_lane_quarantines_too(rest_catalog: RestCatalog, namespace: str) -> None:
    """PipelinedSink takes the same rules: a receipt means the span is in the clean table and in
    the quarantine."""
    quarantine = IcebergSink(rest_catalog, f"{namespace}.lane_quarantined")

    async def send() -> None:
        async with PipelinedSink(
            rest_catalog,
            f"{namespace}.lane_clean",
            rules=RULES,
            enforcement="quarantine",
            quarantine=quarantine,
        ) as sink:
            receipts = [await sink.send(orders(), span(0, 6)), await sink.send(orders(), span(6, 12))]
            await sink.flush()
            assert [(await receipt).span for receipt in receipts] == [span(0, 6), span(6, 12)]

    asyncio.run(send())
    assert [r["amount"] for r in table_rows(rest_catalog, f"{namespace}.lane_clean")] == [5, 5, 3, 3, 8, 8]
    assert len(table_rows(rest_catalog, f"{namespace}.lane_quarantined")) == 6


def test_annotate_counts_accepted_and_annotated_rows(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    annotated = f"{namespace}.counted_annotated"
    with IcebergSink(rest_catalog, annotated, rules=RULES, enforcement="annotate") as sink:
        sink.push(orders(), span(0, 6))
        sink.finish()
        sink.push(orders(), span(6, 12))
        sink.finish()
    assert sink_rows(server, annotated) == {"accepted": 6, "annotated": 6}


def test_a_commit_declaring_malformed_row_counts_is_refused(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    table = rest_catalog.create_table(f"{namespace}.forged", pa.schema([pa.field("n", pa.int64())]))
    for forged in ('{"accepted": -1}', '{"deleted": 1}', "[1]", "not json"):
        with pytest.raises(BadRequestError, match=r"isbre\.sink\.rows"):
            table.append(pa.table({"n": [1]}), snapshot_properties={ROWS_PROPERTY: forged})
    assert sink_rows(server, f"{namespace}.forged") == {}
    assert table.refresh().current_snapshot() is None
    # Any writer may declare counts; a large one is printed whole, not as 1.23457e+07.
    table.append(pa.table({"n": [1]}), snapshot_properties={ROWS_PROPERTY: '{"accepted": 12345678}'})
    where = f'warehouse="isbre",table="{namespace}.forged"'
    assert metrics_lines(server, where) == [
        f'isbre_sink_rows_total{{{where},disposition="accepted"}} 12345678'
    ]


def test_a_quarantine_too_slow_to_keep_up_sheds_counted_never_the_clean_rows(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each quarantine commit takes 3 s, the sink finishes ten batches: it waits at most the drain
    time for the quarantine each time, keeps every clean row, and sheds (counted) what the
    quarantine's buffer cannot hold. Replaying the stream afterwards fills the quarantine's gaps
    and writes no clean row twice."""
    every_tenth = Rule("not_tenth", "1", lambda batch: [n % 10 != 0 for n in batch["n"].to_pylist()])
    quarantine = IcebergSink(rest_catalog, f"{namespace}.slow_quarantine")
    real_commit = quarantine.writer.commit

    def slow_commit() -> object:
        time.sleep(3)
        return real_commit()

    quarantine.writer.commit = slow_commit  # type: ignore[method-assign]
    options = {"quarantine_buffer_rows": 10, "quarantine_drain_s": 0.05}
    finishes = []
    with (
        caplog.at_level(logging.WARNING, logger="isbre.sinks.quarantine_lane"),
        IcebergSink(
            rest_catalog,
            f"{namespace}.kept",
            rules=[every_tenth],
            enforcement="quarantine",
            quarantine=quarantine,
            **options,  # type: ignore[arg-type]
        ) as sink,
    ):
        for start in range(0, 1000, 100):
            sink.push(rows(start, start + 100), span(start, start + 100))
            began = time.monotonic()
            sink.finish()
            finishes.append(time.monotonic() - began)
        shed = sink.quality.quarantine.shed  # type: ignore[union-attr]
    assert max(finishes) < 3, finishes  # never a quarantine commit's 3 s
    assert len(table_rows(rest_catalog, f"{namespace}.kept")) == 900
    assert shed["dq"] > 0
    assert any("quarantine shed" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    landed = len(table_rows(rest_catalog, f"{namespace}.slow_quarantine"))
    assert landed + shed["dq"] == 100
    counts = sink_rows(server, f"{namespace}.kept")
    # The last finish's shed rows are counted by the table's next commit, if they were not before.
    assert counts["accepted"] == 900 and counts["quarantined.dq"] == 100
    assert 0 < counts.get("shed.dq", 0) <= shed["dq"]

    quarantine = IcebergSink(rest_catalog, f"{namespace}.slow_quarantine")
    with IcebergSink(
        rest_catalog,
        f"{namespace}.kept",
        rules=[every_tenth],
        enforcement="quarantine",
        quarantine=quarantine,
    ) as sink:
        for start in range(0, 1000, 100):
            sink.push(rows(start, start + 100), span(start, start + 100))
        sink.finish()
    assert len(table_rows(rest_catalog, f"{namespace}.kept")) == 900
    diverted = table_rows(rest_catalog, f"{namespace}.slow_quarantine")
    assert sorted(row["n"] for row in diverted) == list(range(0, 1000, 10))
