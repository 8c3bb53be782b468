"""One source's record as an array, for tests: what the packer would store, decoded."""

from __future__ import annotations

import os

import numpy as np

from imgpack.errors import SourceError
from imgpack.packer.decode import DecodeSettings, Kept, decode_record, pillow_quiet

__all__ = ["decode_image"]


def decode_image(path: str | os.PathLike | bytes, settings: DecodeSettings) -> np.ndarray:
    """Decode ``path`` (or an image's encoded bytes) to a (height, width, C) uint8
    C-contiguous, writable array.

    A file that cannot be a record raises ``SourceError`` whose message is the short
    reason ``decode_record`` gives, without the path (the caller knows which file it asked for).
    """
    with pillow_quiet():
        decoded = decode_record(path, settings)
    if isinstance(decoded, str):
        raise SourceError(decoded)
    record = decoded[0]
    return record.pixels.copy() if isinstance(record, Kept) else np.array(record, dtype=np.uint8)
