"""The CPU crop (``imgpack.reader.resample.resample_record``): Pillow's BILINEAR resample of
the box (OpenCV's bilinear samples where the box is enlarged on both axes, within a level of
Pillow's; Pillow's own otherwise), from views of any strides into a batch's slot; on a pack,
within a level of the device path's batched matmuls on the same draw, and as faithful to the
photograph as Pillow's exact resample of the stored record (within 0.5 dB per crop)."""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest
import torch
from conftest import photo_like, write_image
from PIL import Image
from test_augment import to_levels

from imgpack.packer.pack import pack_folder
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.resample import reach, resample_boxes, resample_record
from imgpack.reader.transform import DeviceTransform


def pillow(record: np.ndarray, box, size: int, flip: bool) -> np.ndarray:
    """Pillow's resample of the whole record: the definition."""
    img = Image.fromarray(record[..., 0] if record.shape[-1] == 1 else record)
    out = np.asarray(img.resize((size, size), Image.BILINEAR, box=tuple(box)))
    out = out.reshape(size, size, record.shape[-1])
    return out[:, ::-1] if flip else out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((np.asarray(a, float) - np.asarray(b, float)) ** 2))
    return 10 * math.log10(255**2 / max(mse, 1e-12))


BOXES = [
    (0.0, 0.0, 61.0, 47.0),  # the whole record
    (3.37, 5.81, 40.12, 30.6),  # upscale, fractional
    (0.4, 0.2, 60.9, 46.7),  # a shrink touching both edges
    (20.25, 11.5, 21.75, 12.5),  # a tiny box, far upscaled
    (55.2, 40.1, 61.0, 47.0),  # in the bottom-right corner
    (30.0, 10.0, 30.0, 20.0),  # zero width: Pillow's answer is the column at 30
    (-1e-9, 0.0, 61.0 + 1e-9, 47.0),  # float noise beyond the edges
]


@pytest.mark.parametrize("box", BOXES)
@pytest.mark.parametrize(
    ("channels", "size", "flip"), [(3, 24, False), (3, 17, True), (1, 24, True)]
)
def test_the_resample_is_pillows_on_the_whole_record(box, channels, size, flip):
    record = photo_like(61, 47, seed=3)[..., :channels].copy()
    got = resample_record(record, box, size, flip, np.empty((size, size, channels), np.uint8))
    clipped = [min(max(v, 0.0), lim) for v, lim in zip(box, (61, 47, 61, 47))]
    want = pillow(record, clipped, size, flip)
    assert got.shape == want.shape and np.abs(got.astype(int) - want).max() <= 1


def test_boxes_on_noise_are_within_a_level_of_pillows():
    """Any box, enlarged, shrunk or both, at either edge or inside, flipped or not, on a
    noise record of 1 or 3 channels: within a level of Pillow's exact resample of the box
    in the whole record (Pillow's own on the part its filter reaches places the box in
    other float bits, which may move a fixed-point rounding by one)."""
    rng = np.random.default_rng(12)
    for n in range(300):
        w, h, c = int(rng.integers(2, 90)), int(rng.integers(2, 90)), int(rng.choice([1, 3]))
        record = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
        size = int(rng.choice([1, 3, 8, 17, 32, 48]))
        bw, bh = rng.uniform(0.0, w), rng.uniform(0.0, h)
        left = 0.0 if n % 3 == 0 else rng.uniform(0, w - bw)
        top = h - bh if n % 5 == 0 else rng.uniform(0, h - bh)
        box, flip = (left, top, left + bw, top + bh), bool(n % 2)
        got = resample_record(record, box, size, flip, np.empty((size, size, c), np.uint8))
        want = pillow(record, box, size, flip)
        assert np.abs(got.astype(int) - want).max() <= 1, (w, h, box, size, flip)


@pytest.mark.parametrize("flip", [np.int64(2), 0.5, "yes", None, 0, np.bool_(True)])
def test_flip_is_read_as_python_reads_it(flip):
    record, box = photo_like(61, 47, seed=3), (3.37, 5.81, 40.12, 30.6)
    out = resample_record(record, box, 24, flip, np.empty((24, 24, 3), np.uint8))
    want = resample_record(record, box, 24, bool(flip), np.empty((24, 24, 3), np.uint8))
    assert np.array_equal(out, want)


def test_from_views_of_any_strides_into_a_slot():
    """The record as a slot of a wider canvas, as a planar canvas's transpose and as a
    read-only buffer; the output as a slot of a batch: same pixels, nothing else touched."""
    record, size = photo_like(40, 30, seed=1), 20
    canvas = np.zeros((35, 52, 3), np.uint8)
    canvas[:30, :40] = record
    planar = np.ascontiguousarray(canvas.transpose(2, 0, 1))
    readonly = np.frombuffer(record.tobytes(), np.uint8).reshape(30, 40, 3)
    for box in ((2.6, 1.3, 37.9, 28.2), (5.3, 4.1, 19.7, 17.2)):  # shrunk, enlarged
        want = resample_record(record, box, size, True, np.empty((size, size, 3), np.uint8))
        for src in (canvas[:30, :40], planar[:, :30, :40].transpose(1, 2, 0), readonly):
            batch = np.full((3, size + 2, size, 3), 9, np.uint8)
            resample_record(src, box, size, True, batch[1, 1 : size + 1])
            np.testing.assert_array_equal(batch[1, 1 : size + 1], want)
            batch[1, 1 : size + 1] = 9
            assert (batch == 9).all()
        plain = resample_record(record, box, size, False, np.empty((size, size, 3), np.uint8))
        np.testing.assert_array_equal(plain[:, ::-1], want)  # a mirror is exactly that


def test_pillow_reads_only_what_its_filter_reaches():
    assert reach(10.3, 20.7, 5, 100) == (7, 24)  # shrink x2.08: support 2.08 each side, +1
    assert reach(10.3, 20.7, 50, 100) == (8, 23)  # upscale: support 1
    assert reach(0.0, 100.0, 10, 100) == (0, 100)  # within the record


SIDE, OUT = 40, 24
SOURCES = [(90, 60), (50, 88), (30, 22), (64, 64), (120, 33), (37, 71), (75, 75), (26, 44)]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpusrc")
    for k, (w, h) in enumerate(SOURCES):
        write_image(root / "ab"[k % 2] / f"{k}.png", w, h, seed=k)
    return root


@pytest.mark.parametrize("codec", ["raw", "jpeg"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_on_a_pack_the_crops_are_the_device_transforms(src, tmp_path, codec, mode):
    """Per record of a ``fit`` pack, the kernel on ``ds[i]`` with the draw's box and flip: as
    the device path on the same draw (each within one level of Pillow's exact resample), and
    within 0.5 dB of that exact resample against the photograph."""
    kw = {"quality": 90} if codec == "jpeg" else {}
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(SIDE, SIDE), resize="fit", codec=codec, progress=False, **kw)
    ds = PackedImageDataset(out)
    gen = {"generator": torch.Generator().manual_seed(5)} if mode == "train" else {}
    t = getattr(DeviceTransform, mode)(ds, size=OUT, dtype=torch.float64, **gen)
    idx = np.arange(len(ds))
    draw = t.draw(idx, ds.shape[:2])
    device = to_levels(t.apply(ds.gather(idx)[0], draw), ds.mean, ds.std)
    gaps = []
    for k, i in enumerate(idx.tolist()):
        record = ds[i][0].permute(1, 2, 0).numpy()
        got = resample_record(
            record, draw.crop[k], OUT, bool(draw.flip[k]), np.empty((OUT, OUT, 3), np.uint8)
        )
        assert np.abs(got - device[k]).max() <= 2  # both within a level of Pillow's
        exact = pillow(np.ascontiguousarray(record), draw.crop[k], OUT, bool(draw.flip[k]))
        with Image.open(src / ds.source_path(i)) as im:
            truth = pillow(np.asarray(im.convert("RGB")), draw.boxes[k], OUT, bool(draw.flip[k]))
        gaps.append(min(psnr(exact, truth), 50.0) - psnr(got, truth))
    assert max(gaps) < 0.5
    if mode == "train":
        assert draw.flip.any() and not draw.flip.all()  # both ways were tried


@pytest.mark.parametrize("flip", [False, True])
def test_a_large_enlarged_crop(flip):
    """A 300 x 300 output (OpenCV spreads it over its own threads) of an enlarged box:
    within a level of Pillow's."""
    record = photo_like(200, 150, seed=6)
    box = (10.3, 7.9, 190.6, 141.2)
    got = resample_record(record, box, 300, flip, np.empty((300, 300, 3), np.uint8))
    assert np.abs(got.astype(int) - pillow(record, box, 300, flip)).max() <= 1


@pytest.mark.parametrize("box", [(0.0, 29.5, 40.0, 30.0), (39.5, 0.0, 40.0, 30.0)])
def test_a_mirrored_record_read_one_row_or_column_wide(box):
    """A record with negative strides whose box spans one row (or column): numpy calls that
    view contiguous and keeps its negative stride, which torch refuses."""
    record = photo_like(40, 30, seed=4)
    for src in (record[::-1], record[:, ::-1]):
        got = resample_record(src, box, 8, False, np.empty((8, 8, 3), np.uint8))
        want = resample_record(src.copy(), box, 8, False, np.empty((8, 8, 3), np.uint8))
        np.testing.assert_array_equal(got, want)


def test_the_device_paths_crops_agree_with_the_cpus_within_a_level():
    """The batched matmuls (what a CUDA device runs, here on the CPU) and the per-record CPU
    crop, on the same canvas of records of several sizes and the same boxes, before any
    normalising: within one level at the 99th percentile (each is Pillow's filter; the
    matmuls do not round between their passes)."""
    rng = np.random.default_rng(3)
    sizes = [(61, 47), (40, 52), (64, 64), (33, 20)]
    canvas = np.zeros((len(sizes) * 8, 64, 64, 3), np.uint8)
    boxes, extent = [], []
    for k in range(len(canvas)):
        w, h = sizes[k % len(sizes)]
        canvas[k, :h, :w] = photo_like(w, h, seed=k)
        bw, bh = rng.uniform(4, w), rng.uniform(4, h)
        left, top = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        boxes.append((left, top, left + bw, top + bh))
        extent.append((w, h))
    flip = rng.random(len(canvas)) < 0.5
    for size in (24, 48):
        images = torch.from_numpy(canvas).permute(0, 3, 1, 2)
        device = resample_boxes(images, torch.tensor(boxes), size, torch.from_numpy(flip),
                                torch.float32, torch.tensor(extent))  # fmt: skip
        device = device.permute(0, 2, 3, 1).numpy()
        cpu = np.stack([
            resample_record(canvas[k, :h, :w], boxes[k], size, flip[k],
                            np.empty((size, size, 3), np.uint8))
            for k, (w, h) in enumerate(extent)
        ])  # fmt: skip
        gap = np.abs(cpu - device)
        assert np.percentile(gap, 99) <= 1.0 and gap.max() <= 3, (size, gap.max())


def test_an_opencv_4_is_refused_in_one_line(monkeypatch):
    """OpenCV 4 places warpAffine's samples to 1/32 pixel (up to 7 levels off Pillow's on a
    sharp edge): an enlarged crop says what to install rather than crop otherwise. (The
    installed cv2 replaced by an OpenCV 4 in this process: no interpreter of its own.)"""
    monkeypatch.setitem(sys.modules, "cv2", types.SimpleNamespace(__version__="4.10.0"))
    with pytest.raises(Exception, match="need OpenCV 5") as err:
        resample_record(np.zeros((30, 40, 3), np.uint8), (5.3, 4.1, 19.7, 17.2), 20, True,
                        np.empty((20, 20, 3), np.uint8))  # fmt: skip
    assert "\n" not in str(err.value) and "OpenCV 4.10.0" in str(err.value)
