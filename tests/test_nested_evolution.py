"""A sink evolves nested columns as it does top-level ones: a new field inside a struct (at any
depth, in list elements and map values too) is added with its doc, lossless widening inside them
happens with `widen=True`, and anything else is refused naming the nested path, changing nothing."""

from __future__ import annotations

import pyarrow as pa
import pytest
from isbre.sinks.contract import SchemaDriftError
from isbre.sinks.iceberg import IcebergSink
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.types import LongType

from tests.sink_helpers import span, write_once

COMMENT = {"comment": "the amount in cents"}


INT = pa.int32()


def order(amount: pa.DataType = INT, extra: bool = False) -> pa.StructType:
    fields = [pa.field("amount", amount)]
    if extra:
        fields.append(pa.field("currency", pa.string(), metadata=COMMENT))
    return pa.struct(fields)


def batch(payload: pa.DataType, value: object) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([value], payload)], names=["payload"])


CASES = {
    # name: (the payload type given the struct inside it, a value given the struct's value, path)
    "struct": (lambda inner: pa.struct([pa.field("order", inner)]), lambda v: {"order": v}, "payload.order"),
    "list": (pa.list_, lambda v: [v], "payload.element"),
    "map": (lambda inner: pa.map_(pa.string(), inner), lambda v: [("k", v)], "payload.value"),
}


def first_write(catalog: RestCatalog, ident: str, case: str) -> str:
    """The table `ident` made by a sink's first batch: a payload holding an order of one int field."""
    outer, value, _ = CASES[case]
    write_once(catalog, ident, batch(outer(order()), value({"amount": 1})), span(0, 1))
    return ident


@pytest.mark.parametrize("case", CASES)
def test_a_new_nested_field_is_added_with_its_doc(
    rest_catalog: RestCatalog, namespace: str, case: str
) -> None:
    outer, value, path = CASES[case]
    ident = first_write(rest_catalog, f"{namespace}.added_{case}", case)
    more = batch(outer(order(extra=True)), value({"amount": 2, "currency": "NOK"}))
    write_once(rest_catalog, ident, more, span(1, 2))
    table = rest_catalog.load_table(ident)
    assert table.schema().find_field(f"{path}.currency").doc == COMMENT["comment"]
    rows = table.scan().to_arrow().sort_by("_twg_source_offset")["payload"].to_pylist()
    assert rows == [value({"amount": 1, "currency": None}), value({"amount": 2, "currency": "NOK"})]


@pytest.mark.parametrize("case", CASES)
def test_nested_widening_only_when_opted_in(rest_catalog: RestCatalog, namespace: str, case: str) -> None:
    outer, value, path = CASES[case]
    ident = first_write(rest_catalog, f"{namespace}.widened_{case}", case)
    wide = batch(outer(order(pa.int64())), value({"amount": 2**40}))
    with pytest.raises(SchemaDriftError, match=rf"'{path}.amount'.*long.*int.*narrow"):
        IcebergSink(rest_catalog, ident).push(wide, span(1, 2))
    assert str(rest_catalog.load_table(ident).schema().find_field(f"{path}.amount").field_type) == "int"
    write_once(rest_catalog, ident, wide, span(1, 2), widen=True)
    assert rest_catalog.load_table(ident).schema().find_field(f"{path}.amount").field_type == LongType()
    assert len(rest_catalog.load_table(ident).scan().to_arrow()) == 2


@pytest.mark.parametrize("case", CASES)
def test_any_other_nested_change_is_refused_naming_its_path(
    rest_catalog: RestCatalog, namespace: str, case: str
) -> None:
    outer, value, path = CASES[case]
    ident = first_write(rest_catalog, f"{namespace}.refused_{case}", case)
    schema_before = rest_catalog.load_table(ident).schema()
    changed = batch(outer(order(pa.string())), value({"amount": "one"}))
    with pytest.raises(SchemaDriftError, match=rf"'{path}.amount'.*string.*int"):
        IcebergSink(rest_catalog, ident, widen=True).push(changed, span(1, 2))
    dropped = batch(outer(pa.struct([pa.field("other", pa.int32())])), value({"other": 1}))
    with pytest.raises(SchemaDriftError, match=rf"'{path}.amount'.*not in the batch"):
        IcebergSink(rest_catalog, ident).push(dropped, span(1, 2))
    assert rest_catalog.load_table(ident).schema() == schema_before
