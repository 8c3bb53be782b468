"""Fidelity of train/eval crops per storage mode and size, against the original photographs.

For each image and each storage setting the same crops are taken: the train
boxes (RandomResizedCrop, drawn in source pixels with one seed, so every
setting whose records show the whole image gets the very same boxes) and the
eval box (Resize(256) + CenterCrop(224) of the source). Three PSNRs per setting,
pooled over all crops (MSE averaged, then 10 log10(255^2 / MSE)):

  vs_original     imgpack's DeviceTransform output against Pillow
                  ``resize(box=...)`` of the ORIGINAL file at full resolution:
                  what training sees compared with the truth;
  exact_vs_orig   Pillow ``resize(box=...)`` on the stored record (the exact
                  resample of what is stored) against the same truth;
  vs_exact        the transform against that exact resample (the transform's own error).

FFCV's storage rule (aspect kept, longer side 256, raw pixels: ``resizer`` in
its ``rgb_image`` field, sizes truncated, OpenCV INTER_AREA) is emulated with
Pillow's BOX filter (area averaging); its crops are Pillow ``resize(box=...)``
of that stored image, i.e. an exact bilinear resample, which flatters FFCV
slightly (its own decoder resizes integer crops with OpenCV).
``bytes`` is the pixel bytes per record (W*H*3; FFCV: the mean over images,
its metadata and alignment not counted); ``file_bytes`` the .bin size / N.
``visible`` is the mean fraction of the source area the records keep:
center-crop packs lose the sides, so their train crops come from the centre
only; that cost shows here, not in the PSNR.

Record geometry is the pack's own (format v2: ``ds.source_sizes``,
``ds.source_boxes``, ``ds.content_boxes``), as training would use it.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps

from imgpack.packer.pack import pack_folder
from imgpack.packer.settings import FILTERS
from imgpack.reader.augment import center_boxes, random_resized_boxes, to_record
from imgpack.reader.augment import geometry as record_geometry
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.gpu import DeviceTransform
from workbench.errors import BenchError
from workbench.sample import make_sample_folder

__all__ = ["SETTINGS", "QUICK", "make_photos", "storage_geometry", "fidelity", "markdown"]

# (mode, record side or (w, h), storage filter); "ffcv" is FFCV's rule, its filter "area"
SETTINGS = [
    ("center-crop", 224, "bilinear"),
    ("stretch", 224, "bilinear"),
    ("stretch", 232, "bilinear"),  # about FFCV's bytes per image on these photos
    ("stretch", 256, "bilinear"),
    ("stretch", (256, 192), "bilinear"),  # FFCV's shape for a 4:3 landscape, for every image
    ("stretch", 320, "bilinear"),
    ("stretch", 224, "lanczos"),
    ("stretch", 232, "lanczos"),
    ("stretch", 256, "lanczos"),
    ("pad", 224, "bilinear"),
    ("pad", 256, "bilinear"),
    ("pad", 320, "bilinear"),
    ("ffcv", 256, "area"),
    ("ffcv", 256, "lanczos"),  # what-if: FFCV's rule with a sharper filter than its own
]
IMAGENET = 1_281_167  # ImageNet-1k training images: GB of pixels = bytes/img * this / 1e9
QUICK = {"normal": 4, "large": 1, "crops": 2, "settings": [("center-crop", 224, "bilinear"),
         ("stretch", 64, "bilinear"), ("pad", 64, "bilinear"), ("ffcv", 64, "area")],
         "train_size": 48, "eval_size": 48}  # fmt: skip
FULL = {"normal": 40, "large": 8, "crops": 8, "settings": SETTINGS, "train_size": 224,
        "eval_size": 224}  # fmt: skip


def make_photos(root: str | os.PathLike, normal: int, large: int, seed: int = 0) -> Path:
    """ImageNet-sized JPEGs (about 400x350) plus camera-sized ones (short side >= 2000)."""
    root = Path(root)
    make_sample_folder(root, classes=1, per_class=normal, seed=seed)
    if large:
        big = make_sample_folder(root.parent / (root.name + "_large"), classes=1, per_class=large,
                                 large=True, seed=seed + 1)  # fmt: skip
        shutil.move(str(big / "class_00"), str(root / "class_large"))
        shutil.rmtree(big)
    return root


class _Geo:
    """A dataset's records plus per-record geometry (the v2 attributes)."""

    def __init__(self, records, sizes, sboxes, cboxes, mean, std):
        self.records, self.mean, self.std = records, mean, std
        self.source_sizes = np.asarray(sizes, dtype=np.int64)
        self.source_boxes = np.asarray(sboxes, dtype=np.float32)
        self.content_boxes = np.asarray(cboxes, dtype=np.float32)

    def __len__(self) -> int:
        return len(self.records)


def storage_geometry(
    folder: Path,
    files: list[str],
    mode: str,
    side: int | tuple[int, int],
    work: Path,
    filter: str = "bilinear",
) -> tuple[_Geo, float, float]:
    """Records of ``files`` stored by ``mode`` at ``side`` (or (w, h)), with their geometry;
    pixel bytes per record; file bytes per record (the .bin / N: pixels plus per-record
    sections plus the header, which a small sample spreads over few records)."""
    if mode == "ffcv":
        recs, sizes, sbox, cbox = [], [], [], []
        for f in files:
            img = ImageOps.exif_transpose(Image.open(folder / f)).convert("RGB")
            w, h = img.size
            k = min(1.0, side / max(w, h))
            rw, rh = max(1, int(w * k)), max(1, int(h * k))  # FFCV's astype(int)
            how = Image.BOX if filter == "area" else FILTERS[filter]  # BOX: area averaging
            recs.append(np.asarray(img.resize((rw, rh), how)))
            sizes.append((w, h))
            sbox.append((0, 0, w, h))
            cbox.append((0, 0, rw, rh))
        nbytes = float(np.mean([r.size for r in recs]))
        return _Geo(recs, sizes, sbox, cbox, (0.5,) * 3, (0.25,) * 3), nbytes, nbytes
    rw, rh = (side, side) if isinstance(side, int) else side
    out = work / f"{mode}-{rw}x{rh}-{filter}.bin"
    pack_folder(folder, out, size=(rw, rh), resize=mode, filter=filter, force=True,
                progress=False, workers=1)  # fmt: skip
    ds = PackedImageDataset(out)
    order = {ds.source_path(i): i for i in range(len(ds))}
    idx = [order[f] for f in files]
    images, _ = ds.gather(idx)
    recs = list(images.permute(0, 2, 3, 1).numpy())
    g = record_geometry(ds, idx, (rh, rw))  # the pack's own (format v2) geometry
    sizes, sbox, cbox = g.source_sizes.numpy(), g.source_boxes.numpy(), g.content_boxes.numpy()
    return (
        _Geo(recs, sizes, sbox, cbox, ds.mean, ds.std),
        recs[0].size,
        out.stat().st_size / len(ds),
    )


def _pillow(img: Image.Image, box, size: int, flip: bool) -> np.ndarray:
    out = img.resize((size, size), Image.BILINEAR, box=tuple(float(v) for v in box))
    arr = np.asarray(out, dtype=np.float64)
    return arr[:, ::-1] if flip else arr


def _levels(out: torch.Tensor, mean, std) -> np.ndarray:
    m = torch.tensor(mean, dtype=torch.float64).view(1, -1, 1, 1) * 255
    s = torch.tensor(std, dtype=torch.float64).view(1, -1, 1, 1) * 255
    return (out.double() * s + m).permute(0, 2, 3, 1).numpy()


def _psnr(mse: list[float]) -> float:
    m = float(np.mean(mse))
    return 99.0 if m == 0 else 10 * math.log10(255.0**2 / m)


def fidelity(
    folder: Path, geo: _Geo, files: list[str], kind: str, size: int, crops: int, seed: int = 0
) -> dict[str, float]:
    """The three PSNRs for ``crops`` train boxes per image, or the one eval box (``kind``)."""
    n = len(files)
    reps = crops if kind == "train" else 1
    idx = np.repeat(np.arange(n), reps)
    sizes = torch.from_numpy(geo.source_sizes[idx].astype(np.float64))
    whole = torch.cat([torch.zeros(len(idx), 2, dtype=torch.float64), sizes], 1)
    if kind == "train":  # the same boxes for every setting that shows the whole source
        seen = torch.from_numpy(geo.source_boxes[idx].astype(np.float64))
        t = DeviceTransform.train(geo, size=size, dtype=torch.float64,
                                  generator=torch.Generator().manual_seed(seed))  # fmt: skip
        check = None
        if torch.equal(seen, whole):
            check = random_resized_boxes(
                whole, t.scale, t.ratio, torch.Generator().manual_seed(seed)
            )
    else:
        t = DeviceTransform.eval(geo, size=size, dtype=torch.float64)
        check = center_boxes(sizes, whole, size, 0.875)
    images = torch.from_numpy(np.stack([geo.records[i] for i in idx])) if _same_shape(geo) else None
    if images is not None:
        out = _levels(t(images.permute(0, 3, 1, 2), idx), geo.mean, geo.std)
        boxes, flips = t.last_params["boxes"], t.last_params["flip"]
        if check is not None and kind == "train" and not torch.equal(boxes, check):
            raise BenchError("the transform drew other boxes than the shared draw")
    else:  # FFCV's records differ in size: the same draws as the transform, resampled exactly
        gen = torch.Generator().manual_seed(seed)
        if kind == "train":
            boxes = random_resized_boxes(whole, t.scale, t.ratio, gen)
            flips = torch.rand(len(idx), generator=gen) < 0.5
        else:
            boxes, flips = check, torch.zeros(len(idx), dtype=torch.bool)
        out = None
    rec_boxes = to_record(boxes, record_geometry(geo, idx, (1, 1)))
    originals: dict[int, Image.Image] = {}
    err = {"vs_original": [], "exact_vs_orig": [], "vs_exact": []}
    for k, i in enumerate(idx):
        if i not in originals:
            originals.clear()
            originals[i] = ImageOps.exif_transpose(Image.open(folder / files[i])).convert("RGB")
        truth = _pillow(originals[i], boxes[k].tolist(), size, bool(flips[k]))
        exact = _pillow(
            Image.fromarray(geo.records[i]), rec_boxes[k].tolist(), size, bool(flips[k])
        )
        err["exact_vs_orig"].append(((exact - truth) ** 2).mean())
        if out is not None:
            err["vs_original"].append(((out[k] - truth) ** 2).mean())
            err["vs_exact"].append(((out[k] - exact) ** 2).mean())
    return {name: (_psnr(v) if v else None) for name, v in err.items()}


def _same_shape(geo: _Geo) -> bool:
    return len({r.shape for r in geo.records}) == 1


def label(side: int | list[int] | tuple[int, int]) -> str:
    """256, or 256x192 for a (width, height) record size."""
    return str(side) if isinstance(side, int) else f"{side[0]}x{side[1]}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """One table: setting, bytes/record, visible area, train and eval PSNRs."""

    def f(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    head = ("| storage | bytes/img | ImageNet-1k GB | visible | train vs orig | train exact "
            "| train vs exact | eval vs orig | eval exact | eval vs exact |")  # fmt: skip
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        t, e = r["train"], r["eval"]
        lines.append(
            f"| {r['mode']} {label(r['side'])} {r['filter']} | {r['bytes']:,.0f} "
            f"| {r['bytes'] * IMAGENET / 1e9:,.0f} "
            f"| {r['visible']:.2f} "
            f"| {f(t['vs_original'])} | {f(t['exact_vs_orig'])} | {f(t['vs_exact'])} "
            f"| {f(e['vs_original'])} | {f(e['exact_vs_orig'])} | {f(e['vs_exact'])} |"
        )
    return "\n".join(lines)
