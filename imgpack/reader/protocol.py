"""What imgpack needs of a dataset, written once: ``PackedSource`` and its two small parts.

``make_loader`` asks one question of the dataset it is given, once, with ``isinstance``:
is it a ``PackedSource`` without a per-sample transform? Then batches are read whole
(``gather_into``, or ``decode_into`` for codec "jpeg", by the loader's read stage) and
nothing else in the loader asks again. Anything else (a user's map-style dataset, a
``ConcatDataset``, a dataset with a per-sample ``transform``) is served the torch way,
sample by sample through a collate. ``DeviceTransform.train``/``eval`` read per-record
geometry only from a ``SourceGeometry`` (anything else reads as its own source) and stop
each sample's taps at its record's own size (``RecordShape.record_sizes``).

A ``JpegSource`` (a ``PackedSource`` of codec "jpeg") decodes a batch at a scale per
record into a canvas of any size: the loader then decodes each record at the scale its
crop needs (``imgpack.reader.plan``).

``PackedImageDataset`` is all four; stand-ins, or a user's own fast dataset, may be
some. The protocols are ``runtime_checkable``: a check looks every member up on the
object (before Python 3.12 that runs properties), so ``PackedSource``'s members are
cheap to read, and ``SourceGeometry``'s and ``record_sizes`` are read once and kept by
the dataset.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np
import torch

__all__ = [
    "RecordShape",
    "SourceGeometry",
    "PackedSource",
    "PixelSource",
    "JpegSource",
    "EncodedSource",
    "StoredSource",
]


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


@runtime_checkable
class PackedSource(RecordShape, Protocol):
    """A dataset whose batches are copied whole from stored records into a canvas.

    ``shape``, ``record_sizes`` (``RecordShape``): the bound and each record's size.
    ``codec``: "raw" (records are uint8 HWC), "yuv420" (a Y plane and two 2x2-subsampled
        chroma planes) or "jpeg" (decoded by the source into the canvas). The slot of one
        record in a batch buffer is ``canvas.slot_shape(codec, shape)``: the bound (H, W, C)
        for raw and jpeg records, (H + ceil(H/2), 2 ceil(W/2), 1) for yuv420, whose
        batches the loader's delivery converts to RGB (``imgpack.reader.yuv``).
    ``transform``, ``target_transform``: ImageFolder's per-sample hooks; either one set
        means the loader must build batches sample by sample, so it does.
    ``shard_sizes``: records per pack, in dataset order (one pack: ``(len(ds),)``); the
        shard-local order keeps each rank on its own packs.
    ``pack_id``: the records' identity (None where unknown); a saved loader state is
        refused on a dataset with another id, whose positions name other records.
    ``in_page_cache``: True once the records are known to be in the page cache; the
        in-process loader then stops sending read-ahead hints.
    ``gather(indices)``: (uint8 canvas (B, C', H', W') channels_last, int64 (B,)[, float32
        (B, K)]), (H', W', C') the canvas shape, each record at the top-left of its slot,
        zero beyond it; what each worker process of workers mode returns for one batch.
    ``gather_into(indices, out_images, out_labels)``: the same records copied into the
        caller's (B, H', W', C') uint8 and (B,) int64 arrays; the in-process loader splits
        one batch over threads with it, into buffers it reuses.
    ``gather_targets(indices)``: float32 (B, K) per-record target vectors, or None.
    ``will_need(indices)``: a read-ahead hint for records about to be gathered.
    """

    transform: Callable[[torch.Tensor], Any] | None
    target_transform: Callable[[int], Any] | None

    @property
    def codec(self) -> str: ...

    @property
    def shard_sizes(self) -> tuple[int, ...]: ...

    @property
    def pack_id(self) -> str | None: ...

    @property
    def in_page_cache(self) -> bool: ...

    def __len__(self) -> int: ...

    def gather(self, indices: Any) -> tuple[torch.Tensor, ...]: ...

    def gather_into(
        self, indices: Any, out_images: np.ndarray, out_labels: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def gather_targets(self, indices: Any) -> torch.Tensor | None: ...

    def will_need(self, indices: Any) -> None: ...


@runtime_checkable
class PixelSource(PackedSource, Protocol):
    """A ``PackedSource`` that reads its records as RGB (or L) pixels itself, on threads.

    ``decode_into(indices, out_images, out_labels, scales, threads, *, pad=True)``: records
        as pixels (raw copied, yuv420 converted, jpeg decoded, each jpeg record at
        1/``scales[i]``: 1, 2, 4 or 8; None: 1), at the top-left of their slots of the
        caller's (B, H', W', C) uint8 array (any H' x W' they fit), zero beyond
        (``pad=False``: left as it was, for a transform that reads only each record's
        extent), on ``threads`` threads (None: the source's default); labels into (B,) int64.
        For jpeg records a 1-D uint8 ``out_images`` takes them packed end to end, each a
        C-contiguous (h', w', C) block (``canvas.decode_packed``).
    ``crops_into(indices, boxes, flips, out_images, out_labels, scales, threads)``: each
        record's box (B, 4) of its pixels resampled into an (S, S, C) slot of the caller's
        (B, S, S, C) uint8 array, mirrored where ``flips``: ``DeviceTransform``'s crops,
        made on the CPU.
    """

    def crops_into(
        self,
        indices: Any,
        boxes: Any,
        flips: Any,
        out_images: np.ndarray,
        out_labels: np.ndarray,
        scales: Any = None,
        threads: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def decode_into(
        self,
        indices: Any,
        out_images: np.ndarray,
        out_labels: np.ndarray,
        scales: Any = None,
        threads: int | None = None,
        *,
        pad: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]: ...


@runtime_checkable
class JpegSource(PixelSource, Protocol):
    """A ``PixelSource`` whose records are JPEG streams (``codec`` "jpeg").

    ``record_lengths``: int64 (N,), bytes of each record as stored.
    """

    @property
    def record_lengths(self) -> np.ndarray: ...


@runtime_checkable
class EncodedSource(JpegSource, Protocol):
    """A ``JpegSource`` that hands out its records' stored bytes, for a decoder elsewhere (a
    GPU's: ``imgpack.reader.nvdecode``).

    ``encoded(indices)``: each record's bytes (numpy uint8 views). ``record_names(indices)``:
    how an error names each record. ``labels``: int64 (N,).
    """

    @property
    def labels(self) -> np.ndarray: ...

    def encoded(self, indices: Any) -> list[np.ndarray]: ...

    def record_names(self, indices: Any) -> list[str]: ...


@runtime_checkable
class StoredSource(PackedSource, Protocol):
    """A ``PackedSource`` whose stored records can be copied whole (a resident loader's).

    ``stored(first, stop)``: the stored bytes of records first..stop-1, end to end, as flat
    uint8 views (one per pack they span). ``labels``: int64 (N,).
    """

    @property
    def labels(self) -> np.ndarray: ...

    def stored(self, first: int, stop: int) -> list[np.ndarray]: ...
