"""`_twg_record_id`: a deterministic 128-bit id per record, computed a column at a time.

The id is a function of the source id, topic, partition, offset and payload
values only, so the same record read twice gets the same id on any machine
and in any version of isbre. docs/sinks.md states the algorithm ("rid1");
changing it needs a new name. It identifies records, it does not
authenticate them: it is not a cryptographic hash.

Hashing row by row in Python would cost more than writing the rows, so every
step is a numpy operation over a whole column.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

U64 = np.uint64
# Two independent 64-bit lanes, each with its own seed and multiplier (odd, so multiplying is a bijection).
SEEDS = (U64(0x243F6A8885A308D3), U64(0x13198A2E03707344))
MULTIPLIERS = (U64(0x9E3779B97F4A7C15), U64(0xC2B2AE3D27D4EB4F))
NULL_DIGEST = U64(0x8C5A6F2B1D4E3970)
WORD_TAG = U64(0xD6E8FEB86659FD93)
LENGTH_TAG = U64(0xA0761D6478BD642F)
_TAIL_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=U64)
_MASK64 = (1 << 64) - 1
RECORD_ID = pa.binary(16)


def fmix64(x: np.ndarray, in_place: bool = False) -> np.ndarray:
    """SplitMix64's finalizer: a bijection on 64-bit words that spreads every input bit."""
    # In place with one scratch array: allocating a fresh 8 MB array per step costs more than the math.
    x = x if in_place else x.astype(U64, copy=True)
    scratch = np.right_shift(x, U64(30))
    x ^= scratch
    x *= U64(0xBF58476D1CE4E5B9)
    np.right_shift(x, U64(27), out=scratch)
    x ^= scratch
    x *= U64(0x94D049BB133111EB)
    np.right_shift(x, U64(31), out=scratch)
    x ^= scratch
    return x


def text_digest(text: str) -> int:
    """Digest of a value that is the same for every row of a batch (source id, topic)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _bytes_digest(array: pa.Array) -> np.ndarray:
    """Per-row digest of string/binary values: word sums with word positions, then the length."""
    small = pa.types.is_string(array.type) or pa.types.is_binary(array.type)
    if not small and not pa.types.is_large_string(array.type) and not pa.types.is_large_binary(array.type):
        array = pc.cast(array, pa.large_binary())
    n = len(array)
    _, offsets_buffer, data_buffer = array.buffers()
    offset_type = np.int32 if small else np.int64
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type)[array.offset : array.offset + n + 1]
    offsets = offsets.astype(np.int64)
    lengths = np.diff(offsets)
    longest = (int(lengths.max()) + 7) >> 3 if n else 0
    data = np.zeros(0, dtype=np.uint8) if data_buffer is None else np.frombuffer(data_buffer, dtype=np.uint8)
    # Zero bytes after the data keep every 8-byte read in range (even a short value's read at a later
    # word position); the tail mask drops the bytes that are not the value's.
    tail = 8 * (longest + 1) if longest <= 4 else 8
    padded = np.concatenate([data[: offsets[-1] if n else 0], np.zeros(tail, dtype=np.uint8)])
    unaligned = np.ndarray(shape=(len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))
    if longest <= 4:
        # Short values: one pass per word position over all rows beats gathering every word.
        row_sums = np.zeros(n, dtype=U64)
        starts = offsets[:-1]
        for index in range(longest):
            remaining = lengths - 8 * index
            np.minimum(remaining, 8, out=remaining)
            np.maximum(remaining, 0, out=remaining)
            words = unaligned[starts + 8 * index if index else starts]
            words &= _TAIL_MASKS[remaining]
            words ^= U64((index + 1) * int(WORD_TAG) & _MASK64)
            words *= MULTIPLIERS[0]
            words *= remaining > 0  # a value shorter than this word position has no such word
            row_sums += words
    else:
        words_per_row = (lengths + 7) >> 3
        total_words = int(words_per_row.sum())
        first_word = np.concatenate([[0], np.cumsum(words_per_row)])
        row_of_word = np.repeat(np.arange(n), words_per_row)
        word_index = np.arange(total_words) - first_word[row_of_word]
        position = offsets[row_of_word] + 8 * word_index
        remaining = np.minimum(offsets[row_of_word + 1] - position, 8)
        words = unaligned[position] & _TAIL_MASKS[remaining]
        contributions = (words ^ (word_index.astype(U64) + U64(1)) * WORD_TAG) * MULTIPLIERS[0]
        sums = np.concatenate([[U64(0)], np.cumsum(contributions, dtype=U64)])
        row_sums = sums[first_word[1:]] - sums[first_word[:-1]]
    return fmix64(row_sums + fmix64(lengths.astype(U64) ^ LENGTH_TAG))


def canonical_json(array: pa.Array) -> pa.Array:
    """Each value as compact JSON with sorted keys (nulls stay null): a row at a time, so slow."""
    texts = [
        None if value is None else json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
        for value in array.to_pylist()
    ]
    return pa.array(texts, pa.large_string())


def _json_digest(array: pa.Array) -> np.ndarray:
    # Nested values (struct, list, map, ...) are hashed through their canonical JSON.
    return _bytes_digest(canonical_json(array))


_BYTES_LIKE = (
    pa.types.is_string,
    pa.types.is_binary,
    pa.types.is_large_string,
    pa.types.is_large_binary,
    pa.types.is_string_view,
    pa.types.is_binary_view,
    pa.types.is_fixed_size_binary,
)


def _few_distinct(array: pa.Array, sample: int = 16_384) -> bool:
    """Whether a large column repeats its values (judged from its first `sample` values)."""
    if len(array) < 4 * sample:
        return False
    return pc.count_distinct(array.slice(0, sample)).as_py() * 4 <= sample


def column_digest(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """One 64-bit digest per value; nulls get NULL_DIGEST."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    kind = array.type
    if pa.types.is_null(kind):
        return np.full(len(array), NULL_DIGEST, dtype=U64)
    if pa.types.is_dictionary(kind):
        digests = column_digest(array.dictionary)[pc.fill_null(array.indices, 0).to_numpy().astype(np.int64)]
    elif pa.types.is_floating(kind):
        digests = fmix64(pc.fill_null(pc.cast(array, pa.float64()), 0.0).to_numpy().view(U64))
    elif pa.types.is_unsigned_integer(kind):
        digests = fmix64(pc.fill_null(pc.cast(array, pa.uint64()), 0).to_numpy())
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind) or pa.types.is_temporal(kind):
        if pa.types.is_temporal(kind):  # the stored integer (days, units since the epoch, …)
            array = array.view(pa.int32() if kind.bit_width == 32 else pa.int64())
        digests = fmix64(pc.fill_null(pc.cast(array, pa.int64()), 0).to_numpy().view(U64))
    elif pa.types.is_decimal(kind):
        # The two's-complement unscaled value: 16 bytes, or 32 above precision 38.
        if kind.precision <= 38:
            array = pc.cast(array, pa.decimal128(kind.precision, kind.scale))
        digests = _bytes_digest(array.view(pa.binary(16 if kind.precision <= 38 else 32)))
    elif any(test(kind) for test in _BYTES_LIKE):
        if _few_distinct(array):  # hash each distinct value once: same digests, less work
            return column_digest(pc.dictionary_encode(array))
        digests = _bytes_digest(array)
    else:
        digests = _json_digest(array)
    if array.null_count:
        digests = np.where(array.is_null().to_numpy(zero_copy_only=False), NULL_DIGEST, digests)
    return digests


def record_ids(
    source_id: str,
    topic: str,
    partition: int,
    offsets: np.ndarray,
    payload: Sequence[pa.Array | pa.ChunkedArray],
) -> pa.Array:
    """16 bytes per row (two 64-bit lanes, big-endian), as a fixed_size_binary(16) array."""
    stream = [text_digest(source_id), text_digest(topic), int(fmix64(np.array([partition], dtype=U64))[0])]
    offset_digests = fmix64(offsets.astype(np.int64).view(U64))
    column_digests = [column_digest(column) for column in payload]
    ids = np.empty((len(offsets), 2), dtype=">u8")
    for lane, (seed, multiplier) in enumerate(zip(SEEDS, MULTIPLIERS, strict=True)):
        start = int(seed)
        for digest in stream:  # the same for every row: plain integers, wrapped to 64 bits
            start = ((start ^ digest) * int(multiplier)) & _MASK64
        h = offset_digests ^ U64(start)
        h *= multiplier
        for column_hash in column_digests:
            h ^= column_hash
            h *= multiplier
        ids[:, lane] = fmix64(h, in_place=True)
    return pa.Array.from_buffers(RECORD_ID, len(offsets), [None, pa.py_buffer(ids)])
