"""The per-record CPU crop (``imgpack.reader.cpuresample``): Pillow's BILINEAR resample of the
whole record on a grid misplaced by at most ``ALIGN`` pixels (torch's kernel; exact where
Pillow's; within a level of Pillow's where OpenCV resamples an enlarged box), from and into
views of any strides; on a pack, the same crops as the device transform's (its draw), as
faithful to the photograph as Pillow's exact resample of the stored record (within 0.5 dB per
crop, as tests/reader/test_augment_v3.py holds the device path). The tests that hold for any
box run on both paths (the ``crops`` fixture); torch's own grid is tested with OpenCV off."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import photo_like, write_image
from PIL import Image
from test_augment import to_levels

from imgpack.errors import InvalidArgumentError
from imgpack.packer.pack import pack_folder
from imgpack.reader import cpuresample
from imgpack.reader.cpuresample import ALIGN, reach, resample_record
from imgpack.reader.dataset import PackedImageDataset
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


def within_the_grid(got: np.ndarray, record: np.ndarray, box, size: int, flip: bool) -> bool:
    """Whether every pixel of ``got`` lies within a level of the range Pillow's resamples of
    the box shifted by up to ``ALIGN`` (on a 5 x 5 grid of shifts) give it."""
    lim = record.shape[1], record.shape[0]
    runs = []
    for dy in np.linspace(-ALIGN, ALIGN, 5):
        for dx in np.linspace(-ALIGN, ALIGN, 5):
            shifted = [v + d for v, d in zip(box, (dx, dy, dx, dy))]
            clipped = [min(max(v, 0.0), lim[k % 2]) for k, v in enumerate(shifted)]
            runs.append(pillow(record, clipped, size, flip).astype(int))
    low, high = np.min(runs, axis=0), np.max(runs, axis=0)
    return bool(((got >= low - 1) & (got <= high + 1)).all())


@pytest.mark.parametrize("box", BOXES)
@pytest.mark.parametrize(
    ("channels", "size", "flip"), [(3, 24, False), (3, 17, True), (1, 24, True)]
)
def test_the_resample_is_pillows_on_the_whole_record(box, channels, size, flip, crops):
    record = photo_like(61, 47, seed=3)[..., :channels].copy()
    got = resample_record(record, box, size, flip, np.empty((size, size, channels), np.uint8))
    clipped = [min(max(v, 0.0), lim) for v, lim in zip(box, (61, 47, 61, 47))]
    want = pillow(record, clipped, size, flip)
    assert got.shape == want.shape and within_the_grid(got, record, box, size, flip)
    assert psnr(got, want) > 40


def test_most_crops_take_torchs_kernel_and_the_rest_pillows(monkeypatch):
    """RandomResizedCrop-like boxes (8% to all of a record's area) of a record about as much
    larger than the output as a fit 256 pack's are than 224, OpenCV off: torch resamples
    all but a few axes in a hundred, as they are or mirrored, Pillow the others; all within
    the grid's tolerance, both ways flipped."""
    monkeypatch.setenv("IMGPACK_OPENCV", "0")
    record = photo_like(148, 111, seed=8)
    axes, real_axis = [], cpuresample._axis
    monkeypatch.setattr(cpuresample, "_axis", lambda *a: (axes.append(real_axis(*a)), axes[-1])[1])
    rng = np.random.default_rng(4)
    runs, size = 100, 96
    for n in range(runs):
        area, aspect = 148 * 111 * rng.uniform(0.08, 1.0), math.exp(rng.uniform(-0.29, 0.29))
        w, h = min(math.sqrt(area * aspect), 148), min(math.sqrt(area / aspect), 111)
        left, top = rng.uniform(0, 148 - w), rng.uniform(0, 111 - h)
        box, flip = (left, top, left + w, top + h), bool(n % 2)
        got = resample_record(record, box, size, flip, np.empty((size, size, 3), np.uint8))
        assert within_the_grid(got, record, box, size, flip)
    assert len(axes) == 2 * runs and axes.count(None) <= 2 * runs // 50


@pytest.mark.parametrize("flip", [False, True])
def test_an_axis_no_grid_aligns_is_pillows(monkeypatch, flip):
    """A box 2/3 of the output long, a quarter of a pixel off a whole one: torch's grid
    steps by 2/3, so it meets the box's offsets at a quarter, a twelfth and five twelfths of a
    pixel from whole ones, read either way, none within ``ALIGN``. Pillow resamples that axis
    (alone, or both where both are so), exactly."""
    monkeypatch.setenv("IMGPACK_OPENCV", "0")
    record = photo_like(40, 30, seed=2)
    passes, real = [], cpuresample._pillow
    monkeypatch.setattr(
        cpuresample,
        "_pillow",
        lambda px, box, w, h: (passes.append((w, h)), real(px, box, w, h))[1],
    )
    for box in ((3.25, 2.0, 19.25, 18.0), (3.25, 5.25, 19.25, 21.25)):  # one axis, both
        assert cpuresample._axis(box[0], box[2], 24, 40) is None
        got = resample_record(record, box, 24, flip, np.empty((24, 24, 3), np.uint8))
        assert np.abs(got.astype(int) - pillow(record, box, 24, flip)).max() <= 1
    assert passes[0][0] == 24 != passes[0][1] and passes[1] == (24, 24)


def test_a_mirrored_grid_past_the_far_edge_still_samples_the_record(monkeypatch):
    """Enlarged boxes that end just short of the record's right or bottom edge, whose grid
    aligns only read from that edge (torch's: OpenCV off): the record's last column (row) is
    repeated beyond it, and each crop stays within the grid's tolerance of Pillow's."""
    monkeypatch.setenv("IMGPACK_OPENCV", "0")
    record = photo_like(40, 30, seed=5)
    rng, seen = np.random.default_rng(7), 0
    for _ in range(1500):
        # ending in the edge pixel's second half, enlarged: the repeated column (row) is
        # weighed by the first outputs kept
        right, bottom = 40 - rng.uniform(0.06, 0.3), 30 - rng.uniform(0.06, 0.3)
        box = (right - rng.uniform(4, 14), bottom - rng.uniform(4, 14), right, bottom)
        cols = cpuresample._axis(box[0], right, 32, 40)  # enlarged to 32
        rows = cpuresample._axis(box[1], bottom, 32, 30)
        past = [a for a, e in ((cols, 40), (rows, 30)) if a and a[3] and a[1] > e]
        if past and seen < 6:
            seen += 1
            got = resample_record(record, box, 32, seen % 2, np.empty((32, 32, 3), np.uint8))
            assert within_the_grid(got, record, box, 32, bool(seen % 2))
    assert seen == 6


def torchs_box(lo: float, hi: float, size: int, extent: int) -> tuple[float, float]:
    """The span torch's grid samples for one axis (``_axis``): the box moved by as much as
    its grid's start is from a whole pixel, the other way when read mirrored."""
    axis = cpuresample._axis(lo, hi, size, extent)
    if axis is None:
        return lo, hi  # Pillow's pass: the box itself
    x0, x1, k, mirrored = axis
    s = (hi - lo) / size
    if mirrored:
        start = extent - hi - k * s
        return lo - (extent - x1 - start), hi - (extent - x1 - start)
    start = lo - k * s
    return lo + x0 - start, hi + x0 - start


def test_on_noise_each_pixel_is_pillows_on_the_grid_torch_samples(monkeypatch):
    """On a noise record (where a missing tap shows, as on a photograph it does not), each
    output pixel is within a level of Pillow's resample of the box as torch's grid places
    it: every tap Pillow's filter weighs there reaches torch's kernel, at either end of an
    axis, read as it is or mirrored."""
    monkeypatch.setenv("IMGPACK_OPENCV", "0")
    rng = np.random.default_rng(11)
    checked = 0
    for n in range(300):
        w, h, c = int(rng.integers(2, 90)), int(rng.integers(2, 90)), int(rng.choice([1, 3]))
        record = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
        size = int(rng.choice([1, 3, 8, 17, 32, 48]))
        left, right = sorted(rng.uniform(0, w, 2))
        top, bottom = sorted(rng.uniform(0, h, 2))
        if n % 3 == 0:  # touching the near or far edges, where a tap is most easily lost
            left, bottom = (0.0, float(h)) if n % 2 else (left, bottom)
            right, top = (right, top) if n % 2 else (float(w), 0.0)
        if right - left < 0.05 or bottom - top < 0.05:
            continue
        (lx, rx), (ty, by) = torchs_box(left, right, size, w), torchs_box(top, bottom, size, h)
        if lx < 0 or ty < 0 or rx > w or by > h:
            continue  # past the edge, where the repeated edge pixel stands in (tested above)
        flip = bool(n % 2)
        got = resample_record(record, (left, top, right, bottom), size, flip,
                              np.empty((size, size, c), np.uint8))  # fmt: skip
        want = pillow(record, (lx, ty, rx, by), size, flip)
        assert np.abs(got.astype(int) - want).max() <= 1, (w, h, (left, top, right, bottom))
        checked += 1
    assert checked > 250


def pillows_weights(lo: float, hi: float, size: int, extent: int, shift: float) -> np.ndarray:
    """(size, extent) float weights of Pillow's BILINEAR resample of [lo, hi) to ``size``,
    each output's centre moved by ``shift`` record pixels: its filter as Pillow computes it
    (support max(scale, 1), taps from int(centre - support + 0.5) within the record,
    normalised), in float, where Pillow cannot be asked for a box past the record's edge."""
    scale = (hi - lo) / size
    support = max(scale, 1.0)
    weights = np.zeros((size, extent))
    for j in range(size):
        centre = lo + (j + 0.5) * scale + shift
        first = max(int(centre - support + 0.5), 0)
        last = min(int(centre + support + 0.5), extent)
        taps = np.arange(first, last)
        w = np.clip(1 - np.abs((taps - centre + 0.5) / support), 0, None)
        weights[j, first:last] = w / w.sum()
    return weights


def test_grids_that_start_or_end_past_the_record_weigh_only_its_pixels(monkeypatch):
    """torch's grids that start left of the record (a shrunk box near its edge, the k
    thrown-away outputs reading repeated pixels) or end past it (read mirrored): each kept
    output is within a level of Pillow's filter at the centre torch gives it, on noise."""
    monkeypatch.setenv("IMGPACK_OPENCV", "0")
    rng = np.random.default_rng(21)
    seen = 0
    for _ in range(400):
        w, h = int(rng.integers(20, 90)), int(rng.integers(20, 90))
        size = int(rng.choice([8, 17, 24]))
        left, right = rng.uniform(0, 3), w - rng.uniform(0, 3)  # near both edges, shrunk
        top, bottom = sorted(rng.uniform(0, h, 2))
        cols = cpuresample._axis(left, right, size, w)
        if cols is None or not (cols[0] < 0 or cols[1] > w) or bottom - top < 0.05:
            continue
        seen += 1
        record = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        got = resample_record(record, (left, top, right, bottom), size, False,
                              np.empty((size, size, 3), np.uint8))  # fmt: skip
        dx = torchs_box(left, right, size, w)[0] - left
        dy = torchs_box(top, bottom, size, h)[0] - top
        wx, wy = (
            pillows_weights(left, right, size, w, dx),
            pillows_weights(top, bottom, size, h, dy),
        )
        want = np.einsum("ih,hwc,jw->ijc", wy, record.astype(float), wx)
        assert np.abs(got - want).max() <= 1, (w, h, (left, top, right, bottom), size)
    assert seen > 20


@pytest.mark.parametrize("flip", [np.int64(2), 0.5, "yes", None, 0, np.bool_(True)])
def test_flip_is_read_as_python_reads_it(flip, crops):
    record, box = photo_like(61, 47, seed=3), (3.37, 5.81, 40.12, 30.6)
    out = resample_record(record, box, 24, flip, np.empty((24, 24, 3), np.uint8))
    want = resample_record(record, box, 24, bool(flip), np.empty((24, 24, 3), np.uint8))
    assert np.array_equal(out, want)


def test_from_and_into_views_of_any_strides(crops):
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
        hwc_out = np.zeros((size, size, 3, 2), np.uint8)[..., 0]  # no row is whole
        np.testing.assert_array_equal(resample_record(record, box, size, True, hwc_out), want)
        mirrored = np.zeros((size, size, 3), np.uint8)[:, ::-1]  # negative strides
        resample_record(record, box, size, False, mirrored)
        np.testing.assert_array_equal(mirrored[:, ::-1], want)


def test_enlarged_boxes_on_noise_are_within_a_level_of_pillows(monkeypatch):
    """OpenCV's path (the cpu extra): a box no larger than the output on either axis, at
    either edge or inside, flipped or not, on a noise record of 1 or 3 channels, is resampled
    within a level of Pillow's exact resample of the box itself (no grid to align), and
    OpenCV makes it; with ``IMGPACK_OPENCV=0`` torch's kernel does."""
    pytest.importorskip("cv2")
    from imgpack.reader import warp

    made, real = [], warp.warp_record
    monkeypatch.setattr(warp, "warp_record", lambda *a: (made.append(1), real(*a))[1])
    monkeypatch.delenv("IMGPACK_OPENCV", raising=False)
    rng = np.random.default_rng(12)
    for n in range(200):
        w, h, c = int(rng.integers(2, 90)), int(rng.integers(2, 90)), int(rng.choice([1, 3]))
        record = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
        size = int(rng.choice([1, 3, 8, 17, 32, 48]))
        bw, bh = rng.uniform(0.0, min(size, w)), rng.uniform(0.0, min(size, h))
        left = 0.0 if n % 3 == 0 else rng.uniform(0, w - bw)
        top = h - bh if n % 5 == 0 else rng.uniform(0, h - bh)
        box, flip = (left, top, left + bw, top + bh), bool(n % 2)
        got = resample_record(record, box, size, flip, np.empty((size, size, c), np.uint8))
        want = pillow(record, box, size, flip)
        assert np.abs(got.astype(int) - want).max() <= 1, (w, h, box, size, flip)
    assert len(made) == 200
    monkeypatch.setenv("IMGPACK_OPENCV", "0")
    resample_record(record, box, size, flip, np.empty((size, size, c), np.uint8))
    assert len(made) == 200


def test_a_read_only_out_is_refused_and_left_as_it_was(tmp_path):
    record, size = photo_like(40, 30, seed=1), 20
    frozen = np.zeros((size, size, 3), np.uint8)
    frozen.flags.writeable = False
    path = tmp_path / "out.bin"
    path.write_bytes(bytes(size * size * 3))
    mapped = np.memmap(path, np.uint8, "r", shape=(size, size, 3))
    for out in (frozen, mapped):
        with pytest.raises(InvalidArgumentError, match="out should be writable"):
            resample_record(record, (1, 1, 30, 25), size, False, out)
        assert not out.any()


def test_pillow_reads_only_what_its_filter_reaches():
    assert reach(10.3, 20.7, 5, 100) == (7, 24)  # shrink x2.08: support 2.08 each side, +1
    assert reach(10.3, 20.7, 50, 100) == (8, 23)  # upscale: support 1
    assert reach(0.0, 100.0, 10, 100) == (0, 100)  # within the record


@pytest.mark.parametrize(
    ("src", "box", "size", "out", "message"),
    [
        (
            np.zeros((4, 4, 3), np.float32),
            (0, 0, 4, 4),
            2,
            np.zeros((2, 2, 3), np.uint8),
            r"src should be a uint8 \(h, w, C\) array, found float32",
        ),
        (
            np.zeros((4, 4, 2), np.uint8),
            (0, 0, 4, 4),
            2,
            np.zeros((2, 2, 2), np.uint8),
            "src should have 1 or 3 channels",
        ),
        (
            np.zeros((4, 4, 3), np.uint8),
            (0, 0, 4, 4),
            0,
            np.zeros((2, 2, 3), np.uint8),
            "size should be a positive int, found 0",
        ),
        (
            np.zeros((4, 4, 3), np.uint8),
            (0, 0, 4, 4),
            2,
            np.zeros((2, 3, 3), np.uint8),
            r"out should be a uint8 \(2, 2, 3\) array, found uint8 \(2, 3, 3\)",
        ),
        (
            np.zeros((4, 4, 3), np.uint8),
            (0, 0, 4),
            2,
            np.zeros((2, 2, 3), np.uint8),
            "box should be 4 numbers",
        ),
        (
            np.zeros((4, 4, 3), np.uint8),
            (0, 0, 4, float("nan")),
            2,
            np.zeros((2, 2, 3), np.uint8),
            "box should be finite",
        ),
    ],  # fmt: skip
)
def test_bad_arguments_are_refused(src, box, size, out, message):
    with pytest.raises(InvalidArgumentError, match=message):
        resample_record(src, box, size, False, out)


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
def test_on_a_pack_the_crops_are_the_device_transforms(src, tmp_path, codec, mode, crops):
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
def test_a_large_enlarged_crop(flip, crops):
    """A 300 x 300 output (OpenCV spreads it over its own threads) of an enlarged box:
    OpenCV's within a level of Pillow's, torch's within its grid's tolerance."""
    record = photo_like(200, 150, seed=6)
    box = (10.3, 7.9, 190.6, 141.2)
    got = resample_record(record, box, 300, flip, np.empty((300, 300, 3), np.uint8))
    if crops == "on":
        assert np.abs(got.astype(int) - pillow(record, box, 300, flip)).max() <= 1
    else:
        assert within_the_grid(got, record, box, 300, flip)


@pytest.mark.parametrize("box", [(0.0, 29.5, 40.0, 30.0), (39.5, 0.0, 40.0, 30.0)])
def test_a_mirrored_record_read_one_row_or_column_wide(box, crops):
    """A record with negative strides whose box spans one row (or column): numpy calls that
    view contiguous and keeps its negative stride, which torch refuses."""
    record = photo_like(40, 30, seed=4)
    for src in (record[::-1], record[:, ::-1]):
        got = resample_record(src, box, 8, False, np.empty((8, 8, 3), np.uint8))
        want = resample_record(src.copy(), box, 8, False, np.empty((8, 8, 3), np.uint8))
        np.testing.assert_array_equal(got, want)


def with_a_cv2(tmp_path, module: str, *args: str) -> subprocess.CompletedProcess:
    """``python *args`` in a fresh interpreter whose ``import cv2`` runs ``module`` instead of
    OpenCV (written to tmp_path, first on the path), with OpenCV's switch left on."""
    (tmp_path / "cv2.py").write_text(module + "\n")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), root])}
    env.pop("IMGPACK_OPENCV", None)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_an_opencv_4_is_left_alone(tmp_path):
    """OpenCV 4 places warpAffine's samples to 1/32 pixel (up to 7 levels off Pillow's on a
    sharp edge): the crops go to torch's kernel, silently, as without OpenCV."""
    code = (
        "from imgpack.jit import compiled\nprint(compiled('imgpack.reader.warp', 'IMGPACK_OPENCV'))"
    )
    got = with_a_cv2(tmp_path, "__version__ = '4.10.0'", "-W", "error", "-c", code)
    assert got.returncode == 0 and got.stdout.strip() == "None", got.stderr[-2000:]


_CROP = (
    "import numpy as np, warnings\n"
    "from imgpack.reader.cpuresample import resample_record\n"
    "record = np.arange(30 * 40 * 3, dtype=np.uint8).reshape(30, 40, 3)\n"
    "with warnings.catch_warnings(record=True) as seen:\n"
    "    warnings.simplefilter('always')\n"
    "    out = resample_record(record, (5.3, 4.1, 19.7, 17.2), 20, True,\n"
    "                          np.empty((20, 20, 3), np.uint8))\n"
    "print(out.tobytes().hex()); print([str(w.message) for w in seen])\n"
)


@pytest.mark.parametrize(
    ("module", "warned"),
    [
        ("raise ImportError('libGL.so.1: cannot open shared object file')", False),
        ("raise RuntimeError('numpy.core.multiarray failed to import')", True),
    ],
    ids=["missing", "broken"],
)
def test_an_opencv_that_cannot_load_leaves_the_crop_to_torch(tmp_path, module, warned):
    """A cv2 that fails to import (no GUI library for a non-headless build, a wheel built for
    another numpy) must not stop a read: torch's kernel crops, a broken one says so once."""
    got = with_a_cv2(tmp_path, module, "-c", _CROP)
    assert got.returncode == 0, got.stderr[-2000:]
    pixels, messages = got.stdout.strip().splitlines()
    record = np.arange(30 * 40 * 3, dtype=np.uint8).reshape(30, 40, 3)
    out = np.frombuffer(bytes.fromhex(pixels), np.uint8).reshape(20, 20, 3)
    assert within_the_grid(out, record, (5.3, 4.1, 19.7, 17.2), 20, True)
    assert ("imgpack.reader.warp failed to load" in messages) == warned
