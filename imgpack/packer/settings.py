"""What decides a record's pixels: the packer's settings, checked once, and their names.

``DecodeSettings`` is recorded in the index's ``packer`` field and in a run's
recipe; ``decode`` turns a file into a record under them. The CLI takes its
choices (``RESIZE_MODES``, ``FILTERS``) and ``parse_size`` from here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import PIL
from PIL import Image

from imgpack.format.layout import CODECS
from imgpack.packer.jpeg import DEFAULT_QUALITY, MAX_JPEG_SIDE, check_quality

__all__ = [
    "RESIZE_MODES",
    "FILTERS",
    "PAD_FILL",
    "ALPHA_BACKGROUND",
    "MAX_SIDE",
    "DecodeSettings",
    "parse_size",
]

RESIZE_MODES = ("center-crop", "stretch", "pad", "fit")  # fit: keep the aspect, no crop
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
    # how records are stored: raw HWC, yuv420 (3 channels) or jpeg; encoded in the workers
    codec: str = "raw"
    # jpeg only: the quality records are encoded at (None: DEFAULT_QUALITY)
    quality: int | None = None

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
        if self.resize == "fit" and self.width != self.height:
            raise ValueError(
                f"resize fit takes one size S (the longer side), not {self.width}x{self.height}"
            )
        if self.codec not in CODECS:
            raise ValueError(f"codec must be one of {', '.join(CODECS)}, got {self.codec!r}")
        if self.codec == "yuv420" and self.channels != 3:
            raise ValueError("codec yuv420 stores colour: it needs 3 channels, not 1")
        if self.codec == "jpeg":
            q = DEFAULT_QUALITY if self.quality is None else check_quality(self.quality)
            object.__setattr__(self, "quality", q)  # frozen: the one default, set once
            if max(self.width, self.height) > MAX_JPEG_SIDE:
                raise ValueError(
                    f"codec jpeg stores sides of at most {MAX_JPEG_SIDE} pixels (libjpeg's "
                    f"limit), not {self.width}x{self.height}"
                )
        elif self.quality is not None:
            raise ValueError(f"quality is for codec jpeg, not {self.codec}")

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
            "codec": self.codec,
            **({"quality": self.quality} if self.codec == "jpeg" else {}),
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
