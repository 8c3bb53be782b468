"""Turn one source file into the exact uint8 RGB pixels of one record.

Everything about a record's pixels is decided here, under the pack's
``DecodeSettings``, so that a pack is reproducible: the same file,
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
* Every format Pillow can decode is opened (``readable_formats``),
  except EPS (it runs Ghostscript on untrusted input) and header-only or stub
  plugins. Multi-frame files (GIF, APNG, WebP, TIFF) give their first frame.
* Images with more than ``MAX_PIXELS`` pixels are refused from the header,
  before any pixel is decoded. Pillow's own limit (``Image.MAX_IMAGE_PIXELS``,
  refused at twice its value) still applies on top; we never change it.

Which files are images (``readable_formats``, ``image_extensions``): every format this
Pillow build can decode, told by its extension. Discovery picks files by name (it never
opens them), and decoding opens only these formats, so the two agree.
Left out on purpose, although Pillow has a plugin for them:

* EPS/PostScript: reading one runs Ghostscript, an interpreter, on the file;
  a dataset is untrusted input.
* MPEG: Pillow reads only the header of a video, never its pixels.
* Stub formats (HDF5, GRIB, BUFR, WMF/EMF): Pillow identifies them but needs a
  handler installed by the application to decode them.
"""

from __future__ import annotations

import io
import math
import os
import re
import struct
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import IO, Any, NamedTuple

import numpy as np
from PIL import Image

from imgpack.errors import InvalidArgumentError
from imgpack.format.fields import RecordGeometry, whole_record
from imgpack.format.layout import CODECS
from imgpack.packer.jpeg import source_record
from imgpack.validate import is_int, is_number

__all__ = ["DecodeSettings", "Kept", "decode_record", "image_extensions", "parse_size"]

RESIZE_MODES = ("center-crop", "stretch", "pad", "fit")  # fit: keep the aspect, no crop
# --filter NAME is Pillow's Image.Resampling.NAME
_FILTER_NAMES = ("nearest", "box", "bilinear", "hamming", "bicubic", "lanczos")
FILTERS: dict[str, int] = {name: Image.Resampling[name.upper()] for name in _FILTER_NAMES}
PAD_FILL = (0, 0, 0)
ALPHA_BACKGROUND = (255, 255, 255)
MAX_SIDE = 65535
MAX_JPEG_SIDE = 65500  # libjpeg refuses to write a longer side
# Pillow's default bomb limit: larger images are refused from the header, never decoded
MAX_PIXELS = 89_478_485
# FFCV's ImageNet recipes' quality; its bytes and fidelity are in docs/benchmarks.md
DEFAULT_QUALITY = 90
_SIZE_RE = re.compile(r"(\d+)(?:\s*[xX]\s*(\d+))?", re.ASCII)


@dataclass(frozen=True)
class DecodeSettings:
    """How every record of a pack is made; recorded in the index's ``packer`` field."""

    width: int
    height: int
    resize: str = "center-crop"
    filter: str = "bilinear"
    # 3: RGB; 1: Pillow's convert("L") of the finished RGB record (ITU-R 601-2 luma).
    channels: int = 3
    # center-crop only: Resize(int(size / crop_ratio)) + CenterCrop(size), as torchvision.
    crop_ratio: float = 1.0
    # how records are stored: raw HWC, yuv420 (3 channels) or jpeg; encoded in the workers
    codec: str = "raw"
    # jpeg only: the quality records are encoded at (None: DEFAULT_QUALITY)
    quality: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("width", self.width), ("height", self.height)):
            if not (is_int(value) and 1 <= value <= MAX_SIDE):
                raise ValueError(f"{name} must be a whole number 1..{MAX_SIDE}, got {value!r}")
        check_choice("resize", self.resize, RESIZE_MODES)
        check_choice("filter", self.filter, FILTERS)
        r = self.crop_ratio
        if not (is_number(r) and 0.0 < r <= 1.0):
            raise ValueError(f"crop_ratio must be a number in (0, 1], got {r!r}")
        if r != 1.0 and self.resize != "center-crop":
            raise ValueError(f"crop_ratio {r} needs --resize center-crop, not {self.resize}")
        if self.resize == "fit" and self.width != self.height:
            raise ValueError(
                f"resize fit takes one size S (the longer side), not {self.width}x{self.height}"
            )
        object.__setattr__(self, "quality", check_codec(self.codec, self.channels, self.quality))
        if self.codec == "jpeg" and max(self.width, self.height) > MAX_JPEG_SIDE:
            size = self.width if self.width == self.height else f"{self.width}x{self.height}"
            raise ValueError(
                f"--codec jpeg stores sides of at most {MAX_JPEG_SIDE} pixels, not --size {size}"
            )

    def to_json(self) -> dict[str, Any]:
        """Everything that decides the pixels, JSON-ready (Pillow's version included).

        ``draft``, ``reducing_gap`` and ``max_pixels`` are the fixed choices ``_decode`` makes
        (a JPEG shrinking 2x or more is decoded DCT-scaled; resampling is exact; images
        over ``MAX_PIXELS`` are refused), recorded as packs have always recorded them."""
        return {
            "size": [self.width, self.height],
            "resize": self.resize,
            "filter": self.filter,
            "draft": True,
            "reducing_gap": None,
            "max_pixels": MAX_PIXELS,
            "pad_fill": list(PAD_FILL),
            "alpha_background": list(ALPHA_BACKGROUND),
            "channels": self.channels,
            "crop_ratio": float(self.crop_ratio),
            "codec": self.codec,
            **({"quality": self.quality} if self.codec == "jpeg" else {}),
            "pillow": Image.__version__,
        }


def check_codec(codec: str, channels: int, quality: int | None) -> int | None:
    """How records are stored, checked once for ``DecodeSettings`` and ``PackWriter``: the
    quality a jpeg pack encodes at (None: ``DEFAULT_QUALITY``), None for other codecs."""
    if not is_int(channels) or channels not in (1, 3):
        raise InvalidArgumentError(f"channels must be 1 or 3, got {channels!r}")
    check_choice("codec", codec, CODECS, InvalidArgumentError)
    if codec == "yuv420" and channels != 3:
        raise InvalidArgumentError(
            "--codec yuv420 stores 3 channels (colour); it cannot be used with --channels 1"
        )
    if codec != "jpeg" and quality is not None:
        raise InvalidArgumentError(f"--quality is for --codec jpeg, not --codec {codec}")
    if quality is not None and not (is_int(quality) and 1 <= quality <= 100):
        raise InvalidArgumentError(f"jpeg quality must be a whole number 1..100, got {quality!r}")
    return DEFAULT_QUALITY if codec == "jpeg" and quality is None else quality


def check_choice(name: str, value: Any, choices: Any, error: type = ValueError) -> None:
    """``value`` is one of ``choices``, or ``error`` says "NAME must be one of A, B, got X"."""
    if value not in choices:
        raise error(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def parse_size(text: str) -> tuple[int, int]:
    """``"224"`` -> (224, 224); ``"320x240"`` -> (width 320, height 240)."""
    match = _SIZE_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"size {text!r}: expected N or WIDTHxHEIGHT, e.g. 224 or 320x240")
    width, height = int(match[1]), int(match[2] or match[1])  # N alone: N x N
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise ValueError(f"size {text!r}: each side must be 1..{MAX_SIDE} pixels")
    return width, height


_REFUSED = {
    "EPS": "EPS is not opened (reading it would run Ghostscript)",
    "MPEG": "MPEG is a video; Pillow reads only its header",
}


# tried first, in this order (what imgpack opened before it took every format): a file
# that one of them accepts decodes as it always did, and the common cases cost least
_FIRST = ("JPEG", "MPO", "PNG", "GIF", "BMP", "PPM", "TIFF", "WEBP")


# formats Pillow identifies but whose pixels need a handler the application installs
_STUBS = frozenset({"BUFR", "GRIB", "HDF5", "WMF"})


@lru_cache(maxsize=1)
def readable_formats() -> tuple[str, ...]:
    """Pillow format names, of the extensions it registers, whose pixels this build decodes
    (``Image.open(formats=...)``): those Pillow has an opener for (``Image.OPEN``, filled
    once ``registered_extensions`` has loaded every plugin), less the refused and the stubs."""
    names = dict.fromkeys(Image.registered_extensions().values())
    readable = [name for name in names if name in Image.OPEN and name not in {*_REFUSED, *_STUBS}]
    first = [name for name in _FIRST if name in readable]
    return (*first, *(name for name in readable if name not in first))


@lru_cache(maxsize=1)
def image_extensions() -> frozenset[str]:
    """Lower-case extensions (with the dot) of every readable format: '.jpg', '.gif', ...

    Pillow registers .mpo for MPO, which it opens through the JPEG opener (a multi-picture
    JPEG comes out of it): readable as JPEG is (its opener is registered with the plugin,
    whether or not libjpeg is there to decode)."""
    readable = {*readable_formats(), "MPO"}
    return frozenset(ext for ext, name in Image.registered_extensions().items() if name in readable)


def not_read_reason(ext: str) -> str:
    """Why a file with extension ``ext`` (lower-case, from ``os.path.splitext``; '' for none)
    is not an image to pack."""
    if not ext:
        return "no file extension, so not an image format Pillow reads"
    fmt = Image.registered_extensions().get(ext)  # Pillow registers them lower-case
    if fmt is None:
        return f"{ext} is not an image format Pillow reads"
    return _REFUSED.get(fmt, f"{ext}: Pillow cannot decode {fmt} pixels without a plugin handler")


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


class Kept(NamedTuple):
    """A jpeg pack's record that is its source's own stream, byte for byte
    (``jpeg.source_record``), with the pixels a reader decodes of it."""

    stream: bytes
    pixels: np.ndarray


def decode_record(
    path: str | os.PathLike | bytes, settings: DecodeSettings
) -> tuple[Image.Image | Kept, RecordGeometry] | str:
    """The finished record as an ``Image`` and where it came from in the source, or, for a
    file that cannot be a record, the short reason why (one line, without the path). In a
    jpeg pack, a JPEG source that already is its record comes as ``Kept``, not decoded
    again: its headers are read once, here, for both.

    ``path`` is a file to open, or the image's encoded bytes (a tar member, a Parquet
    cell): the same bytes give the same record either way.

    A bad file is an outcome of packing, not a failure of it: the caller records the
    reason as a skip, or stops with it under --on-error fail. Anything else raises.
    The packer wants the record's bytes (``tobytes()``) and its channel sums
    (from ``histogram()``, one C pass over pixels still in cache), not an array.
    Call it inside ``pillow_quiet()``, held around a loop of files, so that the
    process-wide warnings state is saved and restored once per loop, not once per file.
    """
    try:  # closed by the with below
        fp = io.BytesIO(path) if isinstance(path, bytes) else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        return f"cannot open file ({exc.strerror or exc})"
    with fp:
        if fp.seek(0, os.SEEK_END) == 0:
            return "empty file (0 bytes)"
        fp.seek(0)
        try:
            return _decode(fp, settings)
        except Image.DecompressionBombError as exc:
            return f"decompression bomb: {_one_line(exc)}"
        except Image.UnidentifiedImageError:
            return "cannot identify image file (no image format Pillow reads matches its contents)"
        except _PILLOW_ERRORS as exc:
            text = _one_line(exc)
            if not isinstance(exc, OSError):
                return f"corrupt image ({type(exc).__name__}: {text})"
            # "image file is truncated", "Truncated File Read"
            kind = "truncated image" if "truncated" in text.lower() else "cannot decode image"
            return f"{kind} ({text})"


@contextmanager
def pillow_quiet() -> Iterator[None]:
    """Silence Pillow's per-file warnings while decoding (process-wide, as any
    ``warnings.catch_warnings``): we apply our own pixel limit, and a corrupt
    EXIF block (Pillow's UserWarning) already means "no rotation"."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        warnings.filterwarnings("ignore", module=r"PIL\.")
        yield


def _decode(fp: IO[bytes], s: DecodeSettings) -> tuple[Image.Image | Kept, RecordGeometry] | str:
    img = Image.open(fp, formats=readable_formats())
    w0, h0 = img.size
    if w0 * h0 > MAX_PIXELS:  # (Pillow's opener already refused a side of 0 pixels)
        return f"decompression bomb: {w0}x{h0} = {w0 * h0} pixels > limit {MAX_PIXELS}"
    jpeg = img.format in ("JPEG", "MPO")
    if not jpeg:
        img.load()  # PNG may keep EXIF after the pixels; JPEG's is in the header
    orientation = exif_orientation(img)  # a JPEG's is needed before draft
    region, out_size = _plan(w0, h0, orientation, s)
    box: tuple[float, float, float, float] = (0, 0, w0, h0)  # the whole picture, loaded
    # the record is the whole source at its own size, unrotated, not letterboxed: in a jpeg
    # pack, a JPEG source may be it, as it came
    padded = s.resize == "pad" and out_size != (s.width, s.height)
    whole = region == box and out_size == (w0, h0) and orientation == 1 and not padded
    if whole and s.codec == "jpeg" and img.format == "JPEG":
        fp.seek(0)
        stream = fp.read()
        pixels = source_record(stream, out_size, s.channels)
        if pixels is not None:
            return Kept(stream, pixels), whole_record(w0, h0)
    if jpeg:  # DCT-domain downscaling (by 2, 4 or 8) when the image shrinks >= 2x
        need = (
            math.ceil(w0 * out_size[0] / (region[2] - region[0])),
            math.ceil(h0 * out_size[1] / (region[3] - region[1])),
        )
        if w0 >= 2 * need[0] and h0 >= 2 * need[1]:
            drafted = img.draft("RGB", need)  # a size >= need, scaled by 1/2, 1/4 or 1/8
            if drafted is not None:
                box = drafted[1]
    img.load()
    img = _working_image(img)
    kx, ky = box[2] / w0, box[3] / h0
    loaded_region = (region[0] * kx, region[1] * ky, region[2] * kx, region[3] * ky)
    out = img.resize(out_size, FILTERS[s.filter], box=loaded_region)
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
    target = oriented((s.width, s.height), orientation)  # in the stored image's axes
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
        value = img.getexif().get(0x0112, 1)  # the Orientation tag
    except (*_PILLOW_ERRORS, KeyError, IndexError, TypeError):
        return 1  # a broken EXIF block should not cost the image
    return value if isinstance(value, int) and value in _TRANSPOSE else 1


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()).rstrip(".")
    return text[:200] if text else type(exc).__name__


# -- Where a record's pixels come from: the source region to resample, and its geometry.
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
    if orientation in _SWAPS:  # transpose: 5 alone; 6, 7 and 8 then mirror as well
        x0, y0, x1, y1, w, h = y0, x0, y1, x1, h, w
    if orientation in (2, 3, 6, 7):  # mirror left-right (3: with 4, a half turn)
        x0, x1 = w - x1, w - x0
    if orientation in (3, 4, 7, 8):  # mirror top-bottom
        y0, y1 = h - y1, h - y0
    return x0, y0, x1, y1


def plan_resize(
    w0: int, h0: int, target: tuple[int, int], mode: str, crop_ratio: float = 1.0
) -> tuple[tuple[float, float, float, float], tuple[int, int]]:
    """(region of the source to read, in source pixels; size to resize it to)."""
    tw, th = target
    if mode == "center-crop" and crop_ratio != 1.0:
        # torchvision's eval transform, Resize(int(size / R)) then CenterCrop(size), in the
        # integers it computes: the side that decides the cover gets int(target / R) pixels,
        # the other int() of its share; the crop starts at round((resized - target) / 2)
        if tw * h0 >= th * w0:  # the width decides (the shorter side, for a square target)
            rw = int(tw / crop_ratio)
            rh = int(rw * h0 / w0)
        else:
            rh = int(th / crop_ratio)
            rw = int(rh * w0 / h0)
        left, top = int(round((rw - tw) / 2.0)), int(round((rh - th) / 2.0))
        fx, fy = w0 / rw, h0 / rh
        return (left * fx, top * fy, (left + tw) * fx, (top + th) * fy), (tw, th)
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
