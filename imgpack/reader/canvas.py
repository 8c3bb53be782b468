"""Records of any size and codec into a batch, each at the top-left of its slot.

Stored bytes (``copy_canvas``): a batch of a pack whose records all fill the bound as raw
HWC is one ``np.take`` (``packs.copy_records``); any other batch comes here, record by
record. A slot is ``slot_shape(codec, shape)``:

raw      (H, W, C): the record's (h, w, C) pixels at [0, h) x [0, w), zero beyond.
yuv420   (H + ceil(H/2), 2 ceil(W/2), 1): Y at [0, h) x [0, w); below row H, Cb at
         columns [0, ceil(w/2)) and Cr at [ceil(W/2), ceil(W/2) + ceil(w/2)), each
         ceil(h/2) rows; zero beyond each plane (``imgpack.reader.yuv`` reads it back).

Pixels (``decode_canvas``): each record's RGB (or L) pixels (H', W', C), at [0, h') x
[0, w'), zero beyond: a raw record copied, a yuv420 one converted
(``imgpack.format.codec.yuv420_to_rgb``, once per chroma sample, straight into the slot),
a jpeg one decoded (``imgpack.reader.jpeg``) at its stored size or at 1/d of it; H' x W'
is the bound, or any canvas the decoded records fit.
Crops (``crop_canvas``): each record's pixels, read into a buffer of its thread's where
they are not a view of the mapping, then its crop box resampled into an S x S slot
(``resample.resample_record``): the CPU's ``DeviceTransform.train``/``.eval``.

Every byte of a slot is written, so a reused buffer never shows an older batch. Where
each record lies comes from its pack's index (``record_offsets``, ``record_sizes``:
derived once from the sizes by ``imgpack.format.layout.record_offsets``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from imgpack.errors import InvalidArgumentError
from imgpack.format.codec import yuv420_planes, yuv420_to_rgb
from imgpack.reader.jpeg import decode, scaled_size
from imgpack.reader.mapping import PackMapping
from imgpack.reader.packs import groups, where
from imgpack.reader.resample import resample_record
from imgpack.reader.run import POOL

__all__ = [
    "slot_shape",
    "put",
    "yuv_planes",
    "copy_canvas",
    "decode_canvas",
    "crop_canvas",
    "crop_each",
]


def slot_shape(codec: str, shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """(rows, columns, channels) of one record's slot in a batch of a pack of bound ``shape``
    (H, W, C): ``shape`` itself for raw and jpeg records, (H + ceil(H/2), 2 ceil(W/2), 1)
    for yuv420 (the yuv canvas: the module docstring)."""
    h, w, c = shape
    if codec == "yuv420":
        return h + (h + 1) // 2, 2 * ((w + 1) // 2), 1
    return h, w, c


def put(
    slot: np.ndarray, buf: np.ndarray, width: int, height: int, codec: str, bound_h: int
) -> None:
    """Write the stored record ``buf`` (its bytes) of ``width`` x ``height`` into ``slot``."""
    w, h = width, height
    if codec == "raw":
        slot[:h, :w] = buf.reshape(h, w, slot.shape[2])
        slot[:h, w:] = 0
        slot[h:] = 0
        return
    y, cb, cr = yuv_planes(slot[..., 0], bound_h)
    for into, plane in zip((y, cb, cr), yuv420_planes(buf, w, h)):
        rows, cols = plane.shape
        into[:rows, :cols] = plane
        into[:rows, cols:] = 0
        into[rows:] = 0


def yuv_planes(plane: Any, height: int) -> tuple[Any, Any, Any]:
    """The (Y, Cb, Cr) regions of yuv canvas rows ``plane`` (..., H + ceil(H/2), 2 ceil(W/2))
    of a bound H high (the module docstring), numpy or torch: the one statement of the
    layout, which ``put`` writes and ``yuv.canvas_to_rgb`` reads."""
    half = plane.shape[-1] // 2
    return plane[..., :height, :], plane[..., height:, :half], plane[..., height:, half:]


def copy_canvas(
    packs: Sequence[PackMapping],
    starts: np.ndarray,
    idx: np.ndarray,
    out_images: np.ndarray,
    out_labels: np.ndarray,
) -> None:
    """Copy records ``idx`` (in range) into the (B, *slot) canvas ``out_images`` and their
    labels into (B,) ``out_labels``."""
    if len(idx) == 0:
        return
    for p, pos, local in groups(starts, idx):
        pack = packs[p]
        ix, v = pack.index, pack.views
        out_labels[pos] = v.labels[local]
        for i, k in zip(pos.tolist(), local.tolist()):
            w, h = ix.record_sizes[k].tolist()
            put(out_images[i], pack.stored(k), w, h, ix.codec, ix.height)


class _Batch:
    """Records ``idx`` read as pixels at 1/``scales`` (None: 1; only jpeg records scale), read
    from the packs' indexes once per batch (their labels go straight to ``out_labels``):
    ``decoded`` int64 (B, 2), each record's (w', h'); ``into(i, out)`` writes record i's
    pixels into ``out``; ``pixels(i, scratch)`` gives them, a view of the mapping where they
    are stored as they are."""

    def __init__(self, packs, starts, idx, out_labels, scales, channels: int) -> None:
        n = len(idx)
        d = np.ones(n, np.int64) if scales is None else np.asarray(scales, np.int64)
        sizes = np.empty((n, 2), np.int64)
        owner = np.empty(n, np.int64)
        for p, pos, local in groups(starts, idx):
            out_labels[pos] = packs[p].views.labels[local]
            sizes[pos] = packs[p].index.record_sizes[local]
            owner[pos] = p
        self.decoded = np.stack(scaled_size(sizes[:, 0], sizes[:, 1], d), 1)
        self.packs, self.channels = packs, channels
        self.codec = packs[0].index.codec
        if self.codec != "jpeg" and (d != 1).any():
            raise InvalidArgumentError(f"scales apply to jpeg records; these are {self.codec}")
        self.jobs = list(zip(owner.tolist(), (idx - starts[owner]).tolist()))
        self.wh, self.dl = sizes.tolist(), d.tolist()

    def into(self, i: int, out: np.ndarray | None = None) -> np.ndarray:
        """Record i's pixels written into ``out`` (an (h', w', C) uint8 view; C-contiguous
        for a jpeg record: the decoder has no row pitch) or a new array, returned."""
        p, k = self.jobs[i]
        (w, h), pack = self.wh[i], self.packs[p]
        stored = pack.stored(k)
        if self.codec == "yuv420":
            return yuv420_to_rgb(stored, w, h, out=out)
        if self.codec == "jpeg":
            return decode(stored, w, h, self.channels, scale=self.dl[i],
                          where=where(pack, k), out=out)  # fmt: skip
        pixels = stored.reshape(h, w, self.channels)
        if out is None:
            return pixels.copy()
        np.copyto(out, pixels)
        return out

    def pixels(self, i: int, scratch: np.ndarray) -> np.ndarray:
        """Record i's pixels: a view of the mapping for a raw record, else read into the
        front of the flat ``scratch`` (as large as a record of the bound)."""
        p, k = self.jobs[i]
        if self.codec == "raw":
            w, h = self.wh[i]
            return self.packs[p].stored(k).reshape(h, w, self.channels)
        sw, sh = self.decoded[i].tolist()
        return self.into(i, scratch[: sw * sh * self.channels].reshape(sh, sw, self.channels))


def decode_canvas(
    packs: Sequence[PackMapping],
    starts: np.ndarray,
    idx: np.ndarray,
    out_images: np.ndarray,
    out_labels: np.ndarray,
    scales: np.ndarray | None = None,
    threads: int = 1,
    pad: bool = True,
    channels: int = 3,
) -> None:
    """Records ``idx`` (in range) as pixels, jpeg ones decoded at 1/``scales[i]`` (default
    1), into the top-left of their slots of the C-contiguous (B, H', W', C) ``out_images``,
    zero beyond (``pad=False``: beyond is left as it was, for a consumer that reads only
    each record's own extent, which spares a pass over the padding), on ``threads`` threads;
    labels into (B,) ``out_labels``. Damage: ``FormatError`` naming the pack and record."""
    if len(idx) == 0:
        return
    _, rows, cols, c = out_images.shape
    batch = _Batch(packs, starts, idx, out_labels, scales, c)
    most = batch.decoded.max(0)
    if most[0] > cols or most[1] > rows:
        raise InvalidArgumentError(
            f"out_images {cols}x{rows} is smaller than a decoded record ({most[0]}x{most[1]})"
        )
    dec = batch.decoded.tolist()

    def work(i: int) -> None:
        (sw, sh), slot = dec[i], out_images[i]
        if sw == cols or batch.codec != "jpeg":  # straight into the slot
            batch.into(i, slot[:sh, :sw])
        else:  # simplejpeg has no row pitch: decode, then copy into the slot
            slot[:sh, :sw] = batch.into(i)
        if pad and sw < cols:
            slot[:sh, sw:] = 0
        if pad:
            slot[sh:] = 0

    POOL.run(len(idx), work, threads)


class _Scratch(threading.local):
    """A thread's buffer for one record's pixels, made in the thread on its first use."""

    def __init__(self, nbytes: int) -> None:
        self.buf = np.empty(nbytes, dtype=np.uint8)


def crop_canvas(
    packs: Sequence[PackMapping],
    starts: np.ndarray,
    idx: np.ndarray,
    boxes: np.ndarray,
    flips: np.ndarray,
    out_images: np.ndarray,
    out_labels: np.ndarray,
    scales: np.ndarray | None,
    threads: int,
) -> None:
    """Records ``idx`` (in range) read as pixels (jpeg ones at 1/``scales[i]``), then box
    i of float (B, 4) ``boxes`` (in those pixels) resampled into slot i of the (B, S, S, C)
    ``out_images``, mirrored where ``flips[i]``, on ``threads`` threads; labels into (B,)
    ``out_labels``."""
    if len(idx) == 0:
        return
    channels = out_images.shape[3]
    batch = _Batch(packs, starts, idx, out_labels, scales, channels)
    bound = packs[0].index.shape
    scratch = _Scratch(int(bound[0]) * int(bound[1]) * channels)
    crop_each(lambda i: batch.pixels(i, scratch.buf), boxes, flips, out_images, threads)


def crop_each(
    pixels: Callable[[int], np.ndarray],
    boxes: np.ndarray,
    flips: np.ndarray,
    out: np.ndarray,
    threads: int,
    stop: threading.Event | None = None,
) -> None:
    """Box i of float (B, 4) ``boxes``, in the (h, w, C) pixels ``pixels(i)`` gives, resampled
    into slot i of the (B, S, S, C) ``out``, mirrored where ``flips[i]``, on ``threads``
    threads: the one way a record's crop is made on a CPU (streamed or resident)."""
    size = out.shape[1]
    box, flip = np.asarray(boxes, np.float64).tolist(), np.asarray(flips, bool).tolist()

    def work(i: int) -> None:
        resample_record(pixels(i), box[i], size, flip[i], out[i])

    POOL.run(len(box), work, threads, stop)
