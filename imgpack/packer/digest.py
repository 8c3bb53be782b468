"""Exact per-record digests: the CRC-32 and integer channel sums every record carries.

Workers compute them right after a decode (``digest_from_histogram``); the
writer and resume compute them from bytes (``digest_record``). Integer sums make
a pack's stats independent of worker count and exactly mergeable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from imgpack.format.codec import yuv420_to_rgb
from imgpack.format.layout import CHANNEL_COUNTS, CHANNELS
from imgpack.format.write import record_checksum
from imgpack.packer.jpeg import decode_jpeg

__all__ = ["RecordDigest", "digest_record", "digest_from_histogram", "digest_stored"]

# (crc32 of the stored bytes, per-channel sums, per-channel sums of squares) of one record
# (C = 1 or 3): the sums are of the HWC uint8 pixels a reader gets back
RecordDigest = tuple[int, tuple[int, ...], tuple[int, ...]]

_ROW = 768  # values per row that digest_record sums down: a multiple of 1 and 3 channels
_BLOCK_ROWS = 256  # rows per block: keeps its uint16 and float32 column sums exact
_LEVELS = np.arange(256, dtype=np.int64)[:, None] ** np.arange(3)  # (256, 3): 1, v, v**2


def _channel_of_column(channels: int) -> np.ndarray:
    return np.eye(channels)[np.arange(_ROW) % channels]  # (_ROW, C) of 0/1


_CHANNEL_OF_COLUMN = {c: _channel_of_column(c) for c in CHANNEL_COUNTS}


def digest_record(pixels: np.ndarray, channels: int = CHANNELS) -> RecordDigest:
    """CRC and exact channel sums of one record, given as a uint8 array of any shape.

    Workers use ``digest_from_histogram`` instead (cheaper right after a decode);
    this one serves records read back (resume) and ``append`` without a digest.

    The bytes are summed as rows of ``_ROW`` values (a multiple of C, so column
    j holds channel j % C), down blocks of at most 256 rows: uint16 column sums
    are then exact (256 * 255 < 2**16), and so are float32 sums of squares,
    since every partial sum is an integer below 256 * 255**2 < 2**24 (so any
    summation order gives the same, exact result).
    """
    arr = np.ascontiguousarray(pixels, dtype=np.uint8)
    flat = arr.reshape(-1)
    if flat.size % channels:
        raise ValueError(
            f"record has {flat.size} bytes, not a whole number of {channels}-channel pixels"
        )
    full = flat.size - flat.size % _ROW
    rows = flat[:full].reshape(-1, _ROW)
    cols = np.zeros((2, _ROW))  # float64 column sums: exact far beyond any record's totals
    for k in range(0, rows.shape[0], _BLOCK_ROWS):
        block = rows[k : k + _BLOCK_ROWS]
        cols[0] += np.add.reduce(block, axis=0, dtype=np.uint16)
        wide = block.astype(np.float32)
        cols[1] += np.einsum("ij,ij->j", wide, wide)  # einsum, not BLAS: no threads in workers
    totals = cols @ _CHANNEL_OF_COLUMN[channels]  # (2, C) per-channel totals
    if full < flat.size:  # fewer than _ROW values left over
        tail = flat[full:].reshape(-1, channels).astype(np.float64)
        totals[0] += tail.sum(axis=0)
        totals[1] += (tail * tail).sum(axis=0)
    sums, sums_sq = totals.astype(np.uint64).tolist()
    return record_checksum(arr), tuple(sums), tuple(sums_sq)


def digest_from_histogram(
    data: Any, histogram: Sequence[int], channels: int = CHANNELS
) -> RecordDigest:
    """``digest_record`` of the ``channels``-channel bytes ``data``, given their histogram.

    The histogram is Pillow's ``Image.histogram()`` of the record's image (256
    counts per channel, R then G then B; or L alone): one C pass over pixels
    still in cache. Right after a decode every new numpy call costs microseconds
    of cold code, so the counts, sums and sums of squares of all channels come
    from a single int64 product (exact: counts * 255**2 stay below 2**63).
    """
    counts = np.array(histogram, dtype=np.int64)
    pixels = len(memoryview(data).cast("B")) // channels
    if counts.shape != (channels * 256,):
        raise ValueError(f"histogram of {counts.size} bins, expected {channels * 256}")
    per = (counts.reshape(channels, 256) @ _LEVELS).tolist()
    if any(n != pixels for n, _, _ in per):
        raise ValueError(f"histogram counts {per[0][0]} pixels, the record has {pixels}")
    return record_checksum(data), tuple(s for _, s, _ in per), tuple(q for _, _, q in per)


def digest_stored(buf: Any, codec: str, width: int, height: int, channels: int) -> RecordDigest:
    """The digest of one stored record: the CRC of its bytes as stored, the sums of the
    pixels a reader gets back (yuv420: of ``yuv420_to_rgb``; jpeg: of Pillow's decode, a
    ValueError when it does not decode to a ``width`` x ``height`` record; never of the
    source's pixels)."""
    data = np.frombuffer(buf, dtype=np.uint8)
    if codec == "raw":
        return digest_record(data, channels)
    if codec == "jpeg":
        back = decode_jpeg(data, width, height, channels)
    else:
        back = yuv420_to_rgb(data, width, height)
    _, sums, sums_sq = digest_record(back, channels)
    return record_checksum(data), sums, sums_sq
