"""Deletion vectors written as Iceberg's Puffin spec lays them out, for tests: PyIceberg 0.12 reads
them and writes none.

A `deletion-vector-v1` blob is its length (4 bytes, big-endian), a magic number, the positions as
a portable 64-bit roaring bitmap (a count of 32-bit bitmaps, then each one's key and its
portable serialization), and a CRC-32 of the magic and the bitmap. The file is `PFA1`, the
blobs, and a footer: `PFA1`, the JSON that says where each blob is, its length, flags, `PFA1`.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

from pyiceberg.io import FileIO
from pyroaring import BitMap

MAGIC = b"PFA1"
VECTOR_MAGIC = bytes([0xD1, 0xD3, 0x39, 0x64])
ROW_POSITION_FIELD_ID = 2147483545  # the spec's `_pos`, the field a deletion vector is of


@dataclass(frozen=True)
class WrittenVector:
    offset: int
    length: int
    file_size: int


def _vector(positions: list[int]) -> bytes:
    keys: dict[int, BitMap] = {}
    for position in positions:
        keys.setdefault(position >> 32, BitMap()).add(position & 0xFFFFFFFF)
    bitmap = len(keys).to_bytes(8, "little") + b"".join(
        key.to_bytes(4, "little") + keys[key].serialize() for key in sorted(keys)
    )
    framed = VECTOR_MAGIC + bitmap
    return len(framed).to_bytes(4, "big") + framed + zlib.crc32(framed).to_bytes(4, "big")


def write_deletion_vector(
    io: FileIO,
    path: str,
    referenced_data_file: str,
    positions: list[int],
    snapshot_id: int,
    sequence_number: int,
) -> WrittenVector:
    """A Puffin file at `path` holding one deletion vector of `referenced_data_file`."""
    blob = _vector(positions)
    footer = {
        "blobs": [
            {
                "type": "deletion-vector-v1",
                "fields": [ROW_POSITION_FIELD_ID],
                "snapshot-id": snapshot_id,
                "sequence-number": sequence_number,
                "offset": len(MAGIC),
                "length": len(blob),
                "properties": {
                    "referenced-data-file": referenced_data_file,
                    "cardinality": str(len(positions)),
                },
            }
        ]
    }
    payload = json.dumps(footer).encode()
    content = MAGIC + blob + MAGIC + payload + len(payload).to_bytes(4, "little") + bytes(4) + MAGIC
    with io.new_output(path).create(overwrite=True) as stream:
        stream.write(content)
    return WrittenVector(len(MAGIC), len(blob), len(content))
