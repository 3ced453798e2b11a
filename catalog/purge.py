"""Deleting a dropped table's files, confined and best effort.

Every path comes from metadata that a client wrote (manifest lists, manifests,
data files, statistics, the metadata log), so each goes through the table's
confined deleter (catalog/deletion.py), which removes only what lies inside the
table's own resolved location. A file that cannot be read or deleted does not
stop the purge: the rest is still deleted, and the report says what was left
behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from isbre.catalog.carried_index import carried_files
from isbre.catalog.confined_io import ConfinedIO, ForeignPathError
from isbre.catalog.deletion import TableFiles, delete_each
from isbre.catalog.manifest_entries import read_entries
from isbre.catalog.manifest_lists import read_manifests
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestFile
from pyiceberg.table.metadata import TableMetadata

# How many paths of each kind a purge record lists.
LISTED = 20


class PurgeIncompleteError(Exception):
    """The table was dropped, but some of its files could not be read or deleted."""


@dataclass
class PurgeReport:
    location: str | None
    deleted: int = 0
    skipped: list[str] = field(default_factory=list)  # outside what may be deleted
    problems: list[str] = field(default_factory=list)  # could not be read or deleted

    @property
    def left_behind(self) -> bool:
        return bool(self.skipped or self.problems)

    def summary(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "deleted": self.deleted,
            "skipped": len(self.skipped),
            "skipped_files": self.skipped[:LISTED],
            "problems": self.problems[:LISTED],
        }


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _manifest_paths(io: ConfinedIO, metadata: TableMetadata, report: PurgeReport) -> dict[str, str]:
    """Every file the snapshots name, with what it is; what cannot be read is a problem, and what
    is not the table's to read is left alone, unread."""
    found: dict[str, str] = {}
    manifests: dict[str, ManifestFile] = {}
    for snapshot in metadata.snapshots:
        found[snapshot.manifest_list] = "manifest list"
        try:
            for manifest in read_manifests(io, snapshot.manifest_list, metadata.format_version):
                manifests[manifest.manifest_path] = manifest
        except ForeignPathError:
            continue  # skipped when its deletion is refused too
        except Exception as exc:
            report.problems.append(f"manifest list {snapshot.manifest_list}: {_described(exc)}")
    for path, manifest in manifests.items():
        found[path] = "manifest"
        try:
            for entry in read_entries(io, manifest, metadata.format_version, discard_deleted=False):
                found[entry.data_file.file_path] = "data file"
        except ForeignPathError:
            continue
        except Exception as exc:
            report.problems.append(f"manifest {path}: {_described(exc)}")
    return found


def _carried_files(io: ConfinedIO, metadata: TableMetadata, report: PurgeReport) -> dict[str, str]:
    try:
        return carried_files(io, metadata)
    except Exception as exc:
        report.problems.append(f"the carried rows' files: {_described(exc)}")
        return {}


def purge_files(
    io: FileIO, metadata: TableMetadata | None, extra: list[str], files: TableFiles | None
) -> PurgeReport:
    """Delete the files `metadata` names (and `extra`) through `files`, the table's deleter (None:
    the table's location itself may not be deleted from, so everything is left behind); manifests
    are read only where `files` allows."""
    report = PurgeReport(metadata.location if metadata else None)
    named: dict[str, str] = {}
    if metadata is not None:
        named |= _manifest_paths(ConfinedIO(io, files), metadata, report)
        named |= {entry.metadata_file: "previous metadata" for entry in metadata.metadata_log}
        named |= {stat.statistics_path: "statistics" for stat in metadata.statistics}
        named |= {stat.statistics_path: "partition statistics" for stat in metadata.partition_statistics}
        named |= _carried_files(ConfinedIO(io, files), metadata, report)
    named |= {path: "metadata" for path in extra}
    done = delete_each(files, named.items())
    report.deleted += done.deleted
    report.skipped += done.skipped
    report.problems += done.problems
    if files is not None:
        try:
            files.remove_empty_directories()  # only empty ones: they hold nothing of anyone
        except Exception as exc:
            report.problems.append(f"directories under {files.location}: {_described(exc)}")
    return report
