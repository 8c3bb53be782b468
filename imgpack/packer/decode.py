"""Turn one source file into the exact uint8 RGB pixels of one record.

Everything about a record's pixels is decided here, so that a pack is
reproducible: the same file, settings and Pillow version give the same bytes.
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
  and crop offset (``plan.plan_resize``); ``stretch``:
  resize to exactly width x height; ``pad``: scale to fit inside, centre, fill
  with ``PAD_FILL`` (black).
* Every record comes with its ``RecordGeometry``: the source size after EXIF rotation
  (at full resolution, whatever ``draft`` decoded), the source box it shows and
  the content box where that lies in the record (``imgpack.packer.plan``).
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

import math
import os
import re
import struct
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import PIL
from PIL import Image

from imgpack.errors import ImageReadError
from imgpack.format.fields import RecordGeometry
from imgpack.packer.formats import readable_formats
from imgpack.packer.plan import oriented, oriented_box, plan_resize, target_size

__all__ = [
    "RESIZE_MODES",
    "FILTERS",
    "PAD_FILL",
    "ALPHA_BACKGROUND",
    "MAX_SIDE",
    "DecodeSettings",
    "parse_size",
    "decode_image",
    "decode_to_image",
    "decode_record",
    "pillow_quiet",
]

RESIZE_MODES = ("center-crop", "stretch", "pad")
FILTERS: dict[str, int] = {
    "nearest": Image.Resampling.NEAREST,
    "box": Image.Resampling.BOX,
    "bilinear": Image.Resampling.BILINEAR,
    "hamming": Image.Resampling.HAMMING,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
PAD_FILL = (0, 0, 0)
ALPHA_BACKGROUND = (255, 255, 255)
MAX_SIDE = 65535

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
_SIZE_RE = re.compile(r"(\d+)(?:\s*[xX]\s*(\d+))?", re.ASCII)


@dataclass(frozen=True)
class DecodeSettings:
    """How every record of a pack is made; recorded in the index's ``packer`` field."""

    width: int
    height: int
    resize: str = "center-crop"
    filter: str = "bilinear"
    # JPEG DCT-domain downscale (by 2, 4 or 8) when the image shrinks >= 2x.
    draft: bool = True
    # Image.resize's two-step shortcut (reduce() by an integer, then resample).
    # None = exact resampling: after draft a JPEG shrinks < 2x more, where the
    # shortcut does nothing, so it would only speed up large non-JPEG sources.
    reducing_gap: float | None = None
    # Pillow's default bomb limit; larger images are refused, never decoded.
    max_pixels: int = 89_478_485
    # 3: RGB; 1: Pillow's convert("L") of the finished RGB record (ITU-R 601-2 luma).
    channels: int = 3
    # center-crop only: Resize(int(size / crop_ratio)) + CenterCrop(size), as torchvision.
    crop_ratio: float = 1.0

    def __post_init__(self) -> None:
        for name in ("width", "height"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIDE:
                raise ValueError(f"{name} must be a whole number 1..{MAX_SIDE}, got {value!r}")
        if self.resize not in RESIZE_MODES:
            raise ValueError(
                f"resize must be one of {', '.join(RESIZE_MODES)}, got {self.resize!r}"
            )
        if self.filter not in FILTERS:
            raise ValueError(f"filter must be one of {', '.join(FILTERS)}, got {self.filter!r}")
        gap = self.reducing_gap
        if gap is not None and (isinstance(gap, bool) or not gap >= 1.0 or math.isinf(gap)):
            raise ValueError(f"reducing_gap must be None or a number >= 1.0, got {gap!r}")
        if isinstance(self.max_pixels, bool) or not isinstance(self.max_pixels, int):
            raise ValueError(f"max_pixels must be a whole number, got {self.max_pixels!r}")
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be at least 1, got {self.max_pixels}")
        if self.channels not in (1, 3) or isinstance(self.channels, bool):
            raise ValueError(f"channels must be 1 or 3, got {self.channels!r}")
        r = self.crop_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 < r <= 1.0:
            raise ValueError(f"crop_ratio must be a number in (0, 1], got {r!r}")
        if r != 1.0 and self.resize != "center-crop":
            raise ValueError(f"crop_ratio {r} needs --resize center-crop, not {self.resize}")

    def to_json(self) -> dict[str, Any]:
        """Everything that decides the pixels, JSON-ready (Pillow's version included)."""
        return {
            "size": [self.width, self.height],
            "resize": self.resize,
            "filter": self.filter,
            "draft": self.draft,
            "reducing_gap": self.reducing_gap,
            "max_pixels": self.max_pixels,
            "pad_fill": list(PAD_FILL),
            "alpha_background": list(ALPHA_BACKGROUND),
            "channels": self.channels,
            "crop_ratio": float(self.crop_ratio),
            "pillow": PIL.__version__,
        }


def parse_size(text: str) -> tuple[int, int]:
    """``"224"`` -> (224, 224); ``"320x240"`` -> (width 320, height 240)."""
    match = _SIZE_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"size {text!r}: expected N or WIDTHxHEIGHT, e.g. 224 or 320x240")
    width = int(match[1])
    height = int(match[2]) if match[2] is not None else width
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise ValueError(f"size {text!r}: each side must be 1..{MAX_SIDE} pixels")
    return width, height


def decode_image(path: str | os.PathLike, settings: DecodeSettings) -> np.ndarray:
    """Decode ``path`` to a (height, width, 3) uint8 C-contiguous, writable array.

    Any problem with the file raises ``ImageReadError`` whose message is a short
    reason without the path (the caller knows which file it asked for).
    """
    return np.array(decode_to_image(path, settings), dtype=np.uint8)


def decode_to_image(
    path: str | os.PathLike, settings: DecodeSettings, *, silence: bool = True
) -> Image.Image:
    """Like ``decode_image``, but the finished RGB (or L) ``Image`` of width x height."""
    return decode_record(path, settings, silence=silence)[0]


def decode_record(
    path: str | os.PathLike, settings: DecodeSettings, *, silence: bool = True
) -> tuple[Image.Image, RecordGeometry]:
    """The finished record as an ``Image``, and where it came from in the source.

    The packer wants the record's bytes (``tobytes()``) and its channel sums
    (from ``histogram()``, one C pass over pixels still in cache), not an array.
    ``silence=False``: the caller holds ``pillow_quiet()`` around its loop of
    files (entered once per loop instead of once per file: ~10 us a file less).
    """
    try:
        fp = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise ImageReadError(f"cannot open file ({exc.strerror or exc})") from exc
    with fp:
        if os.fstat(fp.fileno()).st_size == 0:
            raise ImageReadError("empty file (0 bytes)")
        try:
            if not silence:
                return _decode(fp, settings)
            with pillow_quiet():
                return _decode(fp, settings)
        except ImageReadError:
            raise
        except Image.DecompressionBombError as exc:
            raise ImageReadError(f"decompression bomb: {_one_line(exc)}") from exc
        except Image.UnidentifiedImageError as exc:
            raise ImageReadError(
                "cannot identify image file (no image format Pillow reads matches its contents)"
            ) from exc
        except _PILLOW_ERRORS as exc:
            raise ImageReadError(_reason(exc)) from exc


@contextmanager
def pillow_quiet() -> Iterator[None]:
    """Silence Pillow's per-file warnings while decoding (process-wide, as any
    ``warnings.catch_warnings``): we apply our own pixel limit, and a corrupt
    EXIF block (Pillow's UserWarning) already means "no rotation"."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        warnings.filterwarnings("ignore", module=r"PIL\.")
        yield


def _decode(fp: IO[bytes], s: DecodeSettings) -> tuple[Image.Image, RecordGeometry]:
    img = Image.open(fp, formats=_open_formats())
    w0, h0 = img.size
    if w0 * h0 > s.max_pixels:
        raise ImageReadError(
            f"decompression bomb: {w0}x{h0} = {w0 * h0} pixels > limit {s.max_pixels}"
        )
    if w0 < 1 or h0 < 1:
        raise ImageReadError(f"image has no pixels ({w0}x{h0})")
    box: tuple[float, float, float, float] = (0, 0, w0, h0)  # the whole picture, loaded
    orientation = None
    if img.format in ("JPEG", "MPO"):
        orientation = _orientation(img)  # needed before draft; JPEG EXIF is in the header
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
        orientation = _orientation(img)  # PNG may keep EXIF after the pixels
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
    if out.size != (s.width, s.height):  # pad: letterbox into the target
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


def _orientation(img: Image.Image) -> int:
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
