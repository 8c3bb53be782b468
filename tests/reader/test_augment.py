"""DeviceTransform.train/eval on device cpu: box statistics, geometry, and agreement with Pillow.

Tolerance against Pillow: Pillow works in fixed point and rounds to uint8
between its two passes, the transform in float throughout, so after rounding
the transform's output to uint8 no pixel may differ by more than 1 level, and
the PSNR must stay above 50 dB.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import photo_like
from PIL import Image, ImageOps

from imgpack.errors import InvalidArgumentError
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.transform import DeviceTransform, center_boxes, random_resized_boxes

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class StandIn:
    """What a pack exposes, for records made here from known sources."""

    def __init__(self, records, sizes, sboxes, cboxes, mean=MEAN, std=STD):
        self.records = np.stack(records)  # (N, H, W, C)
        self.source_sizes = np.asarray(sizes, dtype=np.int64)
        self.source_boxes = np.asarray(sboxes, dtype=np.float32)
        self.content_boxes = np.asarray(cboxes, dtype=np.float32)
        self.mean, self.std, self.channels = mean, std, self.records.shape[-1]

    def __len__(self):
        return len(self.records)

    def batch(self, idx):
        return torch.from_numpy(self.records[idx]).permute(0, 3, 1, 2)


def whole(n, w, h, sw=None, sh=None):
    """n records that are the whole source (sw x sh) stretched to w x h."""
    sw, sh = sw or w, sh or h
    recs = [photo_like(w, h, seed=i) for i in range(n)]
    return StandIn(recs, [(sw, sh)] * n, [(0, 0, sw, sh)] * n, [(0, 0, w, h)] * n)


def to_levels(out, mean=MEAN, std=STD):
    """Normalised (B, C, S, S) -> float64 (B, S, S, C) on the 0..255 scale."""
    m = torch.tensor(mean, dtype=torch.float64).view(1, -1, 1, 1) * 255
    s = torch.tensor(std, dtype=torch.float64).view(1, -1, 1, 1) * 255
    return (out.double() * s + m).permute(0, 2, 3, 1).numpy()


def pillow(record, box, size, flip=False):
    img = Image.fromarray(record[..., 0] if record.shape[-1] == 1 else record)
    out = img.resize((size, size), Image.BILINEAR, box=tuple(float(v) for v in box))
    arr = np.asarray(out, dtype=np.float64).reshape(size, size, -1)
    return arr[:, ::-1] if flip else arr


def record_box(ds, i, box):
    """The contract's mapping, written out: x_r = c.l + (x_s - s.l) * c.w / s.w."""
    s, c = ds.source_boxes[i].astype(np.float64), ds.content_boxes[i].astype(np.float64)
    fx, fy = (c[2] - c[0]) / (s[2] - s[0]), (c[3] - c[1]) / (s[3] - s[1])
    b = np.asarray(box, dtype=np.float64)
    return [c[0] + (b[0] - s[0]) * fx, c[1] + (b[1] - s[1]) * fy,
            c[0] + (b[2] - s[0]) * fx, c[1] + (b[3] - s[1]) * fy]  # fmt: skip


def assert_matches_pillow(t, ds, idx, out, max_diff=1.0, psnr=50.0):
    got = to_levels(out, ds.mean, ds.std)
    p = t.last_params
    worst, mse = 0.0, []
    for k, i in enumerate(idx):
        ref = pillow(
            ds.records[i], record_box(ds, i, p["boxes"][k].tolist()), t.size, bool(p["flip"][k])
        )
        worst = max(worst, float(np.abs(np.round(got[k]) - ref).max()))
        mse.append(((got[k] - ref) ** 2).mean())
    assert worst <= max_diff
    assert 10 * math.log10(255**2 / max(float(np.mean(mse)), 1e-12)) > psnr


# -- the boxes -------------------------------------------------------------------------


def test_random_resized_boxes_follow_torchvision_statistics():
    n, vis = 4000, torch.tensor([[10.0, 20.0, 510.0, 395.0]])  # a 500 x 375 region at (10, 20)
    boxes = random_resized_boxes(vis.repeat(n, 1), (0.08, 1.0), (3 / 4, 4 / 3),
                                 torch.Generator().manual_seed(0))  # fmt: skip
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert torch.equal(w, w.round()) and torch.equal(
        boxes[:, :2] - vis[:, :2], (boxes[:, :2] - vis[:, :2]).round()
    )
    assert (boxes[:, 0] >= 10).all() and (boxes[:, 2] <= 510).all()
    assert (boxes[:, 1] >= 20).all() and (boxes[:, 3] <= 395).all()
    area, aspect = w * h / (500 * 375), w / h
    # whole-pixel rounding moves area and aspect a little past the drawn bounds
    assert area.min() >= 0.075 and area.max() <= 1.0 and area.min() < 0.1 and area.max() > 0.9
    assert aspect.min() >= 0.74 and aspect.max() <= 1.35
    assert aspect.min() < 0.77 and aspect.max() > 1.3 and 0.9 < aspect.median() < 1.1
    # area uniform in [0.08, 1] apart from the large crops that do not fit and are redrawn
    assert 0.3 < area.median() < 0.55
    # offsets are uniform: the crops' centres cover the region
    cx = (boxes[:, 0] + boxes[:, 2]) / 2
    assert cx.min() < 120 and cx.max() > 400


@pytest.mark.parametrize(
    "region,want",
    [
        ((0, 0, 1000, 100), (433, 0, 566, 100)),  # too wide: h kept, w = round(100 * 4/3)
        ((0, 0, 100, 1000), (0, 433, 100, 566)),  # too tall: w kept, h = round(100 / (3/4))
        ((5, 7, 105, 87), (5, 7, 105, 87)),  # within the ratio range: the whole region
    ],
)
def test_impossible_draws_fall_back_to_the_centre_crop(region, want):
    vis = torch.tensor([region], dtype=torch.float64).repeat(50, 1)
    boxes = random_resized_boxes(vis, (2.0, 3.0), (3 / 4, 4 / 3))  # no area can fit
    assert torch.equal(boxes, torch.tensor([want], dtype=torch.float64).repeat(50, 1))


def test_the_fallback_stays_inside_a_fractional_region():
    # what a center-crop record shows of its source can be fractional: 300.7 x 225.45 is
    # just wider than 4:3, and round(225.45 * 4/3) = 301 would overhang it
    vis = torch.tensor([[10.0, 20.0, 310.7, 245.45], [0.0, 0.0, 100.3, 300.8]], dtype=torch.float64)
    boxes = random_resized_boxes(vis, (2.0, 3.0), (3 / 4, 4 / 3))  # no area fits: the fallback
    assert (boxes[:, :2] >= vis[:, :2]).all() and (boxes[:, 2:] <= vis[:, 2:]).all()
    assert boxes[0, 2] - boxes[0, 0] == pytest.approx(300.7)  # the whole width, not 301
    assert boxes[1].tolist() == [0.0, 83.0, 100.3, 217.0]  # round(100.3 / 0.75) = 134 fits


def _torchvision_center(sw, sh, size, crop_ratio):
    """Resize(int(size / crop_ratio)) then CenterCrop(size), the way torchvision computes them."""
    r = int(size / crop_ratio)
    rw, rh = (r, int(r * sh / sw)) if sw <= sh else (int(r * sw / sh), r)
    left, top = int(round((rw - size) / 2.0)), int(round((rh - size) / 2.0))
    fx, fy = sw / rw, sh / rh
    return [left * fx, top * fy, (left + size) * fx, (top + size) * fy]


def test_eval_boxes_are_exact():
    sizes = [(500, 375), (375, 500), (640, 480), (1999, 2001), (224, 224), (301, 250)]
    src = torch.tensor(sizes, dtype=torch.float64)
    vis = torch.cat([torch.zeros(len(sizes), 2, dtype=torch.float64), src], 1)
    for size, ratio in [(224, 0.875), (192, 0.875), (160, 1.0), (96, 0.75)]:
        got = center_boxes(src, vis, size, ratio)
        want = torch.tensor(
            [_torchvision_center(w, h, size, ratio) for w, h in sizes], dtype=torch.float64
        )
        torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_eval_zooms_rather_than_distorts_where_the_record_shows_less():
    # a 320x240 center-crop record of a 300x400 portrait shows only y in [87.5, 312.5]:
    # the 0.875 eval box (taller than that) keeps its aspect, centred in what is there
    src = torch.tensor([[300.0, 400.0]], dtype=torch.float64)
    vis = torch.tensor([[0.0, 87.5, 300.0, 312.5]], dtype=torch.float64)
    want = torch.tensor([_torchvision_center(300, 400, 64, 0.875)], dtype=torch.float64)
    got = center_boxes(src, vis, 64, 0.875)
    aspect = lambda b: (b[:, 2] - b[:, 0]) / (b[:, 3] - b[:, 1])  # noqa: E731
    torch.testing.assert_close(aspect(got), aspect(want), rtol=1e-12, atol=0)
    assert got[0, 1] == 87.5 and got[0, 3] == 312.5  # as tall as the record allows
    torch.testing.assert_close((got[:, 0] + got[:, 2]) / 2, (want[:, 0] + want[:, 2]) / 2)
    # nothing to shrink: exactly torchvision's box
    full = torch.tensor([[0.0, 0.0, 300.0, 400.0]], dtype=torch.float64)
    assert torch.equal(center_boxes(src, full, 64, 0.875), want)


def test_eval_output_is_pillow_resize_then_center_crop():
    ds = whole(4, 70, 52)
    t = DeviceTransform.eval(ds, size=40, dtype=torch.float64)
    out = t(ds.batch([0, 1, 2, 3]), torch.arange(4))
    assert not t.last_params["flip"].any()
    r = int(40 / 0.875)
    rw, rh = int(r * 70 / 52), r
    left, top = int(round((rw - 40) / 2)), int(round((rh - 40) / 2))
    got = to_levels(out)
    for k in range(4):
        ref = Image.fromarray(ds.records[k]).resize((rw, rh), Image.BILINEAR)
        ref = np.asarray(ref.crop((left, top, left + 40, top + 40)), dtype=np.float64)
        assert np.abs(np.round(got[k]) - ref).max() <= 1


# -- the pixels -------------------------------------------------------------------------


@pytest.mark.parametrize("size", [24, 56, 100])  # shrink, about 1:1, enlarge
def test_train_output_matches_pillow_on_the_record(size):
    ds = whole(12, 72, 60, sw=720, sh=600)
    t = DeviceTransform.train(
        ds, size=size, dtype=torch.float64, generator=torch.Generator().manual_seed(size)
    )
    idx = [3, 0, 11, 5, 5, 7, 1, 2, 9, 10, 4, 8]
    out = t(ds.batch(idx), np.array(idx))
    assert out.shape == (12, 3, size, size) and out.is_contiguous(memory_format=torch.channels_last)
    assert_matches_pillow(t, ds, idx, out)


def test_one_channel_batches():
    recs = [photo_like(50, 40, seed=i)[..., :1] for i in range(6)]
    ds = StandIn(
        recs, [(50, 40)] * 6, [(0, 0, 50, 40)] * 6, [(0, 0, 50, 40)] * 6, mean=(0.5,), std=(0.2,)
    )
    t = DeviceTransform.train(
        ds, size=20, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )
    out = t(ds.batch(range(6)), range(6))
    assert out.shape == (6, 1, 20, 20)
    assert_matches_pillow(t, ds, list(range(6)), out)
    e = DeviceTransform.eval(ds, size=20, dtype=torch.float64)
    assert_matches_pillow(e, ds, list(range(6)), e(ds.batch(range(6)), range(6)))


def test_flip_rate_and_memory_formats():
    ds = whole(2000, 8, 8)
    t = DeviceTransform.train(ds, size=4, generator=torch.Generator().manual_seed(0))
    images = ds.batch(np.arange(2000))
    t(images, np.arange(2000))
    assert 0.45 < t.last_params["flip"].float().mean().item() < 0.55
    t.generator.manual_seed(0)
    a = t(images[:64], np.arange(64))
    t.generator.manual_seed(0)
    b = t(images[:64].contiguous(), torch.arange(64))  # any input memory format
    assert torch.equal(a, b)
    no_flip = DeviceTransform.train(ds, size=4, flip=False)
    no_flip(images[:100], np.arange(100))
    assert not no_flip.last_params["flip"].any()


def test_progressive_size_and_dtypes():
    ds = whole(5, 40, 30)
    t = DeviceTransform.train(ds, size=16)
    assert t(ds.batch(range(5)), range(5)).shape == (5, 3, 16, 16)
    t.size = 24
    assert t(ds.batch(range(5)), range(5)).shape == (5, 3, 24, 24)
    half = DeviceTransform.eval(ds, size=12, dtype=torch.bfloat16)
    out = half(ds.batch(range(5)), range(5))
    assert out.dtype == torch.bfloat16 and out.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(InvalidArgumentError, match="positive int"):
        t.size = 0


def test_draws_are_reproducible():
    ds = whole(16, 30, 20)
    images, idx = ds.batch(range(16)), list(range(16))

    def boxes(**kw):
        t = DeviceTransform.train(ds, size=8, **kw)
        out = t(images, idx)
        return out, t.last_params["boxes"], t.last_params["flip"]

    a = boxes(generator=torch.Generator().manual_seed(7))
    b = boxes(generator=torch.Generator().manual_seed(7))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    torch.manual_seed(3)
    c = boxes()
    torch.manual_seed(3)
    d = boxes()
    assert all(torch.equal(x, y) for x, y in zip(c, d))
    assert not torch.equal(a[1], c[1])


# -- geometry: records made each way from one source ------------------------------------


def _records_of(src, mode, side=48):
    """(record, content box, source box) for ``src`` stored the way each resize mode stores it."""
    h, w = src.shape[:2]
    img = Image.fromarray(src)
    if mode == "stretch":
        return (
            np.asarray(img.resize((side, side), Image.BILINEAR)),
            (0, 0, side, side),
            (0, 0, w, h),
        )
    if mode == "pad":
        s = side / max(w, h)
        rw, rh = round(w * s), round(h * s)
        rec = np.zeros((side, side, 3), np.uint8)
        x0, y0 = (side - rw) // 2, (side - rh) // 2
        rec[y0 : y0 + rh, x0 : x0 + rw] = np.asarray(img.resize((rw, rh), Image.BILINEAR))
        return rec, (x0, y0, x0 + rw, y0 + rh), (0, 0, w, h)
    # center-crop: shorter side to side, the middle side x side kept
    s = side / min(w, h)
    rw, rh = round(w * s), round(h * s)
    x0, y0 = (rw - side) // 2, (rh - side) // 2
    rec = np.asarray(img.resize((rw, rh), Image.BILINEAR).crop((x0, y0, x0 + side, y0 + side)))
    return rec, (0, 0, side, side), (x0 / s, y0 / s, (x0 + side) / s, (y0 + side) / s)


@pytest.mark.parametrize("mode", ["stretch", "pad", "center-crop"])
def test_geometry_round_trips(mode):
    sources = [photo_like(180, 120, seed=1), photo_like(120, 180, seed=2)]
    made = [_records_of(s, mode) for s in sources]
    ds = StandIn(
        [m[0] for m in made], [(180, 120), (120, 180)], [m[2] for m in made], [m[1] for m in made]
    )
    idx = [0, 1] * 8
    for t in (
        DeviceTransform.train(
            ds,
            size=32,
            scale=(0.25, 1.0),
            dtype=torch.float64,
            generator=torch.Generator().manual_seed(4),
        ),  # fmt: skip
        DeviceTransform.eval(ds, size=32, dtype=torch.float64),
    ):
        out = t(ds.batch(idx), idx)
        boxes = t.last_params["boxes"].numpy()
        vis = ds.source_boxes[idx].astype(np.float64)
        assert (boxes[:, :2] >= vis[:, :2] - 1e-6).all() and (
            boxes[:, 2:] <= vis[:, 2:] + 1e-6
        ).all()
        assert_matches_pillow(t, ds, idx, out)
        # and the crop is the source's, undistorted: close to Pillow on the original file
        got = to_levels(out)
        for k, i in enumerate(idx):
            ref = pillow(sources[i], boxes[k], 32, bool(t.last_params["flip"][k]))
            psnr = 10 * math.log10(255**2 / ((got[k] - ref) ** 2).mean())
            assert psnr > 28, (mode, k, psnr)


def test_version_1_packs_read_as_their_own_source(make_pack):
    path, pixels, _ = make_pack(count=6, height=12, width=10)
    ds = PackedImageDataset(path)
    images, _ = ds.gather(range(6))
    t = DeviceTransform.train(ds, size=8, generator=torch.Generator().manual_seed(0))
    t(images, torch.arange(6))
    boxes = t.last_params["boxes"]
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= 10).all() and (boxes[:, 3] <= 12).all()
    e = DeviceTransform.eval(ds, size=8, crop_ratio=1.0)
    e(images, range(6))
    want = torch.tensor([_torchvision_center(10, 12, 8, 1.0)] * 6, dtype=torch.float64)
    torch.testing.assert_close(e.last_params["boxes"], want, rtol=0, atol=1e-9)


def test_objects_without_geometry_read_as_their_own_source():
    class Bare:  # only the stats: geometry falls back to the whole record
        mean, std = MEAN, STD

    ds = whole(3, 20, 14)
    bare = DeviceTransform.eval(Bare(), size=10, dtype=torch.float64)
    full = DeviceTransform.eval(ds, size=10, dtype=torch.float64)
    images = ds.batch([0, 1, 2])
    assert torch.equal(bare(images, [0, 1, 2]), full(images, [0, 1, 2]))
    want = torch.tensor([_torchvision_center(20, 14, 10, 0.875)] * 3, dtype=torch.float64)
    torch.testing.assert_close(bare.last_params["boxes"], want, rtol=0, atol=1e-9)


def test_bad_calls_are_refused():
    ds = whole(4, 10, 10)
    t = DeviceTransform.train(ds, size=8)
    with pytest.raises(InvalidArgumentError, match=r"T\(images, records\)"):
        t(ds.batch(range(4)))
    with pytest.raises(InvalidArgumentError, match="4 images but 3 record"):
        t(ds.batch(range(4)), [0, 1, 2])
    with pytest.raises(InvalidArgumentError, match="index 4 is out of range for a pack of 4"):
        t(ds.batch(range(4)), [0, 1, 2, 4])
    with pytest.raises(InvalidArgumentError, match="1-D sequence"):
        t(ds.batch(range(4)), np.zeros((2, 2), dtype=int))
    with pytest.raises(InvalidArgumentError, match="crop_ratio"):
        DeviceTransform.eval(ds, crop_ratio=1.5)
    with pytest.raises(InvalidArgumentError, match="min <= max"):
        DeviceTransform.train(ds, scale=(1.0, 0.5))
    with pytest.raises(InvalidArgumentError, match="positive int"):
        DeviceTransform.train(ds, size=2.5)
    with pytest.raises(InvalidArgumentError, match="finite"):
        DeviceTransform.train(ds, scale=(0.1, float("inf")))
    with pytest.raises(InvalidArgumentError, match="crop_ratio"):
        DeviceTransform.eval(ds, crop_ratio="wide")
    with pytest.raises(InvalidArgumentError, match="torch.Generator"):
        DeviceTransform.train(ds, generator=np.random.default_rng(0))
    assert DeviceTransform.train(ds, size=np.int64(8)).size == 8  # sizes computed with numpy
    ds.shape = ds.records.shape[1:]  # as a pack has: boxes are in these record pixels
    ds.record_sizes = np.tile([10, 10], (4, 1))  # (with each record's own size: a RecordShape)
    with pytest.raises(InvalidArgumentError, match="built for 10x10 records, found 6x10"):
        t(ds.batch(range(4))[..., :6], [0, 1, 2, 3])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    ds = whole(32, 64, 48, sw=640, sh=480)
    idx = torch.arange(32)
    for make in (
        lambda: DeviceTransform.train(ds, size=40, generator=torch.Generator().manual_seed(9)),
        lambda: DeviceTransform.eval(ds, size=40),
    ):
        on_cpu, on_gpu = make(), make()
        want = on_cpu(ds.batch(idx.numpy()), idx)
        got = on_gpu(ds.batch(idx.numpy()).cuda(), idx)
        assert got.is_cuda and got.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(on_gpu.last_params["boxes"].cpu(), on_cpu.last_params["boxes"])
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=2e-2)


# -- real packs: the packer's own geometry --------------------------------------------


def _oriented_jpeg(path, arr, orientation):
    """Save ``arr`` so that after EXIF ``orientation`` the upright picture is ``arr``."""
    undo = {1: None, 3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90,
            8: Image.Transpose.ROTATE_270}[orientation]  # fmt: skip
    img = Image.fromarray(arr)
    stored = img if undo is None else img.transpose(undo)
    exif = Image.Exif()
    exif[0x0112] = orientation
    path.parent.mkdir(parents=True, exist_ok=True)
    stored.save(path, quality=95, exif=exif)
    return path


@pytest.mark.parametrize("mode", ["stretch", "pad", "center-crop"])
def test_packs_with_rotated_sources(tmp_path, mode):
    from imgpack.packer.pack import pack_folder

    src = tmp_path / "src"
    uprights = {}
    for k, orientation in enumerate((1, 6, 8, 3)):
        arr = photo_like(150 - 40 * (k % 2), 100 + 40 * (k % 2), seed=k)  # landscape, portrait
        uprights[f"c/{k}.jpg"] = _oriented_jpeg(src / "c" / f"{k}.jpg", arr, orientation)
    out = tmp_path / f"{mode}.bin"
    pack_folder(src, out, size=(48, 48), resize=mode, progress=False, workers=1)
    ds = PackedImageDataset(out)
    for i in range(len(ds)):
        upright = ImageOps.exif_transpose(Image.open(uprights[ds.source_path(i)]))
        assert tuple(ds.source_sizes[i]) == upright.size  # after EXIF orientation
    images, _ = ds.gather(range(len(ds)))
    rec = StandIn(list(images.permute(0, 2, 3, 1).numpy()), ds.source_sizes, ds.source_boxes,
                  ds.content_boxes, ds.mean, ds.std)  # fmt: skip
    idx = list(range(len(ds))) * 4
    for t in (
        DeviceTransform.train(
            ds,
            size=32,
            scale=(0.3, 1.0),
            dtype=torch.float64,
            generator=torch.Generator().manual_seed(2),
        ),  # fmt: skip
        DeviceTransform.eval(ds, size=32, dtype=torch.float64),
    ):
        out = t(images[idx], idx)
        assert_matches_pillow(t, rec, idx, out)
        got, boxes = to_levels(out, ds.mean, ds.std), t.last_params["boxes"].numpy()
        for k, i in enumerate(idx):
            upright = ImageOps.exif_transpose(Image.open(uprights[ds.source_path(i)])).convert(
                "RGB"
            )
            ref = pillow(np.asarray(upright), boxes[k], 32, bool(t.last_params["flip"][k]))
            psnr = 10 * math.log10(255**2 / ((got[k] - ref) ** 2).mean())
            assert psnr > 26, (mode, k, psnr)
