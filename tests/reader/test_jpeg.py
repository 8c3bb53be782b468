"""imgpack.reader.jpeg: records decoded as Pillow decodes them, at every DCT scale, and a
damaged record named in one FormatError."""

from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
from conftest import photo_like
from PIL import Image

from imgpack.errors import FormatError
from imgpack.reader import jpeg


def encoded(width: int, height: int, seed: int = 0, mode: str = "RGB", **save) -> bytes:
    image = Image.fromarray(photo_like(width, height, seed))
    out = io.BytesIO()
    image.convert(mode).save(out, "JPEG", quality=save.pop("quality", 90), **save)
    return out.getvalue()


def pillow(data: bytes, scale: int = 1, mode: str = "RGB") -> np.ndarray:
    """Pillow's decode at 1/scale (its draft picks the scale from a requested size)."""
    image = Image.open(io.BytesIO(data))
    w, h = image.size
    if scale > 1:
        image.draft(mode, (max(1, w // scale), max(1, h // scale)))
    out = np.asarray(image.convert(mode))
    return out if out.ndim == 3 else out[..., None]


@pytest.mark.parametrize("size", [(64, 48), (33, 17), (1, 1), (9, 200)])
@pytest.mark.parametrize("scale", jpeg.SCALES)
def test_decode_is_pillows_decode_at_every_scale(size, scale):
    w, h = size
    data = encoded(w, h, seed=w)
    got = jpeg.decode(data, w, h, 3, scale=scale)
    sw, sh = jpeg.scaled_size(w, h, scale)
    assert got.shape == (sh, sw, 3) and got.dtype == np.uint8
    want = pillow(data, scale)
    if want.shape == got.shape:  # Pillow's draft reaches this scale (not for 1 px sides)
        np.testing.assert_array_equal(got, want)


def test_grayscale_records_decode_to_one_channel():
    data = encoded(30, 20, mode="L")
    got = jpeg.decode(np.frombuffer(data, np.uint8), 30, 20, 1)
    np.testing.assert_array_equal(got, pillow(data, mode="L"))
    with pytest.raises(FormatError, match="Gray colour space in a pack of 3"):
        jpeg.decode(data, 30, 20, 3)
    with pytest.raises(FormatError, match="YCbCr colour space in a pack of 1"):
        jpeg.decode(encoded(30, 20), 30, 20, 1)


def test_decode_into_a_callers_array():
    data = encoded(40, 24)
    out = np.full((12, 20, 3), 7, np.uint8)
    assert np.shares_memory(jpeg.decode(data, 40, 24, 3, scale=2, out=out), out)
    np.testing.assert_array_equal(out, jpeg.decode(data, 40, 24, 3, scale=2))


def damaged() -> dict[str, tuple[bytes, str]]:
    good = encoded(32, 24)
    flipped = bytearray(good)
    for k in range(len(good) // 2, len(good) - 2, 7):  # entropy-coded bytes scrambled
        flipped[k] ^= 0x5A
    return {
        "empty": (b"", "0 bytes that do not start"),
        "not jpeg": (b"\x89PNG\r\n\x1a\n" + good[8:], "do not start with a JPEG SOI"),
        "soi only": (b"\xff\xd8", "do not start"),
        "truncated": (good[: len(good) // 2], "damaged JPEG record"),
        "no header": (good[:2] + b"\x00" * 64, "damaged JPEG record"),
        "scrambled": (bytes(flipped), "damaged JPEG record"),
    }


@pytest.mark.parametrize("case", sorted(damaged()))
def test_a_damaged_record_is_one_format_error_naming_it(case):
    data, match = damaged()[case]
    with pytest.raises(FormatError, match=match) as e:
        jpeg.decode(data, 32, 24, 3, where="train.bin record 12")
    assert str(e.value).startswith("train.bin record 12: damaged JPEG record (")


def test_a_header_of_another_size_is_damage_not_a_bigger_decode():
    data = encoded(32, 24)
    with pytest.raises(FormatError, match="its header says 32x24, the index 31x24"):
        jpeg.decode(data, 31, 24, 3, where="a.bin record 0")
    out = np.zeros((24, 31, 3), np.uint8)
    with pytest.raises(FormatError, match="header says"):
        jpeg.decode(data, 31, 24, 3, out=out)


def test_pick_scale_keeps_the_crop_four_times_the_output_and_goes_no_lower_than_half():
    assert jpeg.GAP == 4 and jpeg.PICK_SCALES == (1, 2)
    assert pick_scale(1792, 1792, 224, 224) == 2
    assert pick_scale(1791, 2000, 224, 224) == 1
    assert pick_scale(1344, 1344, 224, 224) == 1  # three times the output at 1/2: not enough
    assert pick_scale(896, 896, 112, 112) == 2
    assert pick_scale(8000, 6000, 224, 224) == 2  # never 1/4 or 1/8 (jpeg.GAP says why)
    assert pick_scale(10, 10, 224, 224) == 1  # an upscale: the full decode
    boxes = np.array([[0, 0, 1792, 1792], [10, 10, 905, 1044], [0, 0, 3584, 3600], [5, 5, 15, 15]])
    assert jpeg.pick_scales(boxes, 224, 224).tolist() == [2, 1, 2, 1]


def test_a_picked_scale_is_decoded_at_exactly_its_size():
    """libjpeg may decode a side of at most 5 pixels at another factor than 1/d (3 pixels
    at 5/8 and at 1/2 both give 2); the scale picked for any box of a record, to any
    output, is one it decodes at exactly ``scaled_size``."""
    for w, h in [(1, 1), (3, 3), (5, 5), (3, 200), (7, 9), (8, 8), (9, 17), (16, 16)]:
        data = simplejpeg.encode_jpeg(np.full((h, w, 3), 128, np.uint8), 90)
        box = np.array([[0.0, 0.0, w, h]])
        for out in (1, 2, 3):
            d = int(jpeg.pick_scales(box, out, out)[0])
            sw, sh = jpeg.scaled_size(w, h, d)
            assert jpeg.decode(data, w, h, 3, scale=d).shape == (sh, sw, 3)
            assert d == (2 if min(w, h) >= 8 * out else 1)


def pick_scale(box_w, box_h, out_w, out_h):
    """``jpeg.pick_scales`` of one box."""
    return int(jpeg.pick_scales(np.array([[0.0, 0.0, box_w, box_h]]), out_w, out_h)[0])
