"""Turn one source file into the exact uint8 RGB pixels of one record.

Everything about a record's pixels is decided here, under the pack's
``settings.DecodeSettings``, so that a pack is reproducible: the same file,
settings and Pillow version give the same bytes.
Decoding happens once, offline, so we spend effort on getting every file right
(all modes to RGB, alpha composited, EXIF rotation applied) and on the two
speedups that do not change the picture much: JPEG DCT-domain downscaling
(``draft``) and Pillow's ``reducing_gap``.

Rules worth knowing:

* Transparent pixels are composited on ``ALPHA_BACKGROUND`` (white), not dropped.
* 16-bit samples (``I;16*``, and ``I``, which older Pillow uses for 16-bit PNG)
  keep their top 8 bits; 32-bit float (``F``) is read as 0..1 when no finite
  sample exceeds 1, else as 0..255 (clipped); NaN and infinities become 0.
* EXIF orientation (and XMP ``tiff:Orientation``) is applied; an unreadable
  EXIF block counts as "no rotation" rather than losing the image.
* Animated GIF/WebP: the first frame. No ICC colour management.
* ``center-crop``: scale so the image covers the target box, keep the centre
  (one ``resize(box=...)`` call); with ``crop_ratio`` R < 1 it is torchvision's
  eval transform, Resize(int(size / R)) + CenterCrop(size), with its integer sizes
  and crop offset (``plan_resize``); ``stretch``:
  resize to exactly width x height; ``pad``: scale to fit inside, centre, fill
  with ``PAD_FILL`` (black); ``fit``: scale so the longer side is the size (never
  up), keep the aspect, and store the record at that size (no crop, no padding).
* Every record comes with its ``RecordGeometry``: the source size after EXIF rotation
  (at full resolution, whatever ``draft`` decoded), the source box it shows and
  the content box where that lies in the record (``plan_resize``, ``oriented_box``).
* ``channels=1``: the finished RGB record (every rule above applied: alpha on
  white, ...) converted by Pillow's ``convert("L")``, ITU-R 601-2 luma.
* Every format Pillow can decode is opened (``formats.readable_formats``),
  except EPS (it runs Ghostscript on untrusted input) and header-only or stub
  plugins. Multi-frame files (GIF, APNG, WebP, TIFF) give their first frame.
* Images with more than ``max_pixels`` pixels are refused from the header,
  before any pixel is decoded. Pillow's own limit (``Image.MAX_IMAGE_PIXELS``,
  refused at twice its value) still applies on top; we never change it.
"""

from __future__ import annotations

import io
import math
import os
import struct
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import numpy as np
from PIL import Image

from imgpack.errors import SourceError
from imgpack.format.fields import RecordGeometry
from imgpack.packer.formats import readable_formats
from imgpack.packer.settings import ALPHA_BACKGROUND, FILTERS, PAD_FILL, DecodeSettings

__all__ = [
    "decode_image",
    "decode_record",
    "pillow_quiet",
    "exif_orientation",
    "plan_resize",
    "fit_size",
]

_ORIENTATION_TAG = 0x0112
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
# What Pillow raises for a bad file (its fuzz tests accept these), plus EOFError
# from frame seeking and struct.error from header parsing.
_PILLOW_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    struct.error,
    NotImplementedError,
    OverflowError,
)


def decode_image(path: str | os.PathLike | bytes, settings: DecodeSettings) -> np.ndarray:
    """Decode ``path`` (or an image's encoded bytes) to a (height, width, 3) uint8
    C-contiguous, writable array.

    A file that cannot be a record raises ``SourceError`` whose message is the short
    reason ``decode_record`` gives, without the path (the caller knows which file it asked for).
    """
    decoded = decode_record(path, settings)
    if isinstance(decoded, str):
        raise SourceError(decoded)
    return np.array(decoded[0], dtype=np.uint8)


def decode_record(
    path: str | os.PathLike | bytes, settings: DecodeSettings, *, silence: bool = True
) -> tuple[Image.Image, RecordGeometry] | str:
    """The finished record as an ``Image`` and where it came from in the source, or, for a
    file that cannot be a record, the short reason why (one line, without the path).

    ``path`` is a file to open, or the image's encoded bytes (a tar member, a Parquet
    cell): the same bytes give the same record either way.

    A bad file is an outcome of packing, not a failure of it: the caller records the
    reason as a skip, or stops with it under --on-error fail. Anything else raises.
    The packer wants the record's bytes (``tobytes()``) and its channel sums
    (from ``histogram()``, one C pass over pixels still in cache), not an array.
    ``silence=False``: the caller holds ``pillow_quiet()`` around its loop of
    files, so that the process-wide warnings state is saved and restored once per
    loop, not once per file.
    """
    if isinstance(path, bytes):
        if not path:
            return "empty image (0 bytes)"
        fp = io.BytesIO(path)
    else:
        try:
            fp = open(path, "rb")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            return f"cannot open file ({exc.strerror or exc})"
        if os.fstat(fp.fileno()).st_size == 0:
            fp.close()
            return "empty file (0 bytes)"
    with fp:
        try:
            if not silence:
                return _decode(fp, settings)
            with pillow_quiet():
                return _decode(fp, settings)
        except Image.DecompressionBombError as exc:
            return f"decompression bomb: {_one_line(exc)}"
        except Image.UnidentifiedImageError:
            return "cannot identify image file (no image format Pillow reads matches its contents)"
        except _PILLOW_ERRORS as exc:
            return _reason(exc)


@contextmanager
def pillow_quiet() -> Iterator[None]:
    """Silence Pillow's per-file warnings while decoding (process-wide, as any
    ``warnings.catch_warnings``): we apply our own pixel limit, and a corrupt
    EXIF block (Pillow's UserWarning) already means "no rotation"."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        warnings.filterwarnings("ignore", module=r"PIL\.")
        yield


def _decode(fp: IO[bytes], s: DecodeSettings) -> tuple[Image.Image, RecordGeometry] | str:
    img = Image.open(fp, formats=_open_formats())
    w0, h0 = img.size
    if w0 * h0 > s.max_pixels:
        return f"decompression bomb: {w0}x{h0} = {w0 * h0} pixels > limit {s.max_pixels}"
    if w0 < 1 or h0 < 1:
        return f"image has no pixels ({w0}x{h0})"
    box: tuple[float, float, float, float] = (0, 0, w0, h0)  # the whole picture, loaded
    orientation = None
    if img.format in ("JPEG", "MPO"):
        orientation = exif_orientation(img)  # needed before draft; JPEG EXIF is in the header
        if s.draft:
            region, out_size = _plan(w0, h0, orientation, s)
            need = (
                math.ceil(w0 * out_size[0] / (region[2] - region[0])),
                math.ceil(h0 * out_size[1] / (region[3] - region[1])),
            )
            if w0 >= 2 * need[0] and h0 >= 2 * need[1]:
                drafted = img.draft("RGB", need)  # a size >= need, scaled by 1/2, 1/4 or 1/8
                if drafted is not None:
                    box = drafted[1]
    img.load()
    if orientation is None:
        orientation = exif_orientation(img)  # PNG may keep EXIF after the pixels
    img = _working_image(img)

    region, out_size = _plan(w0, h0, orientation, s)
    kx, ky = box[2] / w0, box[3] / h0
    loaded_region = (region[0] * kx, region[1] * ky, region[2] * kx, region[3] * ky)
    out = img.resize(out_size, FILTERS[s.filter], box=loaded_region, reducing_gap=s.reducing_gap)
    if orientation in _TRANSPOSE:
        out = out.transpose(_TRANSPOSE[orientation])
    if out.mode != "RGB" and not (s.channels == 1 and out.mode == "L"):
        out = out.convert("RGB")
    left, top = 0, 0
    if s.resize == "pad" and out.size != (s.width, s.height):  # letterbox into the target
        canvas = Image.new(out.mode, (s.width, s.height), PAD_FILL if out.mode == "RGB" else 0)
        left, top = (s.width - out.width) // 2, (s.height - out.height) // 2
        canvas.paste(out, (left, top))
        out = canvas
    if s.channels == 1 and out.mode != "L":
        out = out.convert("L")  # ITU-R 601-2 luma of the RGB record, as Pillow defines it
    ow, oh = oriented((out_size[0], out_size[1]), orientation)
    geometry = RecordGeometry(
        oriented((w0, h0), orientation),
        oriented_box(region, w0, h0, orientation),
        (float(left), float(top), float(left + ow), float(top + oh)),
    )
    return out, geometry


def _plan(w0: int, h0: int, orientation: int, s: DecodeSettings):
    """``plan_resize`` in the stored image's axes. A crop ratio's integer rounding is done
    in the record's (EXIF-rotated) axes, as torchvision does it, then mapped back."""
    target = target_size(s.width, s.height, orientation)
    if s.crop_ratio == 1.0 or orientation not in range(2, 9):
        return plan_resize(w0, h0, target, s.resize, s.crop_ratio)
    ow, oh = oriented((w0, h0), orientation)
    box, _ = plan_resize(ow, oh, (s.width, s.height), s.resize, s.crop_ratio)
    back = {6: 8, 8: 6}.get(orientation, orientation)  # the others undo themselves
    return oriented_box(box, ow, oh, back), target


def _working_image(img: Image.Image) -> Image.Image:
    """RGB or L pixels to resize: alpha composited, 16-bit and float scaled to 8 bits."""
    mode = img.mode
    if mode in _ALPHA_MODES or (mode in ("P", "L", "RGB") and "transparency" in img.info):
        rgba = img.convert("RGBA")
        flat = Image.new("RGB", img.size, ALPHA_BACKGROUND)
        flat.paste(rgba, (0, 0), rgba)  # the alpha band is the mask: a proper "over"
        return flat
    if mode in ("RGB", "L"):
        return img
    if mode == "1":
        return img.convert("L")
    if mode == "I" or mode.startswith("I;16"):
        wide = np.clip(np.asarray(img), 0, 65535).astype(np.uint16)
        return Image.fromarray((wide >> 8).astype(np.uint8))
    if mode == "F":
        values = np.asarray(img, dtype=np.float32)
        values = np.where(np.isfinite(values), values, 0.0)
        if values.size and values.max() <= 1.0:
            values = values * 255.0
        return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8))
    return img.convert("RGB")  # P, CMYK, YCbCr, ...; ValueError if Pillow cannot


def exif_orientation(img: Image.Image) -> int:
    """The EXIF (or XMP) orientation 1..8 the record applies; 1 when there is none, or an
    unreadable one."""
    try:
        value = img.getexif().get(_ORIENTATION_TAG, 1)
    except (*_PILLOW_ERRORS, KeyError, IndexError, TypeError):
        return 1  # a broken EXIF block should not cost the image
    return value if isinstance(value, int) and value in _TRANSPOSE else 1


def _open_formats() -> tuple[str, ...]:
    """The formats ``Image.open`` may try: the ones discovery counts as images."""
    return readable_formats()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()).rstrip(".")
    return text[:200] if text else type(exc).__name__


def _reason(exc: BaseException) -> str:
    text = _one_line(exc)
    if isinstance(exc, OSError):
        if "truncated" in text.lower():  # "image file is truncated", "Truncated File Read"
            return f"truncated image ({text})"
        return f"cannot decode image ({text})"
    return f"corrupt image ({type(exc).__name__}: {text})"


# -- where a record's pixels come from: the source region to resample, and its geometry.
# Where a record's pixels come from: the source region to resample, and its geometry.
#
# Pure arithmetic on sizes and boxes, shared by decoding (which region to read,
# what size to resize it to) and by the geometry every record carries. Boxes are
# (left, top, right, bottom) in continuous pixel coordinates, as Pillow's
# ``resize(box=...)`` takes them; orientations are EXIF's 1..8.

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
