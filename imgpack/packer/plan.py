"""Where a record's pixels come from: the source region to resample, and its geometry.

Pure arithmetic on sizes and boxes, shared by decoding (which region to read,
what size to resize it to) and by the geometry every record carries. Boxes are
(left, top, right, bottom) in continuous pixel coordinates, as Pillow's
``resize(box=...)`` takes them; orientations are EXIF's 1..8.
"""

from __future__ import annotations

__all__ = ["oriented", "oriented_box", "target_size", "plan_resize", "fit_size"]

_SWAPS = (5, 6, 7, 8)  # EXIF orientations that swap width and height


def oriented(size: tuple[int, int], orientation: int) -> tuple[int, int]:
    """A size in the stored image's axes, in the record's (EXIF-rotated) axes."""
    return (size[1], size[0]) if orientation in _SWAPS else size


def oriented_box(
    box: tuple[float, float, float, float], w0: int, h0: int, orientation: int
) -> tuple[float, float, float, float]:
    """``box`` (l, t, r, b) in stored pixels, in the coordinates of the EXIF-rotated image."""
    x0, y0, x1, y1 = (float(v) for v in box)
    w, h = float(w0), float(h0)
    return {
        1: (x0, y0, x1, y1),
        2: (w - x1, y0, w - x0, y1),  # mirror left-right
        3: (w - x1, h - y1, w - x0, h - y0),  # rotate 180
        4: (x0, h - y1, x1, h - y0),  # mirror top-bottom
        5: (y0, x0, y1, x1),  # transpose
        6: (h - y1, x0, h - y0, x1),  # rotate 90 clockwise (Pillow's ROTATE_270)
        7: (h - y1, w - x1, h - y0, w - x0),  # transverse
        8: (y0, w - x1, y1, w - x0),  # rotate 90 counter-clockwise (ROTATE_90)
    }[orientation if orientation in range(1, 9) else 1]


def target_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """The output size in the stored (not yet rotated) image's axes."""
    return (height, width) if orientation in _SWAPS else (width, height)


def plan_resize(
    w0: int, h0: int, target: tuple[int, int], mode: str, crop_ratio: float = 1.0
) -> tuple[tuple[float, float, float, float], tuple[int, int]]:
    """(region of the source to read, in source pixels; size to resize it to)."""
    tw, th = target
    if mode == "center-crop" and crop_ratio != 1.0:
        return _resize_then_center_crop(w0, h0, tw, th, crop_ratio), (tw, th)
    if mode == "center-crop":
        # cover target, then keep the centre target
        scale = max(tw / w0, th / h0)
        cw, ch = min(w0, tw / scale), min(h0, th / scale)
        left, top = (w0 - cw) / 2, (h0 - ch) / 2
        return (left, top, left + cw, top + ch), (tw, th)
    if mode == "pad":
        scale = min(tw / w0, th / h0)
        size = (min(tw, max(1, round(w0 * scale))), min(th, max(1, round(h0 * scale))))
        return (0, 0, w0, h0), size
    if mode == "fit":
        return (0, 0, w0, h0), fit_size(w0, h0, max(tw, th))
    return (0, 0, w0, h0), (tw, th)  # stretch


def fit_size(w0: int, h0: int, side: int) -> tuple[int, int]:
    """``--resize fit``: the longer side becomes ``side``, the shorter keeps the aspect
    (rounded to nearest, at least 1); an image no larger than ``side`` keeps its size."""
    if max(w0, h0) <= side:
        return w0, h0
    if w0 >= h0:
        return side, max(1, round(h0 * side / w0))
    return max(1, round(w0 * side / h0)), side


def _resize_then_center_crop(
    w0: int, h0: int, tw: int, th: int, crop_ratio: float
) -> tuple[float, float, float, float]:
    """torchvision's eval transform, Resize(int(size / R)) then CenterCrop(size), in the
    integers it computes: the side that decides the cover gets int(target / R) pixels, the
    other int() of its share; the crop starts at round((resized - target) / 2)."""
    if tw * h0 >= th * w0:  # the width decides (the shorter side, for a square target)
        rw = int(tw / crop_ratio)
        rh = int(rw * h0 / w0)
    else:
        rh = int(th / crop_ratio)
        rw = int(rh * w0 / h0)
    left, top = int(round((rw - tw) / 2.0)), int(round((rh - th) / 2.0))
    fx, fy = w0 / rw, h0 / rh
    return (left * fx, top * fy, (left + tw) * fx, (top + th) * fy)
