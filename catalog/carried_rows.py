"""The rows a copy-on-write commit carried over unchanged, named by position delete files.

A copy-on-write delete, overwrite or upsert (PyIceberg's, Spark's by default) removes a data file
and writes one that holds most of its rows again. A change plan that handed both files over whole
would say those rows were deleted and inserted. So the catalog reads both sides of such a commit
once (each file as its change task reads it: with the deletes that apply to it), nets out the rows
equal on both sides as a multiset (catalog/row_netting.py), and writes, for each file that held
carried rows, a position delete file naming their positions in it (its `referenced-data-file` that
file). A change task lists it among its delete files, so any reader that applies position deletes
reads only the rows the commit changed. What is written is kept where catalog/carried_index.py says.

A commit may remove a file in one snapshot and write its rows again in the next (PyIceberg's
overwrite deletes, then appends): both sides are all of the commit's snapshots. A commit whose
files hold more rows than the caller allows is not read (None): its tasks say so, and a reader
nets the rows itself.
"""

from __future__ import annotations

import io as bytes_io
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from isbre.catalog.carried_index import CarriedFile, carried_location, index_json, index_location, read_index
from isbre.catalog.compaction_files import live_rows
from isbre.catalog.confined_io import ConfinedIO
from isbre.catalog.lru import Lru
from isbre.catalog.row_netting import net
from isbre.catalog.table_handles import OutsideTableError
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

log = logging.getLogger(__name__)

# The spec's reserved field ids of a position delete file's columns. The one path repeated is a
# dictionary and the ascending positions are delta-encoded: a file naming 200,000 rows takes 4 KiB
# and 5 ms to write (1 MiB and 60 ms plainly).
_FILE_PATH_ID, _POS_ID = 2147483546, 2147483545
_PATHS = pa.dictionary(pa.int32(), pa.string())
_POSITION_DELETES = pa.schema(
    [
        pa.field("file_path", _PATHS, nullable=False, metadata={b"PARQUET:field_id": str(_FILE_PATH_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(_POS_ID)}),
    ]
)
_WRITE: dict[str, Any] = {
    "use_dictionary": ["file_path"],
    "column_encoding": {"pos": "DELTA_BINARY_PACKED"},
    "store_schema": False,  # read back as the strings and longs the spec names
}
# Snapshots whose netting this process has read or made (its index never changes).
KEPT_INDEXES = 4096


@dataclass(frozen=True)
class Side:
    """A data file a commit removed (`inserted` False) or added, with the deletes it is read with."""

    data_file: DataFile
    deletes: tuple[DataFile, ...]
    inserted: bool


class CarriedRows:
    """The carried rows of copy-on-write commits, netted once per commit and then read back."""

    def __init__(self) -> None:
        self._known: Lru[str, list[CarriedFile]] = Lru(KEPT_INDEXES)

    def deletes(
        self,
        io: ConfinedIO,
        metadata: TableMetadata,
        snapshot: Snapshot,
        sides: Sequence[Side],
        max_rows: int,
    ) -> dict[str, DataFile] | None:
        """By data file path, the position delete file naming the rows of that file that the commit
        carried over (`sides`: all of its removed and added files; `snapshot`: its first snapshot
        that removed one, which what is kept goes by; files without any are not there). None where
        they were not worked out: the files hold more than `max_rows` rows, or cannot be read or
        written by the catalog (the reason is logged), or one file is on both sides (added and
        removed by one commit), or the table is format v1, which has no delete files for a reader
        to apply."""
        if metadata.format_version < 2 or len({side.data_file.file_path for side in sides}) < len(sides):
            return None
        location = index_location(snapshot)
        found = self._known.peek(location)
        try:
            if found is None:
                found = read_index(io, snapshot)
            if found is None:
                if sum(side.data_file.record_count for side in sides) > max_rows:
                    return None
                found = _net(io, metadata, snapshot, sides)
        except (OutsideTableError, OSError) as exc:
            log.warning("the carried rows of snapshot %s were left to readers: %s", snapshot.snapshot_id, exc)
            return None
        self._known.put(location, found)
        by_path = {side.data_file.file_path: side.data_file for side in sides}
        return {
            each.data_file: _delete_file(each, by_path[each.data_file])
            for each in found
            if each.data_file in by_path
        }


def _net(
    io: ConfinedIO, metadata: TableMetadata, snapshot: Snapshot, sides: Sequence[Side]
) -> list[CarriedFile]:
    """Read both sides, net them, and write a position delete file for each file with carried rows,
    then the index."""
    read = [
        (rows, positions.to_numpy(zero_copy_only=False))
        for rows, positions in live_rows(metadata, io, [(side.data_file, side.deletes) for side in sides])
    ]
    rows = pa.concat_tables([rows for rows, _ in read], promote_options="permissive")
    inserted = np.concatenate(
        [
            np.full(found.num_rows, side.inserted, dtype=bool)
            for (found, _), side in zip(read, sides, strict=True)
        ]
    )
    changed = np.zeros(rows.num_rows, dtype=bool)
    for positions in net(rows, inserted):
        changed[positions] = True
    written = []
    start = 0
    for (found, positions), side in zip(read, sides, strict=True):
        carried = np.sort(positions[~changed[start : start + found.num_rows]])
        start += found.num_rows
        if not len(carried):
            continue
        path = side.data_file.file_path
        location = carried_location(snapshot, path)
        buffer = bytes_io.BytesIO()
        paths = pa.DictionaryArray.from_arrays(pa.array(np.zeros(len(carried), np.int32)), pa.array([path]))
        pq.write_table(pa.table({"file_path": paths, "pos": carried}, _POSITION_DELETES), buffer, **_WRITE)
        io.publish(location, buffer.getvalue())
        written.append(CarriedFile(path, location, len(carried), buffer.tell()))
    io.publish(index_location(snapshot), index_json(written))
    return written


def _delete_file(carried: CarriedFile, data_file: DataFile) -> DataFile:
    made = DataFile.from_args(
        3,
        content=DataFileContent.POSITION_DELETES,
        file_path=carried.location,
        file_format=FileFormat.PARQUET,
        partition=data_file.partition,
        record_count=carried.record_count,
        file_size_in_bytes=carried.file_size_in_bytes,
        referenced_data_file=data_file.file_path,
    )
    made.spec_id = data_file.spec_id
    return made
