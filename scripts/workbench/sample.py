"""Make ImageNet-like sample folders from real photographs, with nothing downloaded.

Benchmarks on noise lie: noise JPEGs decode slower and compress worse than
photos. We cut random crops from photographs that installed packages already
carry on disk (scikit-image's sample photos, read as files without importing
scikit-image; matplotlib's Grace Hopper portrait as a fallback), jitter them,
and save them as JPEGs in ``DEST/<class>/<n>.jpg``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["photo_sources", "cut_images", "make_sample_folder"]

# Colour photographs shipped in scikit-image's wheel (its data/ folder).
_SKIMAGE_PHOTOS = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "grass.png",
    "gravel.png",
    "brick.png",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "ihc.png",
)


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def photo_sources() -> list[Path]:
    """Paths of real photographs available on this machine, best first."""
    found = []
    sk = _package_dir("skimage")
    if sk is not None:
        found += [sk / "data" / n for n in _SKIMAGE_PHOTOS if (sk / "data" / n).is_file()]
    mpl = _package_dir("matplotlib")
    if mpl is not None:
        hopper = mpl / "mpl-data" / "sample_data" / "grace_hopper.jpg"
        if hopper.is_file():
            found.append(hopper)
    return found


def _procedural_photo(rng: np.random.Generator, size: int = 512) -> Image.Image:
    """Last resort when no photograph is installed: smooth colour fields plus grain."""
    yy, xx = np.mgrid[0:size, 0:size] / size
    chans = []
    for _ in range(3):
        a, b, c = rng.uniform(1, 6, 3)
        chans.append(np.sin(a * xx + rng.uniform(0, 6)) * np.cos(b * yy + c))
    arr = (np.stack(chans, -1) * 0.5 + 0.5) * 220 + rng.normal(0, 6, (size, size, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def _load_photos(rng: np.random.Generator) -> list[Image.Image]:
    photos = [Image.open(p).convert("RGB") for p in photo_sources()]
    return photos or [_procedural_photo(rng) for _ in range(4)]


def _one_image(photo: Image.Image, rng: np.random.Generator, out_w: int, out_h: int) -> Image.Image:
    """A random crop of ``photo`` resized to out_w x out_h, maybe flipped, colour-jittered."""
    pw, ph = photo.size
    aspect = out_w / out_h
    scale = rng.uniform(0.35, 1.0)
    cw = min(pw, int(round(pw * scale)))
    ch = min(ph, int(round(cw / aspect)))
    cw = min(cw, int(round(ch * aspect)))
    x0 = int(rng.integers(0, pw - cw + 1))
    y0 = int(rng.integers(0, ph - ch + 1))
    img = photo.crop((x0, y0, x0 + cw, y0 + ch)).resize((out_w, out_h), Image.BICUBIC)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    gain = rng.uniform(0.85, 1.15, 3)
    arr = np.asarray(img, dtype=np.float32) * gain
    # Upscaled crops are too smooth to decode like camera JPEGs; add sensor-like grain.
    if out_w * out_h > cw * ch:
        arr += rng.normal(0, 3.0, arr.shape).astype(np.float32)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def cut_images(
    count: int, *, large: bool = False, seed: int = 0
) -> Iterator[tuple[Image.Image, Path | None]]:
    """``count`` images cut from the photographs, each with the photograph it was cut from
    (None: a procedural stand-in); ``make_sample_folder`` saves this very sequence.

    ``large=False`` gives ImageNet-like sizes (about 400x350, varying);
    ``large=True`` gives camera-sized images with the short side >= 2000 px.
    """
    rng = np.random.default_rng(seed)
    photos = _load_photos(rng)
    sources: list[Path | None] = list(photo_sources()) or [None] * len(photos)
    for _ in range(count):
        if large:
            short = int(rng.integers(2000, 2300))
            w, h = (int(short * rng.uniform(1.3, 1.5)), short)
        else:
            w, h = int(rng.integers(330, 470)), int(rng.integers(290, 410))
        if rng.random() < 0.3:
            w, h = h, w
        k = int(rng.integers(len(photos)))
        yield _one_image(photos[k], rng, w, h), sources[k]


def make_sample_folder(
    dest: str | os.PathLike,
    *,
    classes: int = 10,
    per_class: int = 50,
    large: bool = False,
    seed: int = 0,
    quality: int = 90,
) -> Path:
    """Write ``classes * per_class`` JPEGs (``cut_images``) under DEST/class_XX/ and return
    DEST."""
    dest = Path(dest)
    for c in range(classes):
        (dest / f"class_{c:02d}").mkdir(parents=True, exist_ok=True)
    cuts = cut_images(classes * per_class, large=large, seed=seed)
    for n, (img, _) in enumerate(cuts):
        c, i = divmod(n, per_class)
        img.save(dest / f"class_{c:02d}" / f"{i:05d}.jpg", quality=quality)
    return dest
