"""Which JPEG sources a jpeg pack stores as they came, and that every other one is re-encoded."""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import photo_like
from PIL import Image

from imgpack.format.index import read_index
from imgpack.packer.decode import DecodeSettings
from imgpack.packer.jpeg import is_record_stream
from imgpack.packer.pack import pack_folder
from imgpack.packer.parallel import decode_sample

FIT = DecodeSettings(40, 40, resize="fit", codec="jpeg")


def jpeg(w=40, h=30, seed=0, mode="RGB", **kw) -> bytes:
    img = Image.fromarray(photo_like(w, h, seed))
    buf = io.BytesIO()
    img.convert(mode).save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def write(tmp_path: Path, data: bytes, name="x.jpg") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def stored_as_is(path: Path, settings: DecodeSettings) -> bytes | None:
    """The record's bytes where the packer stores the source as it came, else None."""
    stored, info = decode_sample(str, path.name, path, settings)
    return None if stored is None or not info[3] else bytes(stored)


def _with_segment(data: bytes, marker: int, payload: bytes) -> bytes:
    """``data`` with one more segment right after SOI."""
    seg = bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload
    return data[:2] + seg + data[2:]


def test_a_baseline_jpeg_that_fits_is_kept_byte_for_byte(tmp_path):
    data = jpeg()
    stored, ((crc, sums, _), geometry, size, as_is) = decode_sample(
        str, "a", write(tmp_path, data), FIT
    )
    assert bytes(stored) == data and size == (40, 30) and as_is
    assert geometry.source_box == (0.0, 0.0, 40.0, 30.0) == geometry.content_box
    decoded = np.asarray(Image.open(io.BytesIO(data)))
    assert list(sums) == [int(decoded[..., c].sum()) for c in range(3)]  # Pillow's decode


@pytest.mark.parametrize(
    "why, data",
    [
        ("progressive", jpeg(progressive=True)),
        ("too large: resized", jpeg(64, 48)),
        ("one component in an RGB pack", jpeg(mode="L")),
        ("CMYK", jpeg(mode="CMYK")),
        ("bytes after EOI", jpeg() + b"trailer"),
        ("a second image after EOI", jpeg() + jpeg(8, 8)),
        ("libjpeg warns: extraneous bytes before EOI", jpeg()[:-2] + b"\x00\x00" + b"\xff\xd9"),
        ("cut short", jpeg()[:-40]),
        ("not a JPEG", b"\x89PNG\r\n\x1a\n" + bytes(40)),
        (
            "Adobe: RGB components",
            _with_segment(jpeg(), 0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x00"),
        ),
    ],
)
def test_every_doubt_means_re_encoding(tmp_path, why, data):
    assert stored_as_is(write(tmp_path, data), FIT) is None, why


def test_exif_rotation_is_applied_not_kept_and_orientation_1_is_kept(tmp_path):
    for value, kept in ((6, False), (1, True)):
        exif = Image.Exif()
        exif[0x0112] = value
        path = write(tmp_path, jpeg(exif=exif.tobytes()), f"o{value}.jpg")
        assert (stored_as_is(path, FIT) is not None) is kept, value


def test_grayscale_pack_keeps_grayscale_jpegs_and_444_sources_keep_their_sampling(tmp_path):
    gray = DecodeSettings(40, 40, resize="fit", codec="jpeg", channels=1)
    assert stored_as_is(write(tmp_path, jpeg(mode="L"), "g.jpg"), gray) is not None
    assert stored_as_is(write(tmp_path, jpeg(), "c.jpg"), gray) is None
    full = jpeg(subsampling=0)  # 4:4:4: still a baseline YCbCr stream any decoder reads
    assert stored_as_is(write(tmp_path, full, "f.jpg"), FIT) == full


@pytest.mark.parametrize(
    "settings, size, kept",
    [
        (DecodeSettings(40, 30, resize="center-crop", codec="jpeg"), (40, 30), True),
        (DecodeSettings(40, 30, resize="center-crop", codec="jpeg"), (41, 30), False),
        (DecodeSettings(40, 30, crop_ratio=0.875, codec="jpeg"), (40, 30), False),
        (DecodeSettings(40, 30, resize="stretch", codec="jpeg"), (40, 30), True),
        (DecodeSettings(40, 30, resize="pad", codec="jpeg"), (40, 30), True),
        (DecodeSettings(40, 30, resize="pad", codec="jpeg"), (20, 30), False),  # letterboxed
        (DecodeSettings(40, 40, resize="fit", codec="jpeg"), (40, 30), True),
        (DecodeSettings(40, 40, resize="fit", codec="jpeg"), (12, 7), True),
        (DecodeSettings(40, 40, resize="fit", codec="jpeg"), (41, 30), False),
    ],
)  # fmt: skip
def test_only_a_record_that_is_its_whole_source_at_its_own_size_is_kept(
    tmp_path, settings, size, kept
):
    assert (stored_as_is(write(tmp_path, jpeg(*size)), settings) is not None) is kept


def test_a_record_stream_is_told_by_its_markers_alone():
    assert is_record_stream(jpeg(40, 30), (40, 30), 3)
    assert is_record_stream(jpeg(mode="L"), (40, 30), 1)
    assert not is_record_stream(jpeg(40, 30), (30, 40), 3)  # another size
    assert not is_record_stream(jpeg(mode="L"), (40, 30), 3)  # another component count
    assert not is_record_stream(jpeg(progressive=True), (40, 30), 3)  # not baseline
    assert not is_record_stream(jpeg() + b"x", (40, 30), 3)  # bytes after its EOI
    assert not is_record_stream(_with_segment(jpeg(), 0xEE, b"Adobe" + bytes(7)), (40, 30), 3)
    assert not is_record_stream(b"\xff\xd8\xff\xd9", (40, 30), 3)
    assert not is_record_stream(b"", (40, 30), 3)
    assert not is_record_stream(jpeg()[:30], (40, 30), 3)  # cut inside its headers


def test_a_kept_source_larger_than_a_ring_slot_still_arrives_whole(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    big = jpeg(12, 9, comment=b"x" * 60000)  # 60 kB of comment around 108 pixels
    for k in range(6):
        (src / "a" / f"{k}.jpg").write_bytes(big if k == 3 else jpeg(12, 9, seed=k))
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(40, 40), resize="fit", codec="jpeg", workers=2, progress=False)
    ix = read_index(out)
    assert json.loads(out.with_suffix(".json").read_text())["jpeg"]["stored_as_is"] == 6
    a, b = (ix.data_offset + int(v) for v in ix.record_offsets[3:5])
    assert out.read_bytes()[a:b] == big


def test_a_bomb_is_left_to_the_ordinary_path_which_names_it(tmp_path):
    data = bytearray(jpeg())
    sof = data.index(b"\xff\xc0")  # its frame header says 10000 x 10000: over our limit
    data[sof + 5 : sof + 9] = (10000).to_bytes(2, "big") * 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # 1e8 > Pillow's 8.9e7
        whole = DecodeSettings(10000, 10000, resize="fit", codec="jpeg")  # kept at its size
        path = write(tmp_path, bytes(data), "big.jpg")
        assert stored_as_is(path, whole) is None
        assert decode_sample(str, "big.jpg", path, whole) == (
            None,
            "decompression bomb: 10000x10000 = 100000000 pixels > limit 89478485",
        )
    Image.MAX_IMAGE_PIXELS, old = 500, Image.MAX_IMAGE_PIXELS  # Pillow's own limit, 2x over
    try:
        assert stored_as_is(write(tmp_path, jpeg(), "b.jpg"), FIT) is None
    finally:
        Image.MAX_IMAGE_PIXELS = old
