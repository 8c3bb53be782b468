"""Where each sample's crop lies: RandomResizedCrop and Resize+CenterCrop boxes in source pixels.

Boxes are drawn in the source image's own coordinates (``ds.source_sizes``),
inside the part of it the record shows (``ds.source_boxes``), so the crop
statistics are those of torchvision on the original file whatever the record's
resize mode; ``to_record`` then maps them into the stored record through
``ds.content_boxes`` (a stretched record so gives an undistorted crop).
Everything is vectorised over the batch; the random draws come from a
``torch.Generator`` (torch's default one unless given), so ``torch.manual_seed``
governs them.

A ``Draw`` is one batch's outcome, drawn before any pixel is read: what the loader needs
to decode each JPEG record at the smallest scale still covering its crop
(``imgpack.reader.read``) and what ``DeviceTransform.apply`` needs to resample the batch.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch

from imgpack.errors import InvalidArgumentError

__all__ = ["Draw", "geometry", "random_resized_boxes", "center_boxes", "to_record", "pair", "has"]

_ATTEMPTS = 10  # torchvision's RandomResizedCrop.get_params tries 10 times, then falls back


class Draw(NamedTuple):
    """One batch's crops, in numpy (it crosses to and from worker processes inline).

    ``records``: int64 (B,). ``boxes``: float64 (B, 4) (left, top, right, bottom) in source
    pixels (``last_params``). ``flip``: bool (B,). ``crop``: float64 (B, 4), the same boxes
    in the pixels of the images the draw applies to. ``sizes``: int64 (B, 2), (w, h) of
    each sample's pixels at the top-left of its slot in those images. ``size``: the side
    of the output.
    """

    records: np.ndarray
    boxes: np.ndarray
    flip: np.ndarray
    crop: np.ndarray
    sizes: np.ndarray
    size: int


def pair(value: Any, what: str) -> tuple[float, float]:
    """``value`` as a finite (min, max) pair of floats with 0 < min <= max, or
    InvalidArgumentError naming ``what``."""
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what} should be a (min, max) pair, found {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        raise InvalidArgumentError(
            f"{what} should be a finite (min, max) with 0 < min <= max, found {value!r}"
        )
    return lo, hi


def has(ds: Any, *names: str) -> bool:
    """Whether ``ds`` has every one of ``names``: how a dataset's geometry is read, so any
    dataset may give it (``record_sizes`` with ``shape``: each record's own size within the
    bound; ``source_sizes``, ``source_boxes``, ``content_boxes``: where it came from)."""
    return all(hasattr(ds, n) for n in names)


def _column(column: Any, name: str, idx: np.ndarray, width: int) -> np.ndarray:
    arr = np.asarray(column)
    if arr.ndim != 2 or arr.shape[1] != width:
        raise InvalidArgumentError(f"ds.{name} should be an (N, {width}) array, found {arr.shape}")
    return arr[idx].astype(np.float64)


def geometry(ds: Any, idx: np.ndarray, record_hw: tuple[int, int]) -> tuple:
    """(float64 (B, 2) source (w, h), (B, 4) source and (B, 4) content boxes, and int64
    (B, 2) (w, h) of each record itself, on the CPU) of records ``idx`` (checked indices).
    Objects without source geometry read as a record that is its whole source: the source
    is the record itself, both boxes the whole record (a pack without geometry fields gives
    the same rows itself). Each record's own size comes from ``record_sizes`` where ``ds``
    has it; anything else's records are ``record_hw``."""
    if has(ds, "shape", "record_sizes"):
        own = _column(ds.record_sizes, "record_sizes", idx, 2).astype(np.int64)
    else:
        own = np.tile(np.array(record_hw[::-1], dtype=np.int64), (len(idx), 1))
    if has(ds, "source_sizes", "source_boxes", "content_boxes"):
        sizes = _column(ds.source_sizes, "source_sizes", idx, 2)
        sbox = _column(ds.source_boxes, "source_boxes", idx, 4)
        cbox = _column(ds.content_boxes, "content_boxes", idx, 4)
    else:
        sizes = own.astype(np.float64)
        sbox = np.concatenate([np.zeros_like(sizes), sizes], 1)
        cbox = sbox.copy()
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in (sizes, sbox, cbox, own))


def _uniform(
    shape: tuple[int, ...], lo: float, hi: float, gen: torch.Generator | None
) -> torch.Tensor:
    where = gen.device if gen is not None else torch.device("cpu")
    u = torch.rand(shape, generator=gen, device=where, dtype=torch.float64).cpu()
    return u.mul_(hi - lo).add_(lo)


def random_resized_boxes(
    visible: torch.Tensor,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """torchvision's RandomResizedCrop boxes, per row of ``visible`` (B, 4) (l, t, r, b).

    Area fraction uniform in ``scale`` and aspect log-uniform in ``ratio``,
    sides rounded to whole pixels, the first of 10 attempts that fits is kept
    and placed at a uniformly drawn whole-pixel offset; when none fits, the
    centre crop of the region clamped to ``ratio``. Returns float64 (B, 4).
    """
    b = visible.shape[0]
    left, top = visible[:, 0], visible[:, 1]
    vw, vh = visible[:, 2] - left, visible[:, 3] - top
    area = (vw * vh)[:, None]
    target = area * _uniform((b, _ATTEMPTS), scale[0], scale[1], generator)
    aspect = _uniform((b, _ATTEMPTS), math.log(ratio[0]), math.log(ratio[1]), generator).exp_()
    w = torch.sqrt(target * aspect).round_()  # torch.round and Python's round both go half-even
    h = torch.sqrt(target / aspect).round_()
    fits = (w > 0) & (w <= vw[:, None]) & (h > 0) & (h <= vh[:, None])
    first = fits.to(torch.int8).argmax(1, keepdim=True)  # first True (0 when none)
    found = fits.any(1)
    w, h = w.gather(1, first)[:, 0], h.gather(1, first)[:, 0]
    # offsets: randint(0, side - crop + 1), drawn for every row, used where an attempt fit
    u = _uniform((b, 2), 0.0, 1.0, generator)
    dy = torch.floor(u[:, 0] * (torch.floor(vh - h) + 1))
    dx = torch.floor(u[:, 1] * (torch.floor(vw - w) + 1))
    # fallback: whole region, clamped to the ratio range, centred; a fractional region
    # (a center-crop record's part of its source) must not round past its own side
    lo, hi = min(ratio), max(ratio)
    in_ratio = vw / vh
    fw = torch.where(in_ratio > hi, torch.minimum(torch.round(vh * hi), vw), vw)
    fh = torch.where(in_ratio < lo, torch.minimum(torch.round(vw / lo), vh), vh)
    w, h = torch.where(found, w, fw), torch.where(found, h, fh)
    dy = torch.where(found, dy, torch.floor((vh - h) / 2))
    dx = torch.where(found, dx, torch.floor((vw - w) / 2))
    return torch.stack([left + dx, top + dy, left + dx + w, top + dy + h], 1)


def center_boxes(
    source_sizes: torch.Tensor, visible: torch.Tensor, size: int, crop_ratio: float
) -> torch.Tensor:
    """Resize(int(size / crop_ratio)) then CenterCrop(size), as torchvision does it on the source.

    The shorter side goes to R = int(size / crop_ratio), the longer to
    int(R * long / short); the crop starts at round((resized - size) / 2).
    Returned in source pixels (float64 (B, 4)); where the record shows less than
    that box (a center-crop pack of another aspect or crop ratio), the largest
    box of the same aspect centred in its intersection with ``visible``, so the
    crop is zoomed rather than distorted.
    """
    sw, sh = source_sizes[:, 0], source_sizes[:, 1]
    r = float(int(size / crop_ratio))
    short, long = torch.minimum(sw, sh), torch.maximum(sw, sh)
    long_r = torch.floor(r * long / short)
    rw = torch.where(sw <= sh, torch.full_like(sw, r), long_r)
    rh = torch.where(sw <= sh, long_r, torch.full_like(sh, r))
    # torchvision: int(round((resized - size) / 2.0)), half to even like torch.round
    left = torch.round((rw - size) / 2.0)
    top = torch.round((rh - size) / 2.0)
    fx, fy = sw / rw, sh / rh
    boxes = torch.stack([left * fx, top * fy, (left + size) * fx, (top + size) * fy], 1)
    # intersected with the visible region (a crop outside it has no pixels)
    lo = torch.maximum(boxes[:, :2], visible[:, :2])
    hi = torch.minimum(boxes[:, 2:], visible[:, 2:])
    return _shrink_to_aspect(torch.cat([lo, torch.maximum(hi, lo)], 1), fx / fy)


def _shrink_to_aspect(boxes: torch.Tensor, aspect: torch.Tensor) -> torch.Tensor:
    """The largest (B, 4) box of width/height ``aspect`` centred in each of ``boxes``."""
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    nw, nh = torch.minimum(w, h * aspect), torch.minimum(h, w / aspect)
    dx, dy = (w - nw) / 2, (h - nh) / 2
    # a side that needs no shrinking (to within float noise) keeps its exact coordinates
    dx = torch.where(dx > 1e-9 * w, dx, torch.zeros_like(dx))
    dy = torch.where(dy > 1e-9 * h, dy, torch.zeros_like(dy))
    return torch.stack([boxes[:, 0] + dx, boxes[:, 1] + dy, boxes[:, 2] - dx, boxes[:, 3] - dy], 1)


def to_record(boxes: torch.Tensor, s: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Source-pixel boxes -> record-pixel boxes, through each record's source box ``s`` and
    content box ``c``: x_r = c.l + (x_s - s.l) * c.w / s.w, same in y."""
    sx = (c[:, 2] - c[:, 0]) / (s[:, 2] - s[:, 0])
    sy = (c[:, 3] - c[:, 1]) / (s[:, 3] - s[:, 1])
    f = torch.stack([sx, sy, sx, sy], 1)
    return c[:, [0, 1, 0, 1]] + (boxes - s[:, [0, 1, 0, 1]]) * f
