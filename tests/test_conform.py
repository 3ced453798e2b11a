"""Row-by-row casting against a table's column type: the same answer as casting each value alone."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given
from hypothesis import strategies as st
from isbre.sinks.conform import conform
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

TABLE = Schema(
    NestedField(1, "n", LongType(), required=False),
    NestedField(2, "small", IntegerType(), required=False),
    NestedField(3, "name", StringType(), required=False),
)
TEXTS = st.one_of(st.integers(-(2**40), 2**40).map(str), st.text(max_size=4), st.none())


def cast_alone(value: object, source: pa.DataType, target: pa.DataType) -> object:
    try:
        return pc.cast(pa.array([value], source), target)[0].as_py()
    except pa.ArrowInvalid:
        return "refused"


@given(st.lists(TEXTS, max_size=40), st.lists(st.integers(-(2**40), 2**40), min_size=40, max_size=40))
def test_each_value_is_cast_as_it_would_be_alone(texts: list[str | None], numbers: list[int]) -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "n": pa.array(texts, pa.string()),
            "small": pa.array(numbers[: len(texts)], pa.int64()),
            "name": pa.array(texts, pa.string()),
        }
    )
    conformed, errors = conform(batch, TABLE, widen=False)
    assert conformed.schema.types == [pa.int64(), pa.int32(), pa.string()]
    for row, (text, number) in enumerate(zip(texts, numbers, strict=False)):
        as_long = cast_alone(text, pa.string(), pa.int64())
        as_int = cast_alone(number, pa.int64(), pa.int32())
        expected_error = None
        if as_long == "refused":
            expected_error = f"'n' is long; {text!r} is not"
        elif as_int == "refused":
            expected_error = f"'small' is int; {number!r} is not"
        assert (errors[row] if errors is not None else None) == expected_error
        assert conformed["n"][row].as_py() == (None if as_long == "refused" else as_long)
        assert conformed["small"][row].as_py() == (None if as_int == "refused" else as_int)
    assert conformed["name"].to_pylist() == texts
