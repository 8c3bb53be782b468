"""GPU JPEG decode with nvImageCodec (imgpack.reader.nvdecode), in three layers:

* everywhere: the refusals that need neither the library nor a GPU (device, channels,
  regions, the missing extra) and ``available`` saying no;
* where nvImageCodec is installed, with or without a GPU: the record checks, regions and
  error naming, run through the library's CPU backend (libjpeg-turbo), the same calls the
  GPU path makes short of the device and DLPack;
* marked ``cuda``, skipped without CUDA and nvImageCodec: the real thing, decoded on the
  GPU and compared with Pillow. Run on a GPU machine with
  ``pip install imgpack[gpu] && pytest -m cuda tests/reader/test_nvdecode.py``.
"""

from __future__ import annotations

import io
import mmap
import sys

import numpy as np
import pytest
import torch
from conftest import photo_like
from PIL import Image

from imgpack.errors import FormatError, InvalidArgumentError, MissingExtraError
from imgpack.reader import nvdecode


def jpeg(pixels: np.ndarray, quality: int = 90) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=quality)
    return out.getvalue()


def pillow(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


@pytest.fixture
def no_library(monkeypatch):
    """As if nvImageCodec were not installed, with nothing cached from earlier calls."""
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    monkeypatch.setattr(nvdecode, "_problems", {})
    monkeypatch.setattr(nvdecode, "_decoders", {})


# --- everywhere ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "meta", "no-such-device"])
def test_available_is_false_off_cuda(device):
    assert nvdecode.available(device) is False


def test_available_is_false_without_the_library(no_library, monkeypatch):
    monkeypatch.setattr(nvdecode, "_cuda_index", lambda device: 0)  # a CUDA device, say
    assert nvdecode.available("cuda") is False
    assert "pip install imgpack[gpu]" in nvdecode._problems[0]


def test_asking_without_the_library_names_the_extra(no_library):
    with pytest.raises(MissingExtraError, match=r"pip install imgpack\[gpu\]"):
        nvdecode.decode_batch([jpeg(photo_like(8, 8))], 3, "cuda")


def test_a_device_that_is_not_cuda_is_refused():
    with pytest.raises(InvalidArgumentError, match=r"device='cpu'.*needs a CUDA device"):
        nvdecode.decode_batch([b""], 3, "cpu")


def test_channels_other_than_1_or_3_are_refused():
    with pytest.raises(InvalidArgumentError, match=r"channels=4"):
        nvdecode.decode_batch([b""], 4, "cuda")


@pytest.mark.parametrize(
    ("regions", "message"),
    [
        ([(0, 0, 4, 4)], r"regions: 1 given for 2 records"),
        ([(0, 0, 4), None], r"regions\[0\] = \(0, 0, 4\): expected \(left, top, right, bottom\)"),
        ([None, (0.0, 0, 4, 4)], r"regions\[1\] = \(0\.0, 0, 4, 4\): expected"),
        ([None, "abcd"], r"regions\[1\] = 'abcd': expected"),
        ([(-1, 0, 4, 4), None], r"regions\[0\] = \(-1, 0, 4, 4\): needs 0 <= left < right"),
        ([(4, 0, 4, 4), None], r"regions\[0\] .*needs 0 <= left < right"),
        ([None, (0, 5, 4, 2)], r"regions\[1\] .*0 <= top < bottom"),
    ],
)
def test_bad_regions_are_refused_before_anything_is_decoded(no_library, regions, message):
    data = jpeg(photo_like(8, 8))
    with pytest.raises(InvalidArgumentError, match=message):
        nvdecode.decode_batch([data, data], 3, "cuda", regions)


def test_names_and_sizes_need_one_entry_per_record(no_library):
    data = jpeg(photo_like(8, 8))
    with pytest.raises(InvalidArgumentError, match="one entry per record"):
        nvdecode.decode_batch([data, data], 3, "cuda", names=["a"])
    with pytest.raises(InvalidArgumentError, match="one entry per record"):
        nvdecode.decode_batch([data], 3, "cuda", sizes=[(8, 8), (8, 8)])


def test_regions_may_be_numpy_integers():
    boxes = nvdecode._regions([np.array([1, 2, 5, 6]).tolist(), tuple(np.int64([0, 0, 3, 3]))], 2)
    assert boxes == [(1, 2, 5, 6), (0, 0, 3, 3)]


# --- with nvImageCodec's CPU backend --------------------------------------------------------


@pytest.fixture(scope="module")
def cpu():
    """(the nvimgcodec module, a decoder on its CPU backend): the checks and the calls of
    the GPU path, on libjpeg-turbo (the same library Pillow decodes with)."""
    nvimgcodec = pytest.importorskip("nvidia.nvimgcodec", reason="needs nvImageCodec")
    decoder = nvimgcodec.Decoder(
        device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
        backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)],
    )
    return nvimgcodec, decoder


def decode_on_cpu(cpu, buffers, channels=3, regions=None, sizes=None) -> list[np.ndarray]:
    nvimgcodec, decoder = cpu
    buffers = [np.frombuffer(b, np.uint8) if isinstance(b, bytes) else b for b in buffers]
    names = [f"pack.bin record {i}" for i in range(len(buffers))]
    boxes = nvdecode._regions(regions, len(buffers))
    images = nvdecode._decode_images(nvimgcodec, decoder, buffers, channels, boxes, names, sizes, 0)
    return [np.asarray(image) for image in images]


def test_records_from_a_read_only_mapping_decode_as_pillow_does(cpu, tmp_path):
    sizes = [(53, 37), (48, 64), (16, 16), (200, 120)]
    data = [jpeg(photo_like(w, h, seed=i)) for i, (w, h) in enumerate(sizes)]
    path = tmp_path / "pack.bin"
    path.write_bytes(b"".join(data))
    ends = np.cumsum([len(d) for d in data])
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        mapped = np.frombuffer(mm, np.uint8)
        views = [mapped[e - len(d) : e] for d, e in zip(data, ends)]
        out = decode_on_cpu(cpu, views, sizes=sizes)
        del mapped, views
    for got, d in zip(out, data):
        assert np.abs(got.astype(int) - pillow(d)).mean() < 0.5


def test_a_region_decodes_that_part_of_the_record(cpu):
    data = jpeg(photo_like(64, 48))
    full, part = decode_on_cpu(cpu, [data, data], regions=[None, (10, 4, 50, 30)])
    assert part.shape == (26, 40, 3)
    assert np.abs(part.astype(int) - full[4:30, 10:50]).mean() < 1.0


def test_gray_records_decode_to_one_channel(cpu):
    data = jpeg(photo_like(40, 30)[..., 0])
    (got,) = decode_on_cpu(cpu, [data], channels=1)
    assert got.shape == (30, 40, 1)
    assert np.abs(got[..., 0].astype(int) - pillow(data)).mean() < 0.5


def test_the_built_in_probe_decodes_to_its_two_colours(cpu):
    (got,) = decode_on_cpu(cpu, [nvdecode._PROBE])
    for half, rgb in zip((got[:8], got[8:]), nvdecode._PROBE_RGB):
        assert np.abs(half.reshape(-1, 3).mean(axis=0) - rgb).max() < 20


def _png() -> bytes:
    out = io.BytesIO()
    Image.fromarray(photo_like(8, 8)).save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize(
    ("record", "channels", "size", "message"),
    [
        (b"", 3, None, r"nvImageCodec: "),
        (b"not a jpeg at all", 3, None, r"nvImageCodec: "),
        (b"\xff\xd8" + b"\x00" * 40, 3, None, r"nvImageCodec: "),
        ("cut", 3, None, r"nvImageCodec could not decode it"),
        ("png", 3, None, r"it is a png stream"),
        ("gray", 3, None, r"a 1-component JPEG in a 3-channel pack"),
        ("rgb", 1, None, r"a 3-component JPEG in a 1-channel pack"),
        ("rgb", 3, (90, 64), r"its header says 96x64, the index 90x64"),
    ],
)
def test_a_bad_record_is_named(cpu, record, channels, size, message):
    rgb, gray = jpeg(photo_like(96, 64)), jpeg(photo_like(96, 64)[..., 0])
    made = {"cut": rgb[: len(rgb) * 3 // 4], "png": _png(), "gray": gray, "rgb": rgb}
    good = gray if channels == 1 else rgb
    sizes = None if size is None else [(96, 64), size]
    with pytest.raises(FormatError, match=r"^pack\.bin record 1: damaged JPEG record \(" + message):
        decode_on_cpu(cpu, [good, made.get(record, record)], channels, sizes=sizes)


def test_a_region_outside_the_record_is_refused(cpu):
    data = jpeg(photo_like(24, 16))
    with pytest.raises(
        InvalidArgumentError, match=r"reaches outside pack\.bin record 0 \(24x16 pixels\)"
    ):
        decode_on_cpu(cpu, [data], regions=[(0, 0, 25, 16)])


# --- on a GPU -----------------------------------------------------------------------------


@pytest.fixture
def on_gpu():
    """Skip without nvImageCodec; with it installed on a GPU machine, it must work."""
    pytest.importorskip("nvidia.nvimgcodec", reason="needs nvImageCodec (imgpack[gpu])")
    if not nvdecode.available("cuda"):
        pytest.fail(f"nvImageCodec is installed but cannot decode: {nvdecode._problem(0)}")


def close_to_pillow(got: torch.Tensor, want: np.ndarray) -> float:
    """Mean absolute difference of a (C, h, w) device tensor and an (h, w[, C]) array."""
    hwc = got.permute(1, 2, 0).cpu().numpy().astype(np.int16)
    return float(np.abs(hwc - want.reshape(hwc.shape)).mean())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.usefixtures("on_gpu")
class TestOnGpu:
    def test_a_batch_of_sizes_decodes_close_to_pillow(self):
        sizes = [(224, 224), (500, 375), (37, 53), (16, 16), (640, 480)] * 4
        data = [jpeg(photo_like(w, h, seed=i)) for i, (w, h) in enumerate(sizes)]
        out = nvdecode.decode_batch(data, 3, "cuda", sizes=sizes)
        torch.cuda.synchronize()
        for t, d, (w, h) in zip(out, data, sizes):
            assert t.is_cuda and t.dtype == torch.uint8 and tuple(t.shape) == (3, h, w)
            assert close_to_pillow(t, pillow(d)) < 2.0

    def test_regions_and_a_side_stream(self):
        data = jpeg(photo_like(320, 240))
        box = (33, 17, 257, 200)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            full, part = nvdecode.decode_batch([data, data], 3, "cuda", [None, box])
            canvas = torch.zeros(2, 3, 240, 320, dtype=torch.uint8, device="cuda")
            canvas[0].copy_(full)
            canvas[1, :, : part.shape[1], : part.shape[2]].copy_(part)
        side.synchronize()
        left, top, right, bottom = box
        assert tuple(part.shape) == (3, bottom - top, right - left)
        want = pillow(data)
        assert close_to_pillow(canvas[0], want) < 2.0
        got = canvas[1, :, : bottom - top, : right - left]
        assert close_to_pillow(got, want[top:bottom, left:right]) < 2.5

    def test_gray_on_the_gpu(self):
        data = jpeg(photo_like(100, 60)[..., 0])
        (t,) = nvdecode.decode_batch([data], 1, "cuda")
        assert tuple(t.shape) == (1, 60, 100)
        assert close_to_pillow(t, pillow(data)) < 2.0

    def test_a_damaged_record_is_named_and_the_decoder_still_works(self):
        good = jpeg(photo_like(64, 48))
        bad = good[: len(good) // 3]
        with pytest.raises(FormatError, match=r"^val\.bin record 9: damaged JPEG record"):
            nvdecode.decode_batch([good, bad], 3, "cuda", names=["a", "val.bin record 9"])
        (t,) = nvdecode.decode_batch([good], 3, "cuda")
        assert close_to_pillow(t, pillow(good)) < 2.0

    def test_available_on_every_device(self):
        for d in range(torch.cuda.device_count()):
            assert nvdecode.available(f"cuda:{d}")
            (t,) = nvdecode.decode_batch([nvdecode._PROBE], 3, f"cuda:{d}")
            assert t.device == torch.device(f"cuda:{d}")
