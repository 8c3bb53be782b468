"""Version 3's yuv420 codec and record arithmetic: the definition in docs/format.md, pinned."""

from __future__ import annotations

import numpy as np
import pytest

from imgpack.format.codec import YUV420_OFFSETS, rgb_to_yuv420, yuv420_planes, yuv420_to_rgb
from imgpack.format.layout import CODECS, record_nbytes, record_offsets


def _pixel(r, g, b) -> np.ndarray:
    return np.array([[[r, g, b]]], dtype=np.uint8)


@pytest.mark.parametrize(
    ("rgb", "yuv", "back"),
    [
        ((255, 0, 0), (76, 85, 255), (254, 0, 0)),  # JPEG's red: Cr 255.5 clips to 255
        ((0, 255, 0), (150, 44, 21), (0, 255, 1)),
        ((0, 0, 255), (29, 255, 107), (0, 0, 254)),
        ((255, 255, 255), (255, 128, 128), (255, 255, 255)),
        ((0, 0, 0), (0, 128, 128), (0, 0, 0)),
        ((77, 77, 77), (77, 128, 128), (77, 77, 77)),  # grey survives exactly
    ],
)
def test_one_pixel_by_hand(rgb, yuv, back):
    stored = rgb_to_yuv420(_pixel(*rgb))
    assert stored.dtype == np.uint8 and stored.tolist() == list(yuv)
    assert yuv420_to_rgb(stored, 1, 1).reshape(3).tolist() == list(back)


def test_planes_and_odd_sizes():
    """5x3: Y 3 rows of 5, then Cb and Cr of 2 rows of 3; edge samples average what exists."""
    rgb = np.zeros((3, 5, 3), np.uint8)
    rgb[..., 2] = np.arange(15, dtype=np.uint8).reshape(3, 5) * 10  # blue only
    stored = rgb_to_yuv420(rgb)
    assert stored.size == 15 + 2 * 3 * 2 == record_nbytes("yuv420", 5, 3, 3)
    y, cb, cr = yuv420_planes(stored, 5, 3)
    assert y.shape == (3, 5) and cb.shape == cr.shape == (2, 3)
    blue = rgb[..., 2].astype(float)
    want_cb = [
        [blue[0:2, 0:2].mean(), blue[0:2, 2:4].mean(), blue[0:2, 4:5].mean()],
        [blue[2:3, 0:2].mean(), blue[2:3, 2:4].mean(), blue[2:3, 4:5].mean()],
    ]
    assert cb.tolist() == np.floor(128 + 0.5 * np.array(want_cb) + 0.5).astype(int).tolist()
    assert y.tolist() == np.floor(0.114 * blue + 0.5).astype(int).tolist()


def test_back_kernels_is_the_formula_rounded_half_up():
    """Exact integers; equal to float64 R = Y + 1.402 dr, B = Y + 1.772 db and
    G = Y - (0.344136 db + 0.714136 dr), then floor(x + 0.5) clipped."""
    rng = np.random.default_rng(0)
    for w, h in [(64, 48), (7, 5), (1, 9)]:
        stored = rng.integers(0, 256, record_nbytes("yuv420", w, h, 3), dtype=np.uint8)
        y, cb, cr = (p.astype(np.float64) for p in yuv420_planes(stored, w, h))
        db = (cb - 128).repeat(2, 0).repeat(2, 1)[:h, :w]
        dr = (cr - 128).repeat(2, 0).repeat(2, 1)[:h, :w]
        want = np.stack(
            [y + 1.402 * dr, y - (0.344136 * db + 0.714136 * dr), y + 1.772 * db], axis=-1
        )
        got = yuv420_to_rgb(stored, w, h)
        assert got.shape == (h, w, 3) and got.dtype == np.uint8
        np.testing.assert_array_equal(got, np.clip(np.floor(want + 0.5), 0, 255))


def test_a_photo_survives_within_a_few_levels(tmp_path):
    """A photograph comes back as the spec's bytes (the exhaustive test below covers every
    (Y, Cb, Cr); photographs add smooth chroma at odd sizes), within a few levels of it."""
    from conftest import photo_like

    for w, h in [(64, 48), (255, 171), (97, 200)]:
        stored = rgb_to_yuv420(photo_like(w, h))
        back = yuv420_to_rgb(stored, w, h)
        np.testing.assert_array_equal(back, _spec(stored, w, h))
    assert np.abs(back.astype(int) - photo_like(w, h)).mean() < 4


def test_record_nbytes_and_offsets_on_ints_and_arrays():
    assert record_nbytes("raw", 3, 2, 3) == 18 and record_nbytes("raw", 3, 2, 1) == 6
    assert record_nbytes("yuv420", 3, 2, 3) == 6 + 2 * 2 * 1
    assert record_nbytes("yuv420", 1, 1, 3) == 3
    w, h = np.array([3, 2, 224]), np.array([2, 1, 224])
    got = record_nbytes("yuv420", w, h, 3)
    assert isinstance(got, np.ndarray) and got.tolist() == [10, 4, 224 * 224 * 3 // 2]
    sizes = np.array([[3, 2], [2, 1], [1, 1]])
    offsets = record_offsets("raw", sizes, 3)
    assert offsets.dtype == np.int64 and offsets.tolist() == [0, 18, 24, 27]
    assert record_offsets("yuv420", sizes, 3).tolist() == [0, 10, 14, 17]
    assert record_offsets("raw", np.zeros((0, 2)), 3).tolist() == [0]
    assert CODECS == ("raw", "yuv420", "jpeg")  # the header's codec numbers 0, 1, 2


def _spec(buf: np.ndarray, w: int, h: int) -> np.ndarray:
    """The back-kernels exactly as docs/format.md writes it, per pixel (int32 holds it)."""
    y, cb, cr = (p.astype(np.int32) for p in yuv420_planes(buf, w, h))
    db = (cb - 128).repeat(2, 0).repeat(2, 1)[:h, :w]
    dr = (cr - 128).repeat(2, 0).repeat(2, 1)[:h, :w]
    scaled = [y * 10**6 + 1_402_000 * dr, y * 10**6 - 344_136 * db - 714_136 * dr,
              y * 10**6 + 1_772_000 * db]  # fmt: skip
    return np.stack([np.clip((s + 500_000) // 10**6, 0, 255) for s in scaled], -1)


def test_back_kernels_on_every_y_cb_cr():
    """All 2^24 (Y, Cb, Cr) against the spec's per-pixel rule: 64 records of 512x512 whose
    256x256 chroma samples are every (Cb, Cr) once, and whose 2x2 blocks hold Y = r, r + 64,
    r + 128, r + 192 (record r)."""
    cb, cr = (
        c.astype(np.uint8) for c in np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    )
    block = np.array([[0, 64], [128, 192]], dtype=np.uint8)
    for r in range(64):
        y = np.tile(block + r, (256, 256))
        buf = np.concatenate([y.reshape(-1), cb.reshape(-1), cr.reshape(-1)])
        np.testing.assert_array_equal(yuv420_to_rgb(buf, 512, 512), _spec(buf, 512, 512))


def test_the_offsets_table_is_the_exact_rule():
    d = np.arange(256, dtype=np.int64) - 128
    db, dr = d[:, None], d[None, :]
    for k, scaled in enumerate(
        [1_402_000 * dr + 0 * db, -344_136 * db - 714_136 * dr, 1_772_000 * db + 0 * dr]
    ):
        np.testing.assert_array_equal(YUV420_OFFSETS[k], (scaled + 500_000) // 10**6)
    assert YUV420_OFFSETS.dtype == np.int16 and not YUV420_OFFSETS.flags.writeable
    # 1.772 * (253 - 128) = 221.5 exactly: rounded half up
    assert YUV420_OFFSETS[2, 253, 0] == 222 and YUV420_OFFSETS[2, 3, 0] == -221


@pytest.mark.parametrize(
    ("w", "h"), [(1, 1), (3, 5), (5, 3), (1, 6), (6, 1), (2, 2), (7, 7), (33, 18), (64, 48)]
)
def test_back_kernels_on_any_size_equals_the_spec(w, h):
    rng = np.random.default_rng(w * 100 + h)
    buf = rng.integers(0, 256, record_nbytes("yuv420", w, h, 3), dtype=np.uint8)
    np.testing.assert_array_equal(yuv420_to_rgb(buf, w, h), _spec(buf, w, h))


@pytest.mark.parametrize(("w", "h"), [(5, 3), (3, 5), (8, 6), (1, 1)])
def test_back_kernels_into_a_slot_of_a_canvas(w, h):
    """``out`` as a slot of a wider HWC canvas, and as a planar (3, H, W) canvas's transpose:
    the record's pixels land there, nothing around them is touched."""
    rng = np.random.default_rng(0)
    buf = rng.integers(0, 256, record_nbytes("yuv420", w, h, 3), dtype=np.uint8)
    want = _spec(buf, w, h)
    hwc = np.full((2, h + 3, w + 4, 3), 7, dtype=np.uint8)
    got = yuv420_to_rgb(buf, w, h, out=hwc[1, 1 : h + 1, 2 : w + 2])
    assert got.base is not None and np.shares_memory(got, hwc)
    np.testing.assert_array_equal(hwc[1, 1 : h + 1, 2 : w + 2], want)
    hwc[1, 1 : h + 1, 2 : w + 2] = 7
    assert (hwc == 7).all()
    planar = np.full((2, 3, h + 1, w + 2), 7, dtype=np.uint8)
    yuv420_to_rgb(buf, w, h, out=planar[1, :, :h, :w].transpose(1, 2, 0))
    np.testing.assert_array_equal(planar[1, :, :h, :w].transpose(1, 2, 0), want)
    planar[1, :, :h, :w] = 7
    assert (planar == 7).all()


def _record(w: int, h: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, record_nbytes("yuv420", w, h, 3), dtype=np.uint8)


@pytest.mark.parametrize(("w", "h"), [(5, 3), (8, 6), (1, 1), (33, 2)])
def test_back_kernels_into_any_view_a_user_may_pass(w, h, tmp_path):
    """Other strides than a canvas slot's: an RGBA canvas's first three channels, a transposed
    (w, h, 3) array, channels reversed (a negative stride), and a read-only mapped record."""
    buf = _record(w, h, w * h)
    want = _spec(buf, w, h)
    rgba = np.full((h, w, 4), 9, dtype=np.uint8)
    yuv420_to_rgb(buf, w, h, out=rgba[..., :3])
    np.testing.assert_array_equal(rgba[..., :3], want)
    assert (rgba[..., 3] == 9).all()
    columns = np.zeros((w, h, 3), dtype=np.uint8).transpose(1, 0, 2)
    np.testing.assert_array_equal(yuv420_to_rgb(buf, w, h, out=columns), want)
    bgr = np.zeros((h, w, 3), dtype=np.uint8)
    yuv420_to_rgb(buf, w, h, out=bgr[..., ::-1])
    np.testing.assert_array_equal(bgr, want[..., ::-1])
    inplace = np.zeros((h, w, 3), dtype=np.uint8)  # a record read into its own canvas
    inplace.reshape(-1)[: buf.size] = buf
    yuv420_to_rgb(inplace.reshape(-1)[: buf.size], w, h, out=inplace)
    np.testing.assert_array_equal(inplace, want)
    buf.tofile(tmp_path / "record.bin")
    mapped = np.memmap(tmp_path / "record.bin", dtype=np.uint8, mode="r")
    np.testing.assert_array_equal(yuv420_to_rgb(mapped, w, h), want)
    del mapped
