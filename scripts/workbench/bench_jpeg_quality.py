"""Bytes per image and PSNR against the original photographs for JPEG records (issue 20, table a).

One photo set, one draw of crops: a RandomResizedCrop box per photo (scale (0.08, 1),
ratio (3/4, 4/3), seeded) and the eval box (Resize(size / 0.875) + CenterCrop), drawn in
source pixels by ``bench_augment.draw_crops`` and used on every row; the truth of a crop
is Pillow's bilinear resample of that box of the ORIGINAL file (``pillow_crop``). Each
row's PSNR is the same resample of the same box on the row's stored record (decoded as
the reader gets it), pooled over crops (mean MSE, then dB), so rows differ only in
what was stored.

  ffcv     FFCV's raw rule (``bench_storage``: aspect kept, longer side S truncated,
           raw RGB, same bilinear filter): the reference row;
  jpeg     the packer's ``--resize fit --size S`` record (``decode_record``: bilinear,
           draft for large JPEGs), encoded by Pillow at quality Q (baseline, 4:2:0,
           not optimised), decoded back at full size. Every record is re-encoded, a
           second generation for a photo that needs no resize (the photos are q90 JPEGs);
  as-is    what the packer stores: those photos kept byte for byte, the rest at q90.

``scaled`` rows decode each record at ``pick_scale(box, out, gap=margin, scales=SCALES)``
(margin m: the largest DCT scale, 1/8 included, whose output still covers the box at m
times the output size; m = 1 is the issue's wording), and one more row per set is the
reader's own rule (``rule``: ``jpeg.GAP``, at most 1/2, ``jpeg.PICK_SCALES``); map the
box into the decoded pixels (divided by the scale) and resample it; beside them the same
crops from the full decode, FFCV's rule on the same crops, and how many crops each scale
took. The last of them are the camera-sized photos
stored as they came, where the boxes are many times the output.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from imgpack.packer.decode import decode_record
from imgpack.packer.jpeg import MAX_JPEG_SIDE
from imgpack.packer.passthrough import stored_as_is
from imgpack.packer.settings import DecodeSettings
from imgpack.reader.augment import geometry as record_geometry
from imgpack.reader.augment import to_record
from imgpack.reader.jpeg import GAP, SCALES, decode, exact_scale, pick_scales, scaled_size
from workbench.bench_augment import Crops, draw_crops, fidelity, pillow_crop
from workbench.bench_storage import Setting, Stored, store
from workbench.errors import BenchError
from workbench.jpeg_decoders import encode, plain_decode, to_decoded

__all__ = ["QUICK", "FULL", "IMAGENET", "as_is", "resized", "jpeg_store", "quality_rows",
           "scaled_psnr", "scaled_rows"]  # fmt: skip

IMAGENET = 1_281_167  # ImageNet-1k training images: GB = bytes/image * this / 1e9
FULL = {"normal": 184, "large": 16, "sides": (256, 384, 512), "qualities": (75, 90, 95),
        "size": 224, "scaled_sizes": (224, 160, 112), "margins": (1.0, 2.0, 3.0, 4.0),
        "own_crops": 8, "ffcv_side": 256, "subsampling_at": (384, 90)}  # fmt: skip
QUICK = {"normal": 3, "large": 1, "sides": (64, 96), "qualities": (75, 90), "size": 32,
         "scaled_sizes": (32, 16), "margins": (1.0, 3.0), "own_crops": 2, "ffcv_side": 64,
         "subsampling_at": (96, 90)}  # fmt: skip


def as_is(path: Path, side: int) -> bytes | None:
    """The source's own bytes where the packer stores them as they came in a ``--resize fit
    --size side --codec jpeg`` pack (``imgpack.packer.passthrough``), else None."""
    settings = DecodeSettings(side, side, resize="fit", filter="bilinear", codec="jpeg")
    kept = stored_as_is(path, settings)
    return None if kept is None else kept[0]


def resized(folder: Path, files: list[str], side: int) -> tuple[list[Image.Image], list[Any]]:
    """The packer's ``--resize fit --size side`` record of each file, and its geometry."""
    settings = DecodeSettings(side, side, resize="fit", filter="bilinear")
    images, geos = [], []
    for f in files:
        out = decode_record(folder / f, settings)
        if isinstance(out, str):
            raise BenchError(f"{f}: {out}")
        images.append(out[0])
        geos.append(out[1])
    return images, geos


def jpeg_store(images: list[Image.Image], geos: list[Any], quality: int,
               subsampling: str = "4:2:0", own: list[bytes | None] | None = None,
               ) -> tuple[Stored, list[bytes]]:  # fmt: skip
    """The records encoded at ``quality`` (or, where ``own`` has them, the source's own
    bytes) and decoded back, as a ``Stored``, and their bytes."""
    own = own or [None] * len(images)
    bufs = [o if o is not None else encode(img, quality, subsampling)
            for img, o in zip(images, own)]  # fmt: skip
    stored = Stored(
        [plain_decode(b) for b in bufs],
        np.asarray([g.source_size for g in geos], dtype=np.int64),
        np.asarray([g.source_box for g in geos], dtype=np.float32),
        np.asarray([g.content_box for g in geos], dtype=np.float32),
        float(np.mean([len(b) for b in bufs])), None, "encoded",
    )  # fmt: skip
    return stored, bufs


def _row(kind: str, side: int, quality: int | None, subsampling: str | None, stored: Stored,
         train: Crops, evals: Crops, kept: int = 0) -> dict[str, Any]:  # fmt: skip
    return {"storage": kind, "side": side, "quality": quality, "subsampling": subsampling,
            "as_is": kept, "bytes": stored.bytes, "imagenet_gb": stored.bytes * IMAGENET / 1e9,
            "train_psnr": fidelity(stored, train)["exact_vs_orig"],
            "eval_psnr": fidelity(stored, evals)["exact_vs_orig"]}  # fmt: skip


def quality_rows(folder: Path, files: list[str], cfg: dict[str, Any], work: Path, seed: int = 0,
                 log=lambda _: None) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """Table (a): FFCV's raw rule, every side x quality re-encoded, the packer's own rows
    (sources kept as they came, the rest at quality 90) and 4:4:4 at one setting.

    Also returns what the scale-aware rows need: the reference ``Stored`` (its geometry
    draws the crops), the crops, and the resized records per side."""
    ref = store(folder, files, Setting("ffcv", cfg["ffcv_side"], "bilinear"), work)
    size = cfg["size"]
    train = draw_crops(folder, files, ref, "train", size, 1, seed)
    evals = draw_crops(folder, files, ref, "eval", size, 1, seed)
    rows = [_row("ffcv raw", cfg["ffcv_side"], None, None, ref, train, evals)]
    log(f"ffcv raw {cfg['ffcv_side']}: {ref.bytes:,.0f} B, train {rows[0]['train_psnr']:.2f} dB")
    per_side = {}
    for side in cfg["sides"]:
        images, geos = per_side[side] = resized(folder, files, side)
        for q in cfg["qualities"]:
            stored, _ = jpeg_store(images, geos, q)
            rows.append(_row("jpeg", side, q, "4:2:0", stored, train, evals))
            log(f"jpeg {side} q{q}: {stored.bytes:,.0f} B, train {rows[-1]['train_psnr']:.2f} dB")
        own = [as_is(folder / f, side) for f in files]
        kept = sum(o is not None for o in own)
        if kept:
            stored, _ = jpeg_store(images, geos, 90, own=own)
            rows.append(_row("jpeg as-is", side, 90, "4:2:0", stored, train, evals, kept))
            log(f"jpeg {side} as-is ({kept}): {stored.bytes:,.0f} B, "
                f"train {rows[-1]['train_psnr']:.2f} dB")  # fmt: skip
    side, q = cfg["subsampling_at"]
    stored, _ = jpeg_store(*per_side[side], q, "4:4:4")
    rows.append(_row("jpeg", side, q, "4:4:4", stored, train, evals))
    ffcv = rows[0]
    for r in rows:
        r["bytes_vs_ffcv"] = r["bytes"] / ffcv["bytes"]
        r["train_gain_db"] = r["train_psnr"] - ffcv["train_psnr"]
        r["eval_gain_db"] = r["eval_psnr"] - ffcv["eval_psnr"]
    state = {"ref": ref, "per_side": per_side, "crops": {size: (train, evals)}, "work": work}
    return rows, state


def _psnr(mse: list[float]) -> float:
    m = float(np.mean(mse))
    return 99.0 if m == 0 else 10 * math.log10(255.0**2 / m)


def _err(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())


def scaled_psnr(stored: Stored, bufs: list[bytes], crops: Crops,
                margins: tuple[float, ...] = (1.0,)) -> list[dict[str, Any]]:  # fmt: skip
    """Per margin m, then the reader's rule ("rule"): the crops decoded at ``pick_scale(box,
    out, gap=m, scales=SCALES)`` (the rule: ``pick_scales``'s defaults), lowered by
    ``exact_scale`` as the loader does, their PSNR, the full decode's, and the DCT-scaled
    pixels against Pillow's ``reduce(d)`` (a d x d box average) of the full decode."""
    rec_boxes = to_record(crops.boxes, record_geometry(stored, crops.idx, (1, 1))).numpy()
    n = crops.size
    sizes = np.array([stored.records[i].shape[1::-1] for i in crops.idx], dtype=np.int64)
    picks = {m: exact_scale(sizes, pick_scales(rec_boxes, n, n, gap=m, scales=SCALES))
             for m in margins}  # fmt: skip
    picks["rule"] = exact_scale(sizes, pick_scales(rec_boxes, n, n))
    margins = (*margins, "rule")
    err: dict[Any, list[float]] = {"full": []}
    for m in margins:
        err[m], err[("vs_full", m)], err[("dct", m)] = [], [], []
    for k, i in enumerate(crops.idx):
        truth, flip, rec = crops.truths[k], bool(crops.flips[k]), stored.records[i]
        full = pillow_crop(Image.fromarray(rec), rec_boxes[k].tolist(), n, flip)
        err["full"].append(_err(full, truth))
        h, w = rec.shape[:2]
        decoded: dict[int, tuple[np.ndarray, float | None]] = {1: (full, None)}
        for m in margins:
            d = int(picks[m][k])
            if d not in decoded:
                small = decode(bufs[i], w, h, 3, scale=d, where=f"record {i}")
                if small.shape[:2] != tuple(scaled_size(w, h, d))[::-1]:
                    raise BenchError(f"record {i} at 1/{d} is {small.shape[:2]}, from {w}x{h}")
                box = to_decoded(rec_boxes[k : k + 1], np.array([d]))[0]
                decoded[d] = (pillow_crop(Image.fromarray(small), box.tolist(), n, flip),
                              _err(small, np.asarray(Image.fromarray(rec).reduce(d))))  # fmt: skip
            out, dct = decoded[d]
            err[m].append(_err(out, truth))
            err[("vs_full", m)].append(_err(out, full))
            if dct is not None:
                err[("dct", m)].append(dct)
    rows = []
    for m in margins:
        s, dct = picks[m], err[("dct", m)]
        share = float(np.mean(1.0 / s.astype(np.float64) ** 2))
        rows.append({"margin": GAP if m == "rule" else m, "rule": m == "rule",
                     "crops": len(s), "full": _psnr(err["full"]),
                     "scaled": _psnr(err[m]), "scaled_vs_full": _psnr(err[("vs_full", m)]),
                     "dct_vs_box": _psnr(dct) if dct else None,
                     "scales": {str(d): int((s == d).sum()) for d in SCALES},
                     "pixels_decoded": share})  # fmt: skip
        rows[-1]["loss_db"] = rows[-1]["full"] - rows[-1]["scaled"]
    return rows


def _camera(folder: Path, files: list[str], cfg: dict[str, Any], work: Path, seed: int):
    """The camera-sized photos stored as they came (``--resize fit`` at a size they fit),
    their bytes, FFCV's rule on them, and ``own_crops`` train crops per photo per size."""
    sub = [f for f in files if f.startswith("class_large")]
    if not sub:
        return None
    images, geos = resized(folder, sub, MAX_JPEG_SIDE)
    own = [as_is(folder / f, MAX_JPEG_SIDE) for f in sub]
    if any(o is None for o in own):
        raise BenchError("a camera-sized photo would not be stored as it came")
    stored, bufs = jpeg_store(images, geos, 90, own=own)
    ref = store(folder, sub, Setting("ffcv", cfg["ffcv_side"], "bilinear"), work)
    crops = {n: (draw_crops(folder, sub, ref, "train", n, cfg["own_crops"], seed),
                 draw_crops(folder, sub, ref, "eval", n, 1, seed))
             for n in cfg["scaled_sizes"]}  # fmt: skip
    return stored, bufs, ref, crops


def scaled_rows(folder: Path, files: list[str], cfg: dict[str, Any], state: dict[str, Any],
                seed: int = 0, log=lambda _: None) -> list[dict[str, Any]]:  # fmt: skip
    """The scale-aware decode at quality 90 (or the config's first): each side, output size,
    train and eval crops, and margin; then the camera-sized photos stored as they came
    (side "as-is"). Each row has FFCV's raw rule's PSNR on the same crops beside it."""
    q = 90 if 90 in cfg["qualities"] else cfg["qualities"][0]
    sets = []
    for size in cfg["scaled_sizes"]:
        if size not in state["crops"]:
            state["crops"][size] = tuple(
                draw_crops(folder, files, state["ref"], kind, size, 1, seed)
                for kind in ("train", "eval")
            )
    for side in cfg["sides"]:
        sets.append((side, q, *jpeg_store(*state["per_side"][side], q), state["ref"],
                     state["crops"]))  # fmt: skip
    camera = _camera(folder, files, cfg, state["work"], seed)
    if camera is not None:
        sets.append(("as-is", None, *camera))
    rows = []
    for side, quality, stored, bufs, ref, crops in sets:
        for size in cfg["scaled_sizes"]:
            for kind, c in zip(("train", "eval"), crops[size]):
                ffcv = fidelity(ref, c)["exact_vs_orig"]
                for r in scaled_psnr(stored, bufs, c, cfg["margins"]):
                    rows.append({"side": side, "quality": quality, "size": size, "kind": kind,
                                 "record_pixels": float(np.mean([a.shape[0] * a.shape[1]
                                                                 for a in stored.records])),
                                 "ffcv_psnr": ffcv, **r})  # fmt: skip
                    log(f"scaled {side} -> {size} {kind} x{r['margin']}: {r['scales']}, "
                        f"{r['full']:.2f} / {r['scaled']:.2f} dB (FFCV {ffcv:.2f})")  # fmt: skip
    return rows
