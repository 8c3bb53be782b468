"""Version 3's yuv420 codec and record arithmetic: the definition in docs/format.md, pinned."""

from __future__ import annotations

import numpy as np
import pytest

from imgpack.errors import InvalidArgumentError
from imgpack.format.codec import rgb_to_yuv420, yuv420_planes, yuv420_to_rgb
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


def test_back_conversion_is_the_formula_rounded_half_up():
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
    from conftest import photo_like

    rgb = photo_like(64, 48)
    back = yuv420_to_rgb(rgb_to_yuv420(rgb), 64, 48)
    assert np.abs(back.astype(int) - rgb).mean() < 4


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
    with pytest.raises(InvalidArgumentError, match="codec 'webp' is not one of raw, yuv420, jpeg"):
        record_nbytes("webp", 1, 1, 3)
    with pytest.raises(InvalidArgumentError, match="codec yuv420 stores 3 channels, got 1"):
        record_nbytes("yuv420", 1, 1, 1)


@pytest.mark.parametrize(
    "bad",
    [np.zeros((2, 2), np.uint8), np.zeros((2, 2, 1), np.uint8), np.zeros((0, 2, 3), np.uint8)],
)
def test_the_codec_refuses_what_it_cannot_hold(bad):
    with pytest.raises(InvalidArgumentError, match="takes an \\(h, w, 3\\) uint8 image"):
        rgb_to_yuv420(bad)
    with pytest.raises(InvalidArgumentError, match="a 2x2 yuv420 record has 6 bytes, got 5"):
        yuv420_to_rgb(np.zeros(5, np.uint8), 2, 2)
