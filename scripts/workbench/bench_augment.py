"""Fidelity of train/eval crops per storage rule and size, against the original photographs.

For each photo set the crops are drawn once: the train boxes (torchvision's
RandomResizedCrop, scale (0.08, 1), ratio (3/4, 4/3), drawn in source pixels in
chunks of ``CHUNK`` crops, each chunk from its own seeded generator, so every
setting whose records show the whole image gets the very same boxes and flips)
and the eval box (Resize(256) + CenterCrop(224) of the source). The truth of a
crop is Pillow ``resize((size, size), BILINEAR, box=...)`` of the ORIGINAL file at
full resolution. Three PSNRs per setting, pooled over all crops (MSE averaged, then
10 log10(255^2 / MSE)):

  vs_original     the reader's path on the stored records against the truth: the
                  pack's own batch (``ds.gather``; a yuv420 canvas converted to RGB by
                  ``imgpack.reader.yuv.canvas_to_rgb``, as the loader's delivery does)
                  through ``DeviceTransform.train``/``.eval`` built on the dataset (the
                  same draws, checked): what training sees;
  exact_vs_orig   Pillow ``resize(box=...)`` on the stored record (``ds[i]``, RGB as a
                  reader gets it) against the truth: the same crop resampler on every
                  row, so this is the column that compares storage rules, FFCV's included;
  vs_exact        the transform against that exact resample (its own error).

FFCV's emulated rows (``bench_storage``) have no transform column.
``bytes`` is the stored pixel bytes per image (``bench_storage`` says what counts).
``visible`` is the mean fraction of the source area the records keep.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image, ImageOps

from imgpack.reader.augment import center_boxes, random_resized_boxes, to_record
from imgpack.reader.augment import geometry as record_geometry
from imgpack.reader.transform import DeviceTransform
from imgpack.reader.yuv import canvas_to_rgb
from workbench.bench_storage import Setting, Stored
from workbench.errors import BenchError
from workbench.sample import make_sample_folder, photo_sources

__all__ = ["SETTINGS", "QUICK", "FULL", "Crops", "make_photos", "make_natives", "draw_crops",
           "pillow_crop", "fidelity"]  # fmt: skip

SCALE, RATIO, CHUNK = (0.08, 1.0), (3 / 4, 4 / 3), 32
TESTED_FILTERS = ("lanczos", "bilinear")
YUV_SIDES = (256, 320, 352, 360, 362, 384)
SETTINGS = [Setting("ffcv", 256, "area")]  # FFCV's rule with its own filter (INTER_AREA)
for _f in TESTED_FILTERS:
    SETTINGS += [
        Setting("ffcv", 256, _f),  # FFCV's rule with the same filter as the rows below
        Setting("stretch", 224, _f),
        Setting("stretch", 225, _f),
        Setting("fit", 256, _f),
        *(Setting("fit", s, _f, "yuv420") for s in YUV_SIDES),
    ]
IMAGENET = 1_281_167  # ImageNet-1k training images: GB of pixels = bytes/img * this / 1e9
QUICK = {"sets": {"natives": {"count": 2, "max_side": 96}, "cuts": {"normal": 2, "large": 0}},
         "crops": 2, "train_size": 32, "eval_size": 32,
         "settings": [Setting("ffcv", 64, "area"), Setting("ffcv", 64, "bilinear"),
                      Setting("stretch", 48, "bilinear"), Setting("center-crop", 48, "bilinear"),
                      Setting("fit", 64, "bilinear"),
                      Setting("fit", 72, "bilinear", "yuv420")]}  # fmt: skip
FULL = {"sets": {"natives": {"count": None, "max_side": None, "crops": 16},
                 "cuts": {"normal": 184, "large": 16}},
        "crops": 2, "train_size": 224, "eval_size": 224, "settings": SETTINGS}  # fmt: skip


def make_photos(root: str | os.PathLike, normal: int, large: int, seed: int = 0) -> Path:
    """ImageNet-sized JPEGs (about 400x350) cut from the photographs, plus camera-sized ones
    (short side >= 2000)."""
    root = Path(root)
    make_sample_folder(root, classes=1, per_class=normal, seed=seed)
    if large:
        big = make_sample_folder(root.parent / (root.name + "_large"), classes=1, per_class=large,
                                 large=True, seed=seed + 1)  # fmt: skip
        shutil.move(str(big / "class_00"), str(root / "class_large"))
        shutil.rmtree(big)
    return root


def make_natives(root: str | os.PathLike, count: int | None, max_side: int | None) -> Path:
    """The distinct photographs installed packages carry, each once, as shipped (or shrunk to
    ``max_side``, saved as PNG, for a quick run)."""
    folder = Path(root) / "class_00"
    folder.mkdir(parents=True, exist_ok=True)
    sources = photo_sources()[:count]
    if not sources:
        raise BenchError("no photographs installed (scikit-image's data, matplotlib's sample_data)")
    for src in sources:
        if max_side is None:
            shutil.copy(src, folder / src.name)
        else:
            img = Image.open(src).convert("RGB")
            img.thumbnail((max_side, max_side), Image.LANCZOS)
            img.save(folder / (src.stem + ".png"))
    return Path(root)


class Crops(NamedTuple):
    """Crops shared by every setting that shows the same part of each source."""

    kind: str  # "train" or "eval"
    size: int
    idx: np.ndarray  # (M,) image of each crop
    boxes: torch.Tensor  # float64 (M, 4), source pixels
    flips: torch.Tensor  # bool (M,)
    seeds: list[int]  # generator seed of each CHUNK-crop chunk (train)
    truths: np.ndarray  # uint8 (M, size, size, 3): the same crop of the original file


def _original(folder: Path, name: str) -> Image.Image:
    return ImageOps.exif_transpose(Image.open(folder / name)).convert("RGB")


def pillow_crop(img: Image.Image, box, size: int, flip: bool) -> np.ndarray:
    """The reference resample: Pillow's antialiased bilinear of ``box`` to size x size."""
    out = np.asarray(img.resize((size, size), Image.BILINEAR, box=tuple(float(v) for v in box)))
    return out[:, ::-1] if flip else out


def draw_crops(folder: Path, files: list[str], stored: Stored, kind: str, size: int, crops: int,
               seed: int = 0) -> Crops:  # fmt: skip
    """The boxes the transform draws on ``stored``'s geometry, and the truth of each."""
    reps = crops if kind == "train" else 1
    idx = np.repeat(np.arange(len(files)), reps)
    sizes = torch.from_numpy(stored.source_sizes[idx].astype(np.float64))
    visible = torch.from_numpy(stored.source_boxes[idx].astype(np.float64))
    boxes, flips, seeds = [], [], []
    for c, start in enumerate(range(0, len(idx), CHUNK)):
        part = slice(start, start + CHUNK)
        if kind == "train":
            seeds.append(seed * 100_003 + c)
            gen = torch.Generator().manual_seed(seeds[-1])
            boxes.append(random_resized_boxes(visible[part], SCALE, RATIO, gen))
            flips.append(torch.rand(len(boxes[-1]), generator=gen) < 0.5)
        else:
            boxes.append(center_boxes(sizes[part], visible[part], size, 0.875))
            flips.append(torch.zeros(len(boxes[-1]), dtype=torch.bool))
    boxes_t, flips_t = torch.cat(boxes), torch.cat(flips)
    truths = np.empty((len(idx), size, size, 3), dtype=np.uint8)
    img, last = None, None
    for k, i in enumerate(idx):
        if i != last:
            img, last = _original(folder, files[i]), i
        truths[k] = pillow_crop(img, boxes_t[k].tolist(), size, bool(flips_t[k]))
    return Crops(kind, size, idx, boxes_t, flips_t, seeds, truths)


def _levels(out: torch.Tensor, mean, std) -> np.ndarray:
    m = torch.tensor(mean, dtype=torch.float64).view(1, -1, 1, 1) * 255
    s = torch.tensor(std, dtype=torch.float64).view(1, -1, 1, 1) * 255
    return (out.double() * s + m).permute(0, 2, 3, 1).numpy()


def _psnr(mse: list[float]) -> float:
    m = float(np.mean(mse))
    return 99.0 if m == 0 else 10 * math.log10(255.0**2 / m)


def _transformed(stored: Stored, crops: Crops):
    """The transform's output (0..255 float64, (n, size, size, 3)) chunk by chunk, or None."""
    return None if stored.pack is None else _chunks(stored, crops)


def _chunks(stored: Stored, crops: Crops):
    for c, start in enumerate(range(0, len(crops.idx), CHUNK)):
        part = slice(start, start + CHUNK)
        idx = crops.idx[part]
        images, rec = _batch(stored, idx)
        if crops.kind == "train":
            gen = torch.Generator().manual_seed(crops.seeds[c])
            t = DeviceTransform.train(stored.pack, crops.size, SCALE, RATIO, dtype=torch.float64,
                                      generator=gen)  # fmt: skip
        else:
            t = DeviceTransform.eval(stored.pack, crops.size, dtype=torch.float64)
        out = t(images, rec)
        if not torch.equal(t.last_params["boxes"], crops.boxes[part]):
            raise BenchError(f"the transform drew other boxes than the shared draw (chunk {c})")
        yield _levels(out, stored.mean, stored.std)


def _batch(stored: Stored, idx: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    """The reader's own batch of these records, RGB uint8 (B, C, H, W) (a yuv420 canvas back
    to RGB as the loader's delivery does it), and their indices in the pack."""
    ds, rec = stored.pack, stored.index[idx]
    images = ds.gather(rec)[0]
    if ds.codec == "yuv420":
        h, w, _ = ds.shape
        images = canvas_to_rgb(images, (h, w), sizes=ds.record_sizes[rec])
    return images, rec


def fidelity(stored: Stored, crops: Crops) -> dict[str, float | None]:
    """The three PSNRs of ``crops`` on ``stored``'s records."""
    rec_boxes = to_record(crops.boxes, record_geometry(stored, crops.idx, (1, 1)))
    err: dict[str, list[float]] = {"vs_original": [], "exact_vs_orig": [], "vs_exact": []}
    outs = _transformed(stored, crops)
    chunk: np.ndarray | None = None
    for k, i in enumerate(crops.idx):
        if outs is not None and k % CHUNK == 0:
            chunk = next(outs)
        truth = crops.truths[k].astype(np.float64)
        exact = pillow_crop(Image.fromarray(stored.records[i]), rec_boxes[k].tolist(),
                            crops.size, bool(crops.flips[k])).astype(np.float64)  # fmt: skip
        err["exact_vs_orig"].append(((exact - truth) ** 2).mean())
        if chunk is not None:
            out = chunk[k % CHUNK]
            err["vs_original"].append(((out - truth) ** 2).mean())
            err["vs_exact"].append(((out - exact) ** 2).mean())
    return {name: (_psnr(v) if v else None) for name, v in err.items()}


def label(side: Any) -> str:
    """256, or 256x192 for a (width, height) record size."""
    return str(side) if isinstance(side, int) else f"{side[0]}x{side[1]}"
