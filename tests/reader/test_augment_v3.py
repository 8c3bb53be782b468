"""DeviceTransform.train/eval through make_loader on real version 3 packs, every codec and
resize mode: each output is Pillow's resample of the stored record alone (the record as
``ds[i]`` gives it), to within one level, and as close to the source photograph as that
exact resample is (within 0.5 dB, per image; the truth is Pillow's resample of the source
file over the same box)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import write_image
from PIL import Image
from test_augment import pillow, record_box, to_levels

from imgpack.packer.pack import pack_folder
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.transform import DeviceTransform

SIDE, OUT = 40, 24
# (width, height) of the sources: landscape, portrait, smaller than SIDE, square, long
SOURCES = [(90, 60), (50, 88), (30, 22), (64, 64), (120, 33), (37, 71), (75, 75), (26, 44)]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("v3src")
    for k, (w, h) in enumerate(SOURCES):
        write_image(root / "ab"[k % 2] / f"{k}.png", w, h, seed=k)
    return root


def psnr(a, b):
    mse = float(np.mean((np.asarray(a, float) - np.asarray(b, float)) ** 2))
    return 10 * math.log10(255**2 / max(mse, 1e-12))


class Noting:
    """Wraps T; notes each batch's records and T's parameters for that batch."""

    def __init__(self, t):
        self.t, self.calls = t, []

    def __call__(self, images, records):
        out = self.t(images, records)
        self.calls.append((records.clone(), {k: v.clone() for k, v in self.t.last_params.items()}))
        return out


@pytest.mark.parametrize(
    "resize,codec",
    [
        ("fit", "raw"),
        ("fit", "yuv420"),
        ("stretch", "yuv420"),
        ("center-crop", "raw"),
        ("pad", "yuv420"),
    ],  # fmt: skip
)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_the_transform_is_the_exact_resample_of_the_stored_record(
    src, tmp_path, resize, codec, mode
):
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(SIDE, SIDE), resize=resize, codec=codec, progress=False)
    ds = PackedImageDataset(out)
    assert ds.codec == codec
    if resize == "fit":
        assert sorted(set(map(tuple, ds.record_sizes.tolist()))) != [(SIDE, SIDE)]
    kw = {"generator": torch.Generator().manual_seed(3)} if mode == "train" else {}
    t = Noting(getattr(DeviceTransform, mode)(ds, size=OUT, dtype=torch.float64, **kw))
    batches = list(make_loader(ds, 3, seed=1, transform=t, device="cpu"))
    worst, gap = 0.0, []
    for (x, _), (records, p) in zip(batches, t.calls):
        got = to_levels(x, ds.mean, ds.std)
        for k, i in enumerate(records.tolist()):
            box, flip = p["boxes"][k].tolist(), bool(p["flip"][k])
            record = ds[i][0].permute(1, 2, 0).numpy()  # the stored record, as RGB
            exact = pillow(record, record_box(ds, i, box), OUT, flip)
            worst = max(worst, float(np.abs(np.round(got[k]) - exact).max()))
            with Image.open(src / ds.source_path(i)) as im:
                truth = pillow(np.asarray(im.convert("RGB")), box, OUT, flip)
            # (a source smaller than the pack's side is stored as it is: the exact resample
            # is then the photograph's own, and the transform must be within ~1 level of it)
            gap.append(min(psnr(exact, truth), 50.0) - psnr(got[k], truth))
    assert len(gap) == len(SOURCES)
    assert worst <= 1.0  # at most one level from the exact resample of the record
    assert max(gap) < 0.5  # and as faithful to the photograph as that resample, per image
