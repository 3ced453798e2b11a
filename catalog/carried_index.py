"""Where the catalog keeps the position delete files that name the rows a copy-on-write commit
carried over (catalog/carried_rows.py), and the index that lists them.

They lie beside the manifest list of the commit's first snapshot that removed a data file (a
`delete` or `overwrite`), in a folder of that snapshot's own (`isbre-carried-<snapshot-id>/`), its
`index.json` written last: a commit whose index is there was netted, whichever process did it.
They are the table's files as its manifests are: orphan removal keeps those of the snapshots the
table holds (`carried_files`) and removes the others once old enough, and a purge removes them
with the rest.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from isbre.catalog.confined_io import ForeignPathError
from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot

log = logging.getLogger(__name__)

INDEX = "index.json"
# The operations that may remove a data file and write its rows again.
REWRITING = (Operation.OVERWRITE, Operation.DELETE)


@dataclass(frozen=True)
class CarriedFile:
    """A position delete file the catalog wrote: the positions in `data_file` of the rows carried over."""

    data_file: str
    location: str
    record_count: int
    file_size_in_bytes: int


def carried_folder(snapshot: Snapshot) -> str:
    return f"{snapshot.manifest_list.rsplit('/', 1)[0]}/isbre-carried-{snapshot.snapshot_id}"


def index_location(snapshot: Snapshot) -> str:
    return f"{carried_folder(snapshot)}/{INDEX}"


def carried_location(snapshot: Snapshot, data_file: str) -> str:
    """Where the position delete file of `data_file`'s carried rows goes: a name the catalog alone
    decides, so that an index naming anything else is not the catalog's."""
    return f"{carried_folder(snapshot)}/{hashlib.sha256(data_file.encode()).hexdigest()[:32]}.parquet"


def index_json(files: list[CarriedFile]) -> bytes:
    return json.dumps(
        {
            "files": [
                {
                    "data-file": each.data_file,
                    "location": each.location,
                    "record-count": each.record_count,
                    "file-size-in-bytes": each.file_size_in_bytes,
                }
                for each in files
            ]
        }
    ).encode()


def read_index(io: FileIO, snapshot: Snapshot) -> list[CarriedFile] | None:
    """The files the index of `snapshot`'s commit lists; None where there is none (the commit was
    not netted yet), or where it is not one the catalog wrote: the table's writer may write its
    folders, and an index naming a file the catalog did not name (another table's) is not believed."""
    location = index_location(snapshot)
    try:
        with io.new_input(location).open() as stream:
            found: dict[str, Any] = json.loads(stream.read())
        listed = [
            CarriedFile(each["data-file"], each["location"], each["record-count"], each["file-size-in-bytes"])
            for each in found["files"]
        ]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("%s is not an index the catalog wrote (%s): not believed", location, exc)
        return None
    strangers = [
        each.location for each in listed if each.location != carried_location(snapshot, each.data_file)
    ]
    if strangers:
        log.warning("%s names files the catalog did not write (%s): not believed", location, strangers[0])
        return None
    return listed


def carried_files(io: FileIO, metadata: TableMetadata) -> dict[str, str]:
    """Every file the catalog keeps for the table's snapshots' carried rows, with what it is (an
    index the table may not read, outside its places, is skipped: none was written there)."""
    found: dict[str, str] = {}
    for snapshot in metadata.snapshots:
        if snapshot.summary is None or snapshot.summary.operation not in REWRITING:
            continue
        try:
            listed = read_index(io, snapshot)
        except ForeignPathError:
            continue
        if listed is None:
            continue
        found[index_location(snapshot)] = "carried rows index"
        found |= {each.location: "carried rows" for each in listed}
    return found
