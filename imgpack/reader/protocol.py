"""What imgpack needs of a dataset, written once: ``PackedSource`` and its two small parts.

``make_loader`` asks one question of the dataset it is given, once, with ``isinstance``:
is it a ``PackedSource`` without a per-sample transform? Then batches are gathered whole
(``gather`` in worker processes, ``gather_into`` in the in-process loader) and nothing
else in the loader asks again. Anything else (a user's map-style dataset, a
``ConcatDataset``, a dataset with a per-sample ``transform``) is served the torch way,
sample by sample through a collate. ``DeviceTransform.train``/``eval`` read per-record
geometry only from a ``RecordGeometry`` (anything else reads as its own source), and
refuse a batch of another size than a ``RecordShape``'s records.

``PackedImageDataset`` is all three; stand-ins (records of differing sizes have geometry
but no one shape), or a user's own fast dataset, may be some. The protocols are
``runtime_checkable``: a check looks every member up on the object (before Python 3.12
that runs properties), so ``PackedSource``'s members are cheap to read, and
``RecordGeometry``'s are read once and kept by the dataset.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np
import torch

__all__ = ["RecordShape", "RecordGeometry", "PackedSource"]


@runtime_checkable
class RecordShape(Protocol):
    """Records of one shape. ``shape``: (H, W, C) of every record, uint8."""

    @property
    def shape(self) -> tuple[int, int, int]: ...


@runtime_checkable
class RecordGeometry(Protocol):
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
    """A dataset whose batches are copied whole from stored records (H, W, C) uint8.

    ``shape`` (``RecordShape``): the loader's batch buffers and read-ahead block size
        (H * W * C bytes per record) come from it.
    ``transform``, ``target_transform``: ImageFolder's per-sample hooks; either one set
        means the loader must build batches sample by sample, so it does.
    ``shard_sizes``: records per pack, in dataset order (one pack: ``(len(ds),)``); the
        shard-local order keeps each rank on its own packs.
    ``pack_id``: the records' identity (None where unknown); a saved loader state is
        refused on a dataset with another id, whose positions name other records.
    ``resident``: True once the records are known to be in the page cache; the
        in-process loader then stops sending read-ahead hints.
    ``gather(indices)``: (uint8 (B, C, H, W) channels_last, int64 (B,)[, float32 (B, K)]);
        what each worker process of workers mode returns for one batch.
    ``gather_into(indices, out_images, out_labels)``: the same records copied into the
        caller's (B, H, W, C) uint8 and (B,) int64 arrays; the in-process loader splits
        one batch over threads with it, into buffers it reuses.
    ``gather_targets(indices)``: float32 (B, K) per-record target vectors, or None.
    ``will_need(indices)``: a read-ahead hint for records about to be gathered.
    """

    transform: Callable[[torch.Tensor], Any] | None
    target_transform: Callable[[int], Any] | None

    @property
    def shard_sizes(self) -> tuple[int, ...]: ...

    @property
    def pack_id(self) -> str | None: ...

    @property
    def resident(self) -> bool: ...

    def __len__(self) -> int: ...

    def gather(self, indices: Any) -> tuple[torch.Tensor, ...]: ...

    def gather_into(
        self, indices: Any, out_images: np.ndarray, out_labels: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def gather_targets(self, indices: Any) -> torch.Tensor | None: ...

    def will_need(self, indices: Any) -> None: ...
