"""What ``DeviceTransform`` reads of any dataset's geometry: ``RecordShape`` and
``SourceGeometry``.

``DeviceTransform.train``/``eval`` read per-record geometry only from a ``SourceGeometry``
(anything else reads as its own source) and stop each sample's taps at its record's own
size (``RecordShape.record_sizes``). ``PackedImageDataset`` is both; a user's own dataset
may be either. (What the loader needs of a pack is no protocol: the loader reads whole
batches of a ``PackedImageDataset`` only, through its private members.)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["RecordShape", "SourceGeometry"]


@runtime_checkable
class RecordShape(Protocol):
    """uint8 records within one bound.

    ``shape``: (H, W, C), the bound: every record is at most H x W (the batch canvas).
    ``record_sizes``: int64 (N, 2), (width, height) of each record; every row (W, H)
    where the records share the bound's size.
    """

    @property
    def shape(self) -> tuple[int, int, int]: ...

    @property
    def record_sizes(self) -> np.ndarray: ...


@runtime_checkable
class SourceGeometry(Protocol):
    """Where each record came from, for crops drawn in source pixels (``imgpack.reader.augment``).

    ``source_sizes``: (N, 2) (width, height) of each source image after EXIF rotation.
    ``source_boxes``: (N, 4) (left, top, right, bottom) in source pixels that each record shows.
    ``content_boxes``: (N, 4) (left, top, right, bottom) in record pixels where that part lies.
    """

    @property
    def source_sizes(self) -> np.ndarray: ...

    @property
    def source_boxes(self) -> np.ndarray: ...

    @property
    def content_boxes(self) -> np.ndarray: ...
