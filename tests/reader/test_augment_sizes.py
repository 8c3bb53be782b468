"""Records smaller than the batch canvas: the resample stops at each record's own edge.

Pillow's ``resize(box=...)`` of the record alone is the reference; the canvas around the
records is filled with white here (a loader's canvas is zero there), so a tap that
reached into it would show. Same tolerance as test_augment.py: at most one level after
rounding, PSNR above 50 dB.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import photo_like
from PIL import Image
from test_augment import MEAN, STD, pillow, to_levels

from imgpack.reader.resample import resample_boxes
from imgpack.reader.transform import DeviceTransform

SIZES = [(40, 30), (17, 33), (40, 40), (9, 12), (31, 40), (40, 7)]  # (w, h) within 40 x 40


def canvas(records, bound=(40, 40), fill=255):
    """(B, C, H, W) uint8 with each record at the top-left of its slot, ``fill`` beyond."""
    h, w = bound
    out = np.full((len(records), h, w, records[0].shape[-1]), fill, dtype=np.uint8)
    for k, r in enumerate(records):
        out[k, : r.shape[0], : r.shape[1]] = r
    return torch.from_numpy(out).permute(0, 3, 1, 2)


def boxes_inside(sizes, rng):
    """One box per record, inside it; every other one touches the record's right/bottom edge."""
    out = []
    for k, (w, h) in enumerate(sizes):
        x0, y0 = rng.uniform(0, w * 0.5), rng.uniform(0, h * 0.5)
        x1 = w if k % 2 == 0 else rng.uniform(x0 + 1, w)
        y1 = h if k % 2 == 0 else rng.uniform(y0 + 1, h)
        out.append([x0, y0, x1, y1])
    return torch.tensor(out, dtype=torch.float64)


def psnr(mse):
    return 10 * math.log10(255**2 / max(float(np.mean(mse)), 1e-12))


@pytest.mark.parametrize("size", [6, 24, 64])  # shrink, about 1:1, enlarge
def test_resample_boxes_with_extent_is_pillow_on_the_record_alone(size):
    rng = np.random.default_rng(size)
    records = [photo_like(w, h, seed=k) for k, (w, h) in enumerate(SIZES)]
    boxes = boxes_inside(SIZES, rng)
    flip = torch.tensor([k % 3 == 0 for k in range(len(SIZES))])
    extent = torch.tensor(SIZES)
    out = resample_boxes(canvas(records), boxes, size, flip, torch.float64, extent=extent)
    got = out.permute(0, 2, 3, 1).numpy()
    worst, mse = 0.0, []
    for k, rec in enumerate(records):
        ref = pillow(rec, boxes[k].tolist(), size, bool(flip[k]))
        worst = max(worst, float(np.abs(np.round(got[k]) - ref).max()))
        mse.append(((got[k] - ref) ** 2).mean())
    assert worst <= 1.0 and psnr(mse) > 50
    # with the canvas's extent the white padding leaks into every sample that touches an edge
    whole = torch.tensor([(40, 40)] * len(records))  # (W, H) of the canvas
    leak = resample_boxes(canvas(records), boxes, size, flip, torch.float64, extent=whole)
    assert not torch.allclose(leak, out, atol=2)


class Varying:
    """A stand-in of a pack of records of several sizes in a 40 x 40 bound (geometry: each
    record is its whole source, a 4x larger photograph, as a ``fit`` pack stores it)."""

    shape = (40, 40, 3)

    def __init__(self):
        self.records = [photo_like(w, h, seed=k) for k, (w, h) in enumerate(SIZES)]
        self.record_sizes = np.array(SIZES, dtype=np.int64)
        self.source_sizes = self.record_sizes * 4
        self.source_boxes = np.concatenate([np.zeros_like(self.source_sizes), self.source_sizes], 1)
        self.content_boxes = np.concatenate(
            [np.zeros_like(self.record_sizes), self.record_sizes], 1
        ).astype(np.float32)
        self.mean, self.std = MEAN, STD

    def __len__(self):
        return len(self.records)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_device_transform_never_samples_the_padding(mode):
    ds = Varying()
    idx = [5, 0, 3, 1, 2, 4]
    make = getattr(DeviceTransform, mode)
    kw = {"generator": torch.Generator().manual_seed(2)} if mode == "train" else {}
    t = make(ds, size=20, dtype=torch.float64, **kw)
    out = t(canvas([ds.records[i] for i in idx]), np.array(idx))
    got, p = to_levels(out), t.last_params
    worst, mse = 0.0, []
    for k, i in enumerate(idx):
        box = (p["boxes"][k] / 4).tolist()  # source -> record pixels: the record is 1/4 scale
        ref = pillow(ds.records[i], box, 20, bool(p["flip"][k]))
        worst = max(worst, float(np.abs(np.round(got[k]) - ref).max()))
        mse.append(((got[k] - ref) ** 2).mean())
    assert worst <= 1.0 and psnr(mse) > 50


def test_pillow_reference_is_the_record_alone():
    # the reference really is a resize of the record, not of the canvas: a box touching
    # the record's right edge gives a different result on the white-padded canvas
    rec = photo_like(9, 12)
    whole = Image.fromarray(canvas([rec]).permute(0, 2, 3, 1)[0].numpy())
    alone = pillow(rec, [0, 0, 9, 12], 6)
    padded = np.asarray(whole.resize((6, 6), Image.BILINEAR, box=(0, 0, 9, 12)), dtype=float)
    assert np.abs(alone - padded).max() > 10
