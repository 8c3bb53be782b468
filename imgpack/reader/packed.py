"""A JPEG batch bound for a CUDA device crosses as its records packed end to end.

Decoding into the padded canvas costs the CPU a copy of every record narrower than the
canvas (simplejpeg writes whole rows only, with no row pitch) and the zeroing around it:
together 0.84x a plain loop of the decoder, against 0.97x for decoding each record
straight into a flat buffer (docs/benchmarks.md). So the loader's threads decode end to end
(``canvas.decode_packed``), only the decoded pixels are pinned and cross the bus (no
padding), and the device lays them out as the canvas every transform takes, each record
at the top-left of its slot, zero beyond, in one ``masked_scatter_`` (not yet timed on a
GPU). A CPU-bound batch stays a canvas decoded by the threads themselves: there the copy
costs the same wherever it runs, and the threads run beside the training step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from imgpack.errors import InvalidArgumentError
from imgpack.reader.canvas import packed_ends

__all__ = ["Packed", "Rows", "packs_for"]


class Packed(NamedTuple):
    """One batch's decoded records, packed: ``pixels`` uint8 (N,), record i a C-contiguous
    (h', w', C) block after those before it; ``sizes`` int64 (B, 2), each (w', h');
    ``canvas`` (H, W) the canvas they are laid out in; ``channels`` C."""

    pixels: torch.Tensor
    sizes: np.ndarray
    canvas: tuple[int, int]
    channels: int

    def to_canvas(self, device: Any = None) -> torch.Tensor:
        """The uint8 (B, C, H, W) canvas on ``device`` (None: where ``pixels`` are), channels
        last in memory, as the CPU path's; the copy there is asynchronous from pinned
        memory, on the current stream."""
        dev = self.pixels.device if device is None else torch.device(device)
        flat = self.pixels.to(dev, non_blocking=True)
        (h, w), c, b = self.canvas, self.channels, len(self.sizes)
        if b and (self.sizes == np.array([w, h])).all():  # every record fills its slot
            return flat[: b * h * w * c].view(b, h, w, c).permute(0, 3, 1, 2)
        out = torch.zeros((b, h, w, c), dtype=torch.uint8, device=dev)
        if dev.type == "cpu":  # a copy per record: about 20 us each here, on the loop's thread
            start = 0
            for i, (sw, sh) in enumerate(self.sizes.tolist()):
                n = sw * sh * c
                out[i, :sh, :sw].copy_(flat[start : start + n].view(sh, sw, c))
                start += n
        else:  # a few kernels for the whole batch, not one launch per record
            out.masked_scatter_(_extents(self.sizes, h, w, dev)[..., None], flat)
        return out.permute(0, 3, 1, 2)


def _extents(sizes: np.ndarray, h: int, w: int, device: Any) -> torch.Tensor:
    """bool (B, H, W): True inside each record's (w', h') at the top-left of its slot. In
    row-major order its True pixels are exactly the packed layout's, so one
    ``masked_scatter_`` of the packed bytes lays out the canvas."""
    s = torch.as_tensor(np.asarray(sizes, dtype=np.int64), device=device)
    rows = torch.arange(h, device=device)[None, :, None] < s[:, 1, None, None]
    return rows & (torch.arange(w, device=device)[None, None, :] < s[:, 0, None, None])


class Rows:
    """A packed buffer as the loader's threads split it: by record (``rows[a:b]`` is the
    buffer of records a to b - 1), as they split a canvas by its rows."""

    def __init__(self, flat: np.ndarray, ends: np.ndarray) -> None:
        self.flat, self.ends = flat, ends  # ends: int64 (B + 1,), from 0

    @classmethod
    def of(cls, flat: np.ndarray | None, sizes: np.ndarray, channels: int) -> Rows:
        """Records of (w', h') ``sizes`` end to end in the front of ``flat`` (None: only
        their extents, to size a buffer by ``nbytes``; ``over`` then places them)."""
        ends = packed_ends(sizes, channels)
        return cls(None if flat is None else flat[: ends[-1]], ends)

    def over(self, flat: np.ndarray) -> Rows:
        """The same records in the front of ``flat``."""
        return Rows(flat[: self.nbytes], self.ends)

    def __len__(self) -> int:
        return len(self.ends) - 1

    def __getitem__(self, rows: slice) -> Rows:
        a, b, step = rows.indices(len(self))
        if step != 1:
            raise InvalidArgumentError(f"packed rows are sliced in order, found step {step}")
        b = max(a, b)
        return Rows(self.flat[self.ends[a] : self.ends[b]], self.ends[a : b + 1] - self.ends[a])

    @property
    def nbytes(self) -> int:
        return int(self.ends[-1])


def packs_for(delivery: Any) -> bool:
    """Whether a loader whose threads decode JPEG sends its batches packed: when the
    ``deliver.Delivery`` takes them to a CUDA device."""
    return bool(delivery.cuda)
