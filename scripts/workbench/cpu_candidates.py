"""The per-record crop resamplers the CPU kernels' benchmark compares, one call each.

Each is ``fn(record, box, size, flip, out)``: ``record`` uint8 (h, w, 3), ``box`` the crop in
record pixels (fractional), ``out`` the (size, size, 3) slot to write.

* ``imgpack``: imgpack's kernel (``imgpack.reader.cpuresample.resample_record``): a box
  enlarged on both axes by OpenCV's ``warpAffine`` at its fractional centres (the cpu
  extra, ``imgpack.reader.warp``), any other by torch's uint8 antialiased bilinear resample
  made to sample the box's own grid to within ``cpuresample.ALIGN`` pixels, Pillow on the
  axes it cannot align.
* ``imgpack_torch``: the same with ``IMGPACK_OPENCV=0``: torch's kernel for every box, what
  runs without OpenCV.
* ``pillow``: Pillow's BILINEAR resample of the exact box (``Image.resize(box=...)``) of the
  part of the record its filter reaches: the exact resample, imgpack's kernel before.
* ``torch_rounded``: torch's uint8 antialiased bilinear ``interpolate`` (channels_last) of
  the box rounded to whole pixels, as an integer crop must be.
* ``opencv``: FFCV's CPU resize, ``cv2.resize(..., INTER_AREA)`` of the rounded box
  (``workbench.bench_jpeg_speed.ffcv_resize``; Pillow's BOX where OpenCV is missing), then
  the flip as a stage of its own (a torch copy: FFCV's is a compiled loop).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

from imgpack.reader.resample import reach, resample_record
from workbench.bench_jpeg_speed import ffcv_resize
from workbench.cpu_yuv import switched_off

__all__ = [
    "CANDIDATES",
    "RESIZE_NAME",
    "rounded",
    "imgpack",
    "imgpack_torch",
    "pillow",
    "torch_rounded",
    "opencv",
]


def rounded(box: np.ndarray) -> tuple[int, int, int, int]:
    """The box to whole pixels, at least one pixel wide and high (FFCV's integer crop)."""
    x0, y0, x1, y1 = (int(v) for v in np.rint(box))
    return x0, y0, max(x1, x0 + 1), max(y1, y0 + 1)


def imgpack(record: np.ndarray, box, size: int, flip: bool, out: np.ndarray) -> None:
    resample_record(record, box, size, flip, out)


imgpack_torch = switched_off(imgpack, "IMGPACK_OPENCV")


def pillow(record: np.ndarray, box, size: int, flip: bool, out: np.ndarray) -> None:
    left, top, right, bottom = (float(v) for v in box)
    x0, x1 = reach(left, right, size, record.shape[1])
    y0, y1 = reach(top, bottom, size, record.shape[0])
    region = Image.fromarray(np.ascontiguousarray(record[y0:y1, x0:x1]))
    resized = region.resize((size, size), Image.Resampling.BILINEAR,
                            box=(left - x0, top - y0, right - x0, bottom - y0))  # fmt: skip
    if flip:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    np.copyto(out, np.asarray(resized))


def torch_rounded(record: np.ndarray, box, size: int, flip: bool, out: np.ndarray) -> None:
    x0, y0, x1, y1 = rounded(box)
    crop = torch.from_numpy(np.ascontiguousarray(record[y0:y1, x0:x1]))[None].permute(0, 3, 1, 2)
    resized = torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear",
                                              antialias=True)[0].permute(1, 2, 0)  # fmt: skip
    torch.from_numpy(out).copy_(resized.flip(1) if flip else resized)


_RESIZE, RESIZE_NAME = ffcv_resize()


def opencv(record: np.ndarray, box, size: int, flip: bool, out: np.ndarray) -> None:
    x0, y0, x1, y1 = rounded(box)
    if flip:  # FFCV flips as a stage of its own, from the resized image
        resized = np.empty_like(out)
        _RESIZE(record[y0:y1, x0:x1], size, resized)
        torch.from_numpy(out).copy_(torch.from_numpy(resized).flip(1))
    else:
        _RESIZE(record[y0:y1, x0:x1], size, out)


CANDIDATES: dict[str, Callable[..., None]] = {
    "imgpack: OpenCV where enlarged, else torch aligned, else Pillow": imgpack,
    "imgpack without OpenCV: torch aligned, else Pillow": imgpack_torch,
    "Pillow, exact box": pillow,
    "torch antialias, box rounded": torch_rounded,
    f"FFCV: {RESIZE_NAME}, box rounded": opencv,
}
