"""The Parquet raw lane: durable files with the metadata columns, readable back, replay-safe."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from isbre.sinks.columns import MetadataColumns
from isbre.sinks.parquet import ParquetSink

from tests.sink_helpers import rows, span


def test_writes_a_whole_file_with_metadata_columns_and_replay_adds_nothing(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path / "raw")
    sink.push(rows(100, 150), span(100, 150))
    sink.push(rows(150, 160), span(150, 160))
    info, covered = sink.finish()
    assert covered == span(100, 160)
    path = Path(info.table)
    assert path.parent == tmp_path / "raw" and not list(path.parent.glob("*.tmp"))
    table = pq.read_table(path)
    assert table.column_names == ["n", "label", *MetadataColumns().names]
    assert table["n"].to_pylist() == list(range(100, 160))
    assert table["_twg_source_offset"].to_pylist() == list(range(100, 160))
    assert set(table["_twg_source_topic"].to_pylist()) == {"orders"}
    stamps = zip(table["_twg_ingest_ts"].to_pylist(), table["_twg_emit_ts"].to_pylist(), strict=True)
    assert all(ingested <= emitted for ingested, emitted in stamps)

    modified = path.stat().st_mtime_ns
    again = ParquetSink(tmp_path / "raw")
    again.push(rows(100, 160), span(100, 160))
    assert again.finish() == (info, covered)
    assert path.stat().st_mtime_ns == modified and len(list(path.parent.iterdir())) == 1
