"""A file source: Parquet, CSV and JSON-lines files as spans of row ordinals.

Each file is one stream: topic = the file's absolute path, partition 0, and a
row's offset is its ordinal in the file. Ingesting a file again therefore
finds its rows covered, and a file that only grew adds just its new rows.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from sinks.contract import OffsetSpan, SinkError

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json"}


def expand(patterns: list[str]) -> list[Path]:
    """Files named or matched by `patterns` (globs, `**` included), each once, in the order given."""
    found: dict[Path, None] = {}
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise SinkError(f"No file matches {pattern!r}")
        for match in matches:
            path = Path(match).resolve()
            if not path.is_file():
                raise SinkError(f"Not a file: {match}")
            found.setdefault(path, None)
    return list(found)


def file_format(path: Path, forced: str | None = None) -> str:
    if forced:
        return forced
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise SinkError(f"{path}: unknown format (use --format parquet|csv|json)") from None


@dataclass(frozen=True)
class FileBatch:
    batch: pa.RecordBatch
    span: OffsetSpan


def read_file(path: Path, source_id: str, fmt: str, batch_size: int = 65_536) -> Iterator[FileBatch]:
    """The file's rows in order, as batches with the spans of their row ordinals."""
    dataset = ds.dataset(path, format=fmt)
    start = 0
    # Without threads the scanner yields a single file's batches in file order, which offsets rely on.
    for batch in dataset.to_batches(batch_size=batch_size, use_threads=False):
        if batch.num_rows == 0:
            continue
        yield FileBatch(batch, OffsetSpan(source_id, str(path), 0, start, start + batch.num_rows))
        start += batch.num_rows


def row_count(path: Path, fmt: str) -> int | None:
    """Rows in the file, when the format says so without reading it (Parquet)."""
    return ds.dataset(path, format=fmt).count_rows() if fmt == "parquet" else None
