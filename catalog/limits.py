"""Ceilings on what one commit may make the catalog keep: property values, metadata files, and the
free disk space it leaves. Each refusal names the setting that sets it."""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


class InsufficientStorageError(Exception):
    """The disk is (nearly) full: nothing was written; the same request can succeed once there is room."""


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class MetadataTooLargeError(ValueError):
    """A commit would make a metadata file larger than the ceiling (413)."""


@dataclass(frozen=True)
class Limits:
    max_property_value_bytes: int = 256 << 10
    max_metadata_bytes: int = 64 << 20
    min_free_disk_bytes: int = 0

    def check_properties(self, properties: Mapping[str, str], what: str) -> None:
        for key, value in properties.items():
            if len(value.encode("utf-8", errors="surrogatepass")) > self.max_property_value_bytes:
                raise ValueError(
                    f"{what} property {key[:60]!r} is longer than max_property_value_kb = "
                    f"{self.max_property_value_bytes >> 10}"
                )

    def check_metadata(self, data: bytes, what: str) -> None:
        if len(data) > self.max_metadata_bytes:
            raise MetadataTooLargeError(
                f"{what} metadata would be {len(data)} bytes, over max_metadata_mb = "
                f"{self.max_metadata_bytes / (1 << 20):g}"
            )

    def check_room(self, directory: Path | None) -> None:
        """Refuse to write while the disk holding `directory` has less free space than configured:
        a disk that fills mid-write is harder to recover from than a refusal."""
        if directory is None or not self.min_free_disk_bytes:
            return
        try:
            stats = os.statvfs(directory)
        except OSError:
            return  # not there yet (a warehouse being created): the write itself will tell
        free = stats.f_bavail * stats.f_frsize
        if free < self.min_free_disk_bytes:
            raise InsufficientStorageError(
                f"The warehouse's disk has {free >> 20} MiB free, less than min_free_disk_mb = "
                f"{self.min_free_disk_bytes >> 20}: commits resume once there is room"
            )
