"""Which files are images: every format this Pillow build can decode, told by its extension.

Discovery picks files by name (it never opens them), and decoding opens only the
formats listed here, so the two agree: a file is packed when its extension is
one Pillow registers for a format it can read, and never mistaken for another
format by its contents alone. Pillow's plugins are initialised once, on first use.

Left out on purpose, although Pillow has a plugin for them:

* EPS/PostScript: reading one runs Ghostscript, an interpreter, on the file;
  a dataset is untrusted input.
* MPEG: Pillow reads only the header of a video, never its pixels.
* Stub formats (HDF5, GRIB, BUFR, WMF/EMF): Pillow identifies them but needs a
  handler installed by the application to decode them.
"""

from __future__ import annotations

import io
from functools import lru_cache

from PIL import Image, UnidentifiedImageError

__all__ = ["readable_formats", "image_extensions", "extension_of", "not_read_reason"]

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
    (``Image.open(formats=...)``): asked of ``Image.open`` itself, which tells a format it
    can open (it reads no image from an empty file) from one it cannot open at all."""
    names = dict.fromkeys(Image.registered_extensions().values())
    readable = [
        name for name in names if name not in _REFUSED and name not in _STUBS and _opens(name)
    ]
    first = [name for name in _FIRST if name in readable]
    return (*first, *(name for name in readable if name not in first))


def _opens(name: str) -> bool:
    try:
        Image.open(io.BytesIO(b""), formats=[name])
    except UnidentifiedImageError:
        return True  # an opener, which found no image in no bytes
    except Exception:
        return False  # no opener for it (a format Pillow only writes)
    return True


# formats Pillow registers an extension for but opens through another plugin's factory
# (an MPO, a multi-picture JPEG, comes out of the JPEG opener): readable when it is
_OPENED_BY = {"MPO": "JPEG"}


@lru_cache(maxsize=1)
def image_extensions() -> frozenset[str]:
    """Lower-case extensions (with the dot) of every readable format: '.jpg', '.gif', ..."""
    readable = set(readable_formats())
    readable |= {name for name, opener in _OPENED_BY.items() if opener in readable}
    return frozenset(
        ext.lower() for ext, name in Image.registered_extensions().items() if name in readable
    )


def extension_of(name: str) -> str:
    """'a.JPG' -> '.jpg'; '' for no extension (a leading dot alone is a hidden name, not one)."""
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else ""


def not_read_reason(ext: str) -> str:
    """Why a file with extension ``ext`` (from ``extension_of``) is not an image to pack."""
    if not ext:
        return "no file extension, so not an image format Pillow reads"
    fmt = Image.registered_extensions().get(ext) or next(
        (v for k, v in Image.registered_extensions().items() if k.lower() == ext), None
    )
    if fmt in _REFUSED:
        return _REFUSED[fmt]
    if fmt is not None:
        return f"{ext}: Pillow cannot decode {fmt} pixels without a plugin handler"
    return f"{ext} is not an image format Pillow reads"
