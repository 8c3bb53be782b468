"""The scale-aware decode against its contract, per crop, for several gaps in one run.

The reader decodes a JPEG record at 1/2 (libjpeg's DCT scaling) when the crop box is still
``gap`` times the output there (``imgpack.reader.jpeg.pick_scales``, lowered by
``exact_scale`` as ``imgpack.reader.plan.Scaled`` does; ``jpeg.GAP`` is the reader's
gap). The contract: per crop, the scaled path stays within 0.5 dB of an exact resample of
the full decode. For each photo set, quality, output size and crop (torchvision's
RandomResizedCrop boxes and the eval box, drawn in source pixels by
``bench_augment.draw_crops``), with truth = Pillow's BILINEAR resample of the box of the
ORIGINAL (lossless) file:

  loss_db       PSNR(Pillow's BILINEAR of the full decode) - PSNR(the loader's resample of
                the 1/2 decode), both against the truth: the contract's measure;
  full_loss_db  the same for the loader's resample of the FULL decode: the measure's floor
                (where it misses 0.5 dB too, the miss is the measure's, not the scale's).

"The loader's resample" is ``imgpack.reader.resample.resample_boxes`` in float64 (no
rounding of its own) on the box mapped into the decoded pixels (``to_decoded``). PSNR is
99 dB for an exact match, as everywhere in the workbench. Each gap decodes at 1/2 a subset
of the crops of a smaller gap, so every crop is measured once and each gap's rows count
the crops it would decode at 1/2; ``pixels_decoded`` is that gap's speed proxy: decoded
pixels over full-size pixels, summed over all crops of the set and output.

The photo sets (``photo_sets``): the installed photographs as the packer's ``--resize
fit`` records at each side (the grey ones among them, grass, gravel and brick, counted as
"grey"); the same photographs converted to L, stored in an RGB pack (YCbCr with flat
chroma, as the packer stores a grey source); camera-sized and ImageNet-sized images cut
from them (``sample.cut_images``), kept lossless (PNG) as the truth and stored whole, each
counted grey if its photograph is. Every record is encoded as the packer encodes it
(``bench_jpeg_quality.jpeg_store``).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import simplejpeg
import torch
from PIL import Image

from imgpack.packer.jpeg import MAX_JPEG_SIDE
from imgpack.reader.augment import geometry as record_geometry
from imgpack.reader.augment import to_record
from imgpack.reader.jpeg import decode, exact_scale, pick_scales, scaled_size
from imgpack.reader.resample import resample_boxes
from workbench.bench_augment import draw_crops, make_natives, pillow_crop
from workbench.bench_jpeg_quality import jpeg_store, resized
from workbench.jpeg_decoders import to_decoded
from workbench.report import machine_info
from workbench.sample import cut_images

__all__ = ["GAPS", "QUALITIES", "LIMIT_DB", "FULL", "QUICK", "PhotoSet", "loader_crop",
           "photo_sets", "measure_set", "summarise", "run_scaled_bench"]  # fmt: skip

GAPS = (3.0, 3.5, 4.0)
QUALITIES = (90,)
LIMIT_DB = 0.5  # the contract: the scaled path within 0.5 dB of the full decode's resample
FULL = {"natives": None, "max_side": None, "sides": (384, 512), "camera": 16, "imagenet": 40,
        "outs": (224, 160, 112, 64, 32),
        "crops": {"natives": 8, "camera": 4, "imagenet": 2}}  # fmt: skip
QUICK = {"natives": 3, "max_side": 128, "sides": (96, 128), "camera": 0, "imagenet": 2,
         "outs": (16, 8), "crops": {"natives": 2, "camera": 1, "imagenet": 2}}  # fmt: skip
_GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")


class PhotoSet(NamedTuple):
    """Records of one set before encoding: the packer's ``--resize fit`` images and geometry,
    the files (the truth) they came from, which are grey, and train crops per photo."""

    name: str
    folder: Path
    files: list[str]
    grey: list[bool]
    images: list[Image.Image]
    geos: list[Any]
    crops: int


def _is_grey(path: Path | None) -> bool:
    """A single-channel image, or RGB with three equal channels (a shrunk copy of one)."""
    if path is None:
        return False
    img = Image.open(path)
    if img.mode in _GREY_MODES:
        return True
    rgb = np.asarray(img.convert("RGB"))
    return bool((rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all())


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.*") if p.is_file())


def _cuts(folder: Path, count: int, large: bool, seed: int) -> list[bool]:
    """``count`` images from ``cut_images`` saved lossless under folder/class_00; which are
    grey at the source."""
    dest = folder / "class_00"
    dest.mkdir(parents=True)
    grey = []
    for i, (img, source) in enumerate(cut_images(count, large=large, seed=seed)):
        img.save(dest / f"{i:05d}.png", compress_level=1)
        grey.append(_is_grey(source))
    return grey


def photo_sets(work: Path, cfg: dict[str, Any], seed: int = 0,
               log: Callable[[str], None] = lambda _: None) -> list[PhotoSet]:  # fmt: skip
    """Every set of ``cfg``, its photos made anew under work/photos."""
    root = Path(work) / "photos"
    if root.is_dir():
        shutil.rmtree(root)
    natives = make_natives(root / "natives", cfg["natives"], cfg["max_side"])
    files = _files(natives)
    grey_src = [_is_grey(natives / f) for f in files]
    as_l = root / "to_l" / "class_00"
    as_l.mkdir(parents=True)
    for f in files:
        Image.open(natives / f).convert("L").save(as_l / (Path(f).stem + ".png"))
    l_files = _files(as_l.parent)
    n = cfg["crops"]["natives"]
    sets = []
    for side in cfg["sides"]:
        sets.append(
            PhotoSet(str(side), natives, files, grey_src, *resized(natives, files, side), n)
        )
        sets.append(PhotoSet(f"{side} to L", as_l.parent, l_files, [True] * len(l_files),
                             *resized(as_l.parent, l_files, side), n))  # fmt: skip
    for name, large, offset in (("camera", True, 1), ("imagenet", False, 0)):
        if cfg[name]:
            folder = root / name
            grey = _cuts(folder, cfg[name], large, seed + offset)
            cut = _files(folder)
            sets.append(PhotoSet(name, folder, cut, grey, *resized(folder, cut, MAX_JPEG_SIDE),
                                 cfg["crops"][name]))  # fmt: skip
    for s in sets:
        log(f"set {s.name}: {len(s.files)} photos ({sum(s.grey)} grey)")
    return sets


def loader_crop(img: np.ndarray, box: Any, size: int, flip: bool) -> np.ndarray:
    """The loader's resample of ``box`` of uint8 (h, w, C) ``img`` to float64 (size, size, C):
    ``resample_boxes`` in float64 on the box's reach only (the bilinear filter's support is
    max(box / size, 1) pixels either side; pixels beyond it weigh nothing, and the image's
    own borders stay where they are), so a camera-sized record costs what its box costs."""
    h, w = img.shape[:2]
    left, top, right, bottom = (float(v) for v in box)
    sx, sy = max((right - left) / size, 1.0), max((bottom - top) / size, 1.0)
    x0, x1 = max(0, math.floor(left - sx) - 1), min(w, math.ceil(right + sx) + 1)
    y0, y1 = max(0, math.floor(top - sy) - 1), min(h, math.ceil(bottom + sy) + 1)
    part = torch.from_numpy(np.ascontiguousarray(img[y0:y1, x0:x1])).permute(2, 0, 1)[None]
    shifted = torch.tensor([[left - x0, top - y0, right - x0, bottom - y0]], dtype=torch.float64)
    out = resample_boxes(part, shifted, size, torch.tensor([flip]), torch.float64)
    return out[0].permute(1, 2, 0).numpy()


def _psnr(a: np.ndarray, truth: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - truth.astype(np.float64)) ** 2).mean())
    return 99.0 if mse == 0 else 10 * math.log10(255.0**2 / mse)


def measure_set(ps: PhotoSet, quality: int, outs: tuple[int, ...], gaps: tuple[float, ...],
                seed: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """One dict per crop of ``ps`` at ``quality``, per output and kind: its scale and decoded
    pixels under each gap, and where any gap decodes it at 1/2, its two losses (module
    docstring; None elsewhere)."""
    stored, bufs = jpeg_store(ps.images, ps.geos, quality)
    crops = []
    for out in outs:
        for kind in ("train", "eval"):
            c = draw_crops(ps.folder, ps.files, stored, kind, out, ps.crops, seed)
            boxes = to_record(c.boxes, record_geometry(stored, c.idx, (1, 1))).numpy()
            sizes = np.array([stored.records[i].shape[1::-1] for i in c.idx], dtype=np.int64)
            scales = np.stack([exact_scale(sizes, pick_scales(boxes, out, out, gap=g))
                               for g in gaps], 1)  # fmt: skip
            for k, i in enumerate(c.idx):
                (w, h), box, flip = sizes[k], boxes[k], bool(c.flips[k])
                crop = {"set": ps.name, "quality": quality, "out": out, "kind": kind,
                        "file": ps.files[i], "grey": ps.grey[i], "pixels": int(w * h),
                        "bytes_per_pixel": len(bufs[i]) / int(w * h),
                        "decoded": [int(np.prod(scaled_size(w, h, d))) for d in scales[k]],
                        "gap": float(min(box[2] - box[0], box[3] - box[1]) / (2 * out)),
                        "half": [bool(d == 2) for d in scales[k]],
                        "loss_db": None, "full_loss_db": None}  # fmt: skip
                if any(crop["half"]):
                    rec, truth = stored.records[i], c.truths[k]
                    small = decode(bufs[i], int(w), int(h), 3, scale=2, where=ps.files[i])
                    exact = _psnr(pillow_crop(Image.fromarray(rec), box.tolist(), out, flip),
                                  truth)  # fmt: skip
                    half = loader_crop(small, to_decoded(boxes[k : k + 1], np.array([2]))[0],
                                       out, flip)  # fmt: skip
                    crop["loss_db"] = exact - _psnr(half, truth)
                    crop["full_loss_db"] = exact - _psnr(loader_crop(rec, box, out, flip), truth)
                crops.append(crop)
    return crops


def _worst(values: list[float]) -> float | None:
    return max(values) if values else None


def summarise(crops: list[dict[str, Any]], gaps: tuple[float, ...]) -> list[dict[str, Any]]:
    """One row per (set, quality, photos colour or grey, out, gap): crops, how many that gap
    decodes at 1/2, their worst loss and how many miss 0.5 dB, the full decode's (the floor)
    on the same crops, the misses the floor does not explain (``misses``: loss over 0.5 dB
    while the full decode is within it; the worst of them and that crop's full decode loss:
    ``worst_miss_db``, ``worst_miss_full_db``), the record pixels of all crops (``pixels``) and
    the share of them decoded."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for c in crops:
        key = (c["set"], c["quality"], "grey" if c["grey"] else "colour", c["out"])
        groups.setdefault(key, []).append(c)
    rows = []
    for (name, quality, photos, out), group in groups.items():
        pixels = sum(c["pixels"] for c in group)
        for j, gap in enumerate(gaps):
            half = [c for c in group if c["half"][j]]
            loss = [c["loss_db"] for c in half]
            full = [c["full_loss_db"] for c in half]
            missed = [(a, b) for a, b in zip(loss, full) if a > LIMIT_DB >= b]
            worst_miss = max(missed, default=(None, None))
            rows.append({"set": name, "quality": quality, "photos": photos, "out": out,
                         "gap": gap, "crops": len(group), "at_half": len(half),
                         "loss_db": _worst(loss), "over": sum(v > LIMIT_DB for v in loss),
                         "full_loss_db": _worst(full),
                         "full_over": sum(v > LIMIT_DB for v in full),
                         "misses": len(missed),
                         "worst_miss_db": worst_miss[0],
                         "worst_miss_full_db": worst_miss[1],
                         "pixels": pixels,
                         "pixels_decoded": sum(c["decoded"][j] for c in group) / pixels,
                         })  # fmt: skip
    return rows


def _kept(c: dict[str, Any]) -> dict[str, Any]:
    """A crop decoded at 1/2 by some gap, for the JSON: enough to redo any gap above it."""
    keep = ("set", "quality", "out", "kind", "file", "grey", "bytes_per_pixel")
    return {
        **{k: c[k] for k in keep},
        "gap": c["gap"],
        "loss_db": round(c["loss_db"], 4),
        "full_loss_db": round(c["full_loss_db"], 4),
    }


def run_scaled_bench(work: str | Path, *, quick: bool = False, seed: int = 0,
                     gaps: tuple[float, ...] = GAPS, qualities: tuple[int, ...] = QUALITIES,
                     log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:  # fmt: skip
    """Every set x quality x output x crop, measured once, summarised per gap; the JSON-ready
    result with the machine, the load average before and after and the wall time."""
    cfg = QUICK if quick else FULL
    start, load_before = time.perf_counter(), list(os.getloadavg())
    sets = photo_sets(Path(work), cfg, seed, log)
    crops: list[dict[str, Any]] = []
    for ps in sets:
        for q in qualities:
            part = measure_set(ps, q, cfg["outs"], gaps, seed)
            measured = [c["loss_db"] for c in part if c["loss_db"] is not None]
            log(f"{ps.name} q{q}: {len(part)} crops, {len(measured)} at 1/2 (gap {min(gaps)}), "
                f"worst {max(measured, default=float('nan')):+.2f} dB")  # fmt: skip
            crops += part
    return {
        "config": {**{k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
                   "gaps": list(gaps), "qualities": list(qualities), "seed": seed,
                   "limit_db": LIMIT_DB},
        "sets": [{"name": s.name, "photos": len(s.files), "grey": sum(s.grey),
                  "crops_per_photo": s.crops,
                  "record_pixels": float(np.mean([i.width * i.height for i in s.images]))}
                 for s in sets],
        "machine": machine_info(), "simplejpeg": simplejpeg.__version__,
        "load_before": load_before, "load_after": list(os.getloadavg()),
        "seconds": time.perf_counter() - start,
        "rows": summarise(crops, gaps),
        "crops": [_kept(c) for c in crops if c["loss_db"] is not None],
    }  # fmt: skip
