"""rid1, the `_twg_record_id` function: pinned values, and what changes an id."""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pyarrow as pa
from isbre.sinks.record_id import column_digest, record_ids

PAYLOAD = [
    pa.array([1, None], pa.int64()),
    pa.array(["Oslo", "a much longer text value than thirty-two bytes, forcing the long path"]),
    pa.array([1.5, -0.0]),
    pa.array([decimal.Decimal("12.34"), None], pa.decimal128(10, 2)),
    pa.array([{"a": 1}, None]),
    pa.array([b"\x00\x01", b""]),
]


def _ids(*, source: str = "source", topic: str = "topic", partition: int = 3, payload=PAYLOAD) -> list[str]:
    ids = record_ids(source, topic, partition, np.array([7, 8]), payload)
    return [value.hex() for value in ids.to_pylist()]


def test_ids_are_pinned_across_versions() -> None:
    # These values are the definition of rid1 (docs/sinks.md): a change here breaks every stored id.
    assert _ids() == ["36dc1a1a09153da9785c3d7e4467ca3c", "afe816e9b6223c44f78806684b5261a4"]


def test_every_input_changes_the_id() -> None:
    base = _ids()
    assert _ids(source="other")[0] != base[0]
    assert _ids(topic="other")[0] != base[0]
    assert _ids(partition=4)[0] != base[0]
    assert record_ids("source", "topic", 3, np.array([9, 8]), PAYLOAD).to_pylist()[0].hex() != base[0]
    changed = [pa.array([2, None], pa.int64()), *PAYLOAD[1:]]
    first_changed, second_unchanged = _ids(payload=changed)
    assert first_changed != base[0] and second_unchanged == base[1]
    swapped = [PAYLOAD[1], PAYLOAD[0], *PAYLOAD[2:]]
    assert _ids(payload=swapped) != base


def test_every_arrow_type_has_a_digest() -> None:
    columns = [
        pa.array([datetime.date(2020, 1, 1), None]),
        pa.array([datetime.time(1, 2), None]),
        pa.array([datetime.timedelta(days=1), None]),
        pa.array([datetime.datetime(2020, 1, 1), None], pa.timestamp("ms", "UTC")),
        pa.array([decimal.Decimal("1.5"), None], pa.decimal256(40, 2)),
        pa.array([[("k", 1)], None], pa.map_(pa.string(), pa.int64())),
        pa.array([[1, 2], None]),
        pa.array([1, None], pa.uint64()),
        pa.array([b"ab", None], pa.binary(2)),
        pa.array([None, None]),
    ]
    for column in columns:
        digests = column_digest(column)
        assert len(digests) == 2 and digests[1] == column_digest(pa.nulls(1))[0], column.type
    # The same decimal value has one digest whatever its physical width.
    small = pa.array([decimal.Decimal("1.5")], pa.decimal128(10, 2))
    assert column_digest(small)[0] == column_digest(small.cast(pa.decimal256(10, 2)))[0]


def test_null_is_not_zero_nor_empty() -> None:
    numbers = column_digest(pa.array([None, 0], pa.int64()))
    assert numbers[0] != numbers[1]
    texts = column_digest(pa.array([None, ""]))
    assert texts[0] != texts[1]


def test_digests_do_not_depend_on_physical_layout() -> None:
    values = ["", "a", "exactly8", "nine char", "x" * 31, "y" * 33, "z" * 200]
    alone = {v: column_digest(pa.array([v]))[0] for v in values}
    # Short and long values take different code paths; a value's digest must not depend on its neighbours.
    together = column_digest(pa.array(values))
    assert list(together) == [alone[v] for v in values]
    sliced = pa.array(["pad", *values]).slice(1)
    assert list(column_digest(sliced)) == list(together)
    assert list(column_digest(pa.array(values, pa.large_string()))) == list(together)
    assert list(column_digest(pa.array(values).dictionary_encode())) == list(together)
    # Integer width does not matter (a widened column keeps its ids); the value does.
    narrow, wide = pa.array([1, -1], pa.int32()), pa.array([1, -1], pa.int64())
    assert list(column_digest(narrow)) == list(column_digest(wide))
    assert column_digest(wide)[0] != column_digest(wide)[1]


def test_a_large_repetitive_column_gets_the_same_digests() -> None:
    # Large columns that repeat their values are hashed through a dictionary: it must not show.
    values = [f"city {i % 300}" for i in range(70_000)]
    digests = column_digest(pa.array(values))
    alone = {v: column_digest(pa.array([v]))[0] for v in set(values)}
    assert all(d == alone[v] for d, v in zip(digests, values, strict=True))
