"""jpeg packs written by PackWriter: the records read back as JPEG streams a stranger can decode."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from conftest import photo_like
from PIL import Image

from imgpack.errors import InvalidArgumentError
from imgpack.format.index import read_index
from imgpack.format.layout import record_offsets
from imgpack.packer.writer import PackWriter

SIZES = [(20, 16), (7, 5), (1, 1), (13, 16)]  # (width, height) within a 16 x 20 bound


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def _source_jpeg(rgb: np.ndarray, quality: int = 95) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


@pytest.mark.parametrize("channels", [3, 1])
def test_jpeg_pack_round_trips_through_record_offsets_and_pillow(tmp_path, channels):
    records = [photo_like(w, h, seed=k)[..., :channels] for k, (w, h) in enumerate(SIZES)]
    own = _source_jpeg(photo_like(20, 16, seed=9)) if channels == 3 else None
    with PackWriter(
        tmp_path / "p.bin",
        height=16,
        width=20,
        classes=["a"],
        channels=channels,
        codec="jpeg",
        quality=85,
    ) as wr:
        for k, rec in enumerate(records):
            wr.append(rec, 0, f"a/{k}.png")
        if own is not None:
            wr.append(own, 0, "a/own.jpg", size=(20, 16), as_is=True)
        wr.finish(packer={})

    index = read_index(tmp_path / "p.json")
    n = len(records) + (own is not None)
    assert (index.codec, index.quality, index.uniform, index.count) == ("jpeg", 85, False, n)
    raw = json.loads((tmp_path / "p.json").read_text())
    assert raw["jpeg"] == {
        "quality": 85,
        "subsampling": "4:2:0" if channels == 3 else "4:0:0",
        "stored_as_is": int(own is not None),
    }
    assert raw["fields"]["record_length"]["required"] is True
    offsets = record_offsets("jpeg", index.record_sizes, channels, index.record_lengths)
    assert offsets.tolist() == index.record_offsets.tolist()
    assert offsets[-1] == raw["sections"]["pixels"]["nbytes"]
    data = (tmp_path / "p.bin").read_bytes()
    for i, rec in enumerate(records):
        stream = data[index.data_offset + offsets[i] : index.data_offset + offsets[i + 1]]
        assert stream[:2] == b"\xff\xd8" and stream[-2:] == b"\xff\xd9"
        img = Image.open(io.BytesIO(stream))
        assert img.size == SIZES[i] and img.mode == ("RGB" if channels == 3 else "L")
        back = np.asarray(img).reshape(rec.shape)
        if rec.size > 3:  # a 1x1 record is too small to judge
            assert _psnr(back, rec) > 24  # tiny, busy records at 4:2:0: a sanity bound
    if own is not None:
        assert data[index.data_offset + offsets[-2] : index.data_offset + offsets[-1]] == own


def test_jpeg_sizes_come_from_lengths_not_from_pixels():
    assert record_offsets("jpeg", [[4, 4], [1, 1]], 3, [300, 5]).tolist() == [0, 300, 305]


def test_writer_refuses_jpeg_bytes_that_are_not_the_record(tmp_path):
    good = _source_jpeg(photo_like(20, 16, seed=1))
    with PackWriter(tmp_path / "p.bin", height=16, width=20, classes=["a"], codec="jpeg") as wr:
        with pytest.raises(InvalidArgumentError, match="a/x.jpg: .*says 20x16, the index 10x8"):
            wr.append(good, 0, "a/x.jpg", size=(10, 8))
        with pytest.raises(InvalidArgumentError, match="damaged JPEG record"):
            wr.append(good[:40], 0, "a/x.jpg", size=(20, 16))
        with pytest.raises(InvalidArgumentError, match="2 to 2"):
            wr.append(b"\xff", 0, "a/x.jpg", size=(20, 16))
        assert wr.count == 0
    with pytest.raises(InvalidArgumentError, match="quality"):
        PackWriter(tmp_path / "q.bin", height=4, width=4, classes=[], codec="raw", quality=90)
    with pytest.raises(InvalidArgumentError, match="1..100"):
        PackWriter(tmp_path / "q.bin", height=4, width=4, classes=[], codec="jpeg", quality=0)
