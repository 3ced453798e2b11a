"""A file source: Parquet, CSV and JSON-lines files as spans of row ordinals.

Each file is one stream: topic = the file's absolute path, partition 0, and a
row's offset is its ordinal in the file. Ingesting a file again therefore
finds its rows covered, and a file that only grew adds just its new rows.

CSV and JSON carry no types: given `types` (the target table's columns, or
types named on the command line), their values are parsed as those types, and
a value that does not parse is an error naming the file, the line and the
column; columns not named are inferred.
"""

from __future__ import annotations

import csv
import glob
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.json as pajson
from isbre.sinks.contract import OffsetSpan, SinkError

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


def _batches(path: Path, fmt: str, batch_size: int, types: pa.Schema | None) -> Iterator[pa.RecordBatch]:
    if fmt == "json" and types:
        # The dataset API infers JSON types whatever the parse options say; the streaming reader
        # takes the explicit ones.
        options = pajson.ParseOptions(explicit_schema=types, unexpected_field_behavior="infer")
        yield from pajson.open_json(path, parse_options=options)
        return
    if fmt == "csv" and types:
        dataset = ds.dataset(
            path, format=ds.CsvFileFormat(convert_options=pacsv.ConvertOptions(column_types=types))
        )
    else:
        dataset = ds.dataset(path, format=fmt)  # Parquet has types of its own
    # Without threads the scanner yields a single file's batches in file order, which offsets rely on.
    yield from dataset.to_batches(batch_size=batch_size, use_threads=False)


_CSV_ERROR = re.compile(r"In CSV column #(\d+): Row #(\d+): (.*)", re.S)
_CSV_RECORD_ERROR = re.compile(r"In CSV column #(\d+): (?:Row #\d+: )?(.*)", re.S)  # one record's
REFUSED_COLUMNS = ("record", "reason", "error")
_JSON_ERROR = re.compile(r"JSON parse error: (.*) in row (\d+)", re.S)
_CSV_ROW_ERROR = re.compile(r"CSV parse error: Row #(\d+): (.*)", re.S)  # a row that is no record


def _column_named(header: list[str], index: str) -> str:
    return header[int(index)] if int(index) < len(header) else f"#{index}"


class UnparsableError(SinkError):
    """A value of the file does not parse as its column's type (the message names line and column)."""


def _unparsable(path: Path, fmt: str, error: pa.ArrowInvalid) -> SinkError:
    """The file's own words for where a value did not parse: line (1-based, as an editor counts)
    and column."""
    text = str(error)
    if fmt == "csv" and (found := _CSV_ERROR.search(text)):
        column, line, detail = found.groups()
        with path.open(newline="") as lines:
            header = next(csv.reader(lines), [])
        name = _column_named(header, column)
        return UnparsableError(f"{path}: line {line}, column {name!r}: {detail.strip()}")
    if fmt == "json" and (found := _JSON_ERROR.search(text)):
        detail, row = found.groups()
        return UnparsableError(f"{path}: line {int(row) + 1}: {detail.strip()}")
    if fmt == "csv" and (found := _CSV_ROW_ERROR.search(text)):
        line, detail = found.groups()
        return UnparsableError(f"{path}: line {line}: {detail.strip()}")
    # A record that is none (a row of more or fewer fields than the header, broken JSON) is the
    # record's fault too: read record by record, it is set apart with reason `decode`.
    kind = UnparsableError if fmt in ("csv", "json") else SinkError
    return kind(f"{path}: cannot read it as {fmt}: {text.strip().splitlines()[-1]}")


def read_file(
    path: Path, source_id: str, fmt: str, batch_size: int = 65_536, types: pa.Schema | None = None
) -> Iterator[FileBatch]:
    """The file's rows in order, as batches with the spans of their row ordinals."""
    try:
        start = 0
        for batch in _batches(path, fmt, batch_size, types):
            if batch.num_rows == 0:
                continue
            yield FileBatch(batch, OffsetSpan(source_id, str(path), 0, start, start + batch.num_rows))
            start += batch.num_rows
    except pa.ArrowInvalid as error:
        raise _unparsable(path, fmt, error) from error


@dataclass(frozen=True)
class Sorted:
    """A file read record by record: the records that parse, with their ordinals (offsets), and the
    text of those that do not, each with the error that names its line (and column)."""

    parsed: pa.Table
    offsets: np.ndarray
    refused: pa.RecordBatch  # REFUSED_COLUMNS: the record's text, `decode` or `contract`, the error
    refused_offsets: np.ndarray

    @property
    def records(self) -> int:
        return len(self.offsets) + len(self.refused_offsets)


def _records(path: Path, fmt: str) -> Iterator[tuple[int, str, str]]:
    """(first line, the record as a file of its own, its text) for each record of the file: a CSV
    row after the header, re-quoted (a quoted field may span lines), or a JSON line."""
    with path.open(newline="") as stream:
        if fmt == "json":
            for number, line in enumerate(stream, start=1):
                if line.strip():
                    yield number, line, line.rstrip("\r\n")
            return
        rows = csv.reader(stream)
        header = next(rows, [])
        last = rows.line_num
        for row in rows:
            single = io.StringIO()
            csv.writer(single).writerows([header, row])
            record = io.StringIO()
            csv.writer(record, lineterminator="").writerow(row)
            yield last + 1, single.getvalue(), record.getvalue()
            last = rows.line_num


def _parse_one(text: str, fmt: str, types: pa.Schema | None) -> pa.Table:
    """One record parsed with the options `_batches` reads its file with."""
    data = io.BytesIO(text.encode())
    if fmt == "json":
        options = (
            pajson.ParseOptions(explicit_schema=types, unexpected_field_behavior="infer") if types else None
        )
        return pajson.read_json(data, parse_options=options)
    return pacsv.read_csv(data, convert_options=pacsv.ConvertOptions(column_types=types or {}))


def _reason(text: str, fmt: str) -> str:
    """Why a record was refused: `decode` when it is no record at all (not JSON, a CSV row that
    does not split into the file's columns), `contract` when a value does not take its type."""
    try:
        _parse_one(text, fmt, None)
    except pa.ArrowInvalid:
        return "decode"
    return "contract"


def read_sorted(path: Path, fmt: str, types: pa.Schema | None) -> Sorted:
    """`path` (CSV or JSON lines) parsed one record at a time, so that a record whose value does not
    fit its column's type is set apart instead of refusing the file; slow (a parse per record),
    for the files `read_file` refused."""
    parsed: list[pa.Table] = []
    offsets: list[int] = []
    refused: list[dict[str, str]] = []
    refused_offsets: list[int] = []
    for ordinal, (line, single, text) in enumerate(_records(path, fmt)):
        try:
            parsed.append(_parse_one(single, fmt, types))
            offsets.append(ordinal)
        except pa.ArrowInvalid as error:
            message = f"{path}: line {line}: {str(error).strip().splitlines()[-1]}"
            if fmt == "json" and (found := _JSON_ERROR.search(str(error))):
                # The row is the one-line parse's (always 0): the file's line says where.
                message = f"{path}: line {line}: {found.group(1).strip()}"
            if fmt == "csv" and (found := _CSV_RECORD_ERROR.search(str(error))):
                column, detail = found.groups()
                name = _column_named(next(csv.reader(io.StringIO(single)), []), column)
                message = f"{path}: line {line}, column {name!r}: {detail.strip()}"
            refused.append({"record": text, "reason": _reason(single, fmt), "error": message})
            refused_offsets.append(ordinal)
    table = pa.concat_tables(parsed, promote_options="permissive") if parsed else pa.table({})
    return Sorted(
        table,
        np.array(offsets, dtype=np.int64),
        pa.RecordBatch.from_pylist(refused, pa.schema([(name, pa.string()) for name in REFUSED_COLUMNS])),
        np.array(refused_offsets, dtype=np.int64),
    )


def run_types(files: list[Path], forced: str | None, known: pa.Schema | None) -> pa.Schema | None:
    """`known` (the table's columns, types named on the command line), with the columns of the run's
    untyped files (CSV, JSON lines) that it lacks typed from every file of the run: a column that
    holds whole numbers in one file and fractions in another is a double for all of them, as
    two runs would make it. A column of CSV files alone that the files cannot agree on is text
    in all of them (so which file comes first does not decide its type); other columns the files
    cannot agree on are left to each file (and refused there, saying why)."""
    inferred: list[pa.Schema] = []
    untyped_text: list[bool] = []  # per inferred schema: read from CSV, where any value is text
    for path in files:
        try:
            fmt = file_format(path, forced)
            if fmt == "parquet":
                continue
            reader = pacsv.open_csv(path) if fmt == "csv" else pajson.open_json(path)
        except (SinkError, pa.ArrowInvalid):
            continue  # reading the file says what is wrong with it, in its turn
        inferred.append(reader.schema)
        untyped_text.append(fmt == "csv")
    if not inferred:
        return known
    names = set(known.names) if known is not None else set()
    fields = list(known) if known is not None else []
    for name in dict.fromkeys(field.name for schema in inferred for field in schema):
        if name in names:
            continue
        holding = [
            (s.field(name), csv) for s, csv in zip(inferred, untyped_text, strict=True) if name in s.names
        ]
        try:
            agreed = pa.unify_schemas(
                [pa.schema([f]) for f, _ in holding], promote_options="permissive"
            ).field(0)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            if not all(csv for _, csv in holding):
                continue
            agreed = pa.field(name, pa.string())
        fields.append(agreed)
    return pa.schema(fields) if fields else None


def row_count(path: Path, fmt: str) -> int | None:
    """Rows in the file, when the format says so without reading it (Parquet)."""
    return ds.dataset(path, format=fmt).count_rows() if fmt == "parquet" else None
