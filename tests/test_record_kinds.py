"""The kinds of commit record are defined once (catalog/records.py); the places that list them
for users say the same."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from isbre.catalog.records import PURGE_INCOMPLETE, RECORD_KINDS, CommitRecord
from isbre.catalog.store import Store
from isbre.catalog.stores import open_store
from isbre.catalog.writer import Writer
from isbre.rest.event_pages import OPERATION_TYPES

ROOT = Path(__file__).parent.parent


def test_the_console_feed_offers_every_kind() -> None:
    source = (ROOT / "console" / "static" / "feed.js").read_text()
    listed = re.search(r"const KINDS = \[(.*?)\];", source, re.S)
    assert listed is not None
    offered = re.findall(r'"([a-z.-]+)"', listed.group(1))  # in the order the page shows them
    assert sorted(offered) == sorted(RECORD_KINDS)


def test_the_commit_log_docs_name_every_kind() -> None:
    row = next(
        line
        for line in (ROOT / "docs" / "commits.md").read_text().splitlines()
        if line.startswith("| `kind` |")
    )
    assert sorted(re.findall(r"`([a-z]+\.[a-z-]+)`", row)) == sorted(RECORD_KINDS)


def test_every_kind_of_change_is_an_operation_of_the_events_pages() -> None:
    assert set(OPERATION_TYPES) == set(RECORD_KINDS) - {PURGE_INCOMPLETE}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(tmp_path / "isbre.lmdb")


def test_a_record_of_no_known_kind_is_never_logged(store: Store) -> None:
    writer = Writer(store)
    try:
        with pytest.raises(ValueError, match=r"table\.comit"):
            writer.execute(lambda batch: batch.log(CommitRecord("table.comit", ["n"])))
        logged = writer.execute(lambda batch: batch.log(CommitRecord("namespace.create", ["n"])))
        assert logged.commit_seq == 1  # the refused one took no commit_seq
    finally:
        writer.close()
        store.close()


def test_a_record_is_encoded_with_the_fields_that_are_set_in_their_order_and_reads_back() -> None:
    record = CommitRecord(
        kind="table.commit",
        namespace=["db", "raw"],
        name="t",
        snapshot_id=7,
        summary={"added_records": 3},
        properties={"nested": {"list": [1, None]}},
        actor="etl",
    )
    record.stamp(12, 1_700_000_000_000_000)
    encoded = record.to_json()
    assert list(json.loads(encoded)) == [
        "kind", "namespace", "name", "snapshot_id", "summary", "properties", "actor", "commit_seq", "ts",
        "run_id",
    ]  # fmt: skip
    assert CommitRecord.from_json(encoded) == record
