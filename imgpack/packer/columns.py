"""The small per-record columns a ``PackWriter`` keeps in memory until ``finish()``.

Labels, CRCs, paths, record sizes (and jpeg lengths), geometry, target vectors and the
exact channel sums: compact arrays, a few dozen bytes per record, turned into the
sections and record fields that follow the pixels. Split from ``writer`` so that the
writer is only about bytes on disk and publishing them.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from imgpack.format.fields import (
    GEOMETRY_FIELDS,
    RECORD_FIELDS,
    RECORD_LENGTH,
    RECORD_SIZE,
    RecordGeometry,
    whole_record,
)
from imgpack.format.layout import record_nbytes
from imgpack.packer.digest import RecordDigest

__all__ = ["RecordColumns"]


class RecordColumns:
    """Every record's small columns, appended in record order.

    ``codec`` decides whether a record's length is stored (jpeg: ``record_length``) or
    follows from its size; ``target_dim`` K > 0 keeps K floats per record.
    """

    def __init__(self, codec: str, channels: int, target_dim: int) -> None:
        self.codec, self.channels, self.target_dim = codec, channels, target_dim
        self.labels = array("i")
        self.crcs = array("I")
        self.path_offsets = array("Q", [0])
        self.paths = bytearray()
        self.record_sizes = array("I")  # (width, height) of each record
        self.lengths = array("I")  # jpeg: bytes of each record as stored
        self.source_sizes = array("I")
        self.source_boxes = array("f")
        self.content_boxes = array("f")
        self.targets = array("f")
        self.sums = [0] * channels
        self.sums_sq = [0] * channels
        self.pixels = 0  # per channel, in every record: the stats' N
        self.pixels_nbytes = 0  # the records' bytes: where the next one goes
        self.stored_as_is = 0  # jpeg: records that are a source's own bytes

    @property
    def count(self) -> int:
        return len(self.labels)

    def nbytes(self, size: tuple[int, int], length: int | None) -> int:
        """Bytes of one record of ``size`` (jpeg: its ``length``, which must be given)."""
        if self.codec == "jpeg":
            if length is None:
                raise ValueError("a jpeg record needs its length")
            return length
        return record_nbytes(self.codec, size[0], size[1], self.channels)

    def add(
        self,
        label: int,
        relpath: str,
        digest: RecordDigest,
        geometry: RecordGeometry | None,
        target: Any,
        size: tuple[int, int],
        length: int | None = None,
        as_is: bool = False,
    ) -> None:
        """One record's columns; ``geometry`` None: the record is its whole source."""
        crc, sums, sums_sq = digest
        nbytes = self.nbytes(size, length)
        self.labels.append(label)
        self.record_sizes.extend(size)
        if self.codec == "jpeg":
            self.lengths.append(nbytes)
            self.stored_as_is += bool(as_is)
        self.pixels_nbytes += nbytes
        self.pixels += size[0] * size[1]
        self.crcs.append(crc)
        self.paths += relpath.encode("utf-8")
        self.path_offsets.append(len(self.paths))
        if geometry is None:
            geometry = whole_record(*size)
        source_size, sbox, cbox = geometry
        self.source_sizes.extend(source_size)
        self.source_boxes.extend(sbox)
        self.content_boxes.extend(cbox)
        if target is not None:
            self.targets.extend(target)
        for c in range(self.channels):
            self.sums[c] += sums[c]
            self.sums_sq[c] += sums_sq[c]

    def payloads(self) -> tuple[dict[str, bytes], list[tuple[str, str, tuple[int, ...]]]]:
        """Bytes of the sections after the pixels and of the record fields, in file order;
        the fields' (name, dtype, shape), in the order they are laid out."""
        arrays = {
            "labels": (self.labels, "<i4"),
            "checksums": (self.crcs, "<u4"),
            "path_offsets": (self.path_offsets, "<u8"),
            "paths": (self.paths, "|u1"),
            RECORD_SIZE: (self.record_sizes, "<u4"),
        }
        names = [RECORD_SIZE]
        if self.codec == "jpeg":
            arrays[RECORD_LENGTH] = (self.lengths, "<u4")
            names.append(RECORD_LENGTH)
        arrays.update(
            {
                "source_size": (self.source_sizes, "<u4"),
                "source_box": (self.source_boxes, "<f4"),
                "content_box": (self.content_boxes, "<f4"),
            }
        )
        names += GEOMETRY_FIELDS
        if self.target_dim:
            arrays["targets"] = (self.targets, "<f4")
        columns = {
            name: np.frombuffer(a, np.dtype(getattr(a, "typecode", "B"))).astype(dt).tobytes()
            for name, (a, dt) in arrays.items()
        }
        specs = [(n, RECORD_FIELDS[n].dtype, RECORD_FIELDS[n].shape) for n in names]
        if self.target_dim:
            specs.append(("targets", "<f4", (self.target_dim,)))
        return columns, specs
