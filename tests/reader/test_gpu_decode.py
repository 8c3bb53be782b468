"""JPEG records decoded on the device (plan.Regions, read.Encoded, device.DecodeOnDevice),
tested as far as a CPU allows.

* everywhere: the region arithmetic; a draw applied to a canvas of regions equals the same
  draw applied to the full decode; the loader's plumbing of that path (regions, shifted
  draws, the canvas the tiles are pasted into) with nvImageCodec replaced by a stand-in
  that decodes on the CPU (simplejpeg) and cuts each region; the choice and its refusals.
  The decode itself is nvImageCodec's: only the ``cuda`` tests run it.
* marked ``cuda`` (skipped without CUDA and nvImageCodec): the real path on a GPU.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from conftest import photo_like
from test_jpeg_scaled import SIZES, write_jpeg_pack

from imgpack.errors import FormatError, InvalidArgumentError, MissingExtraError
from imgpack.reader import jpeg, nvdecode
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.options import InProcessOptions
from imgpack.reader.plan import regions
from imgpack.reader.read import Encoded
from imgpack.reader.transform import DeviceTransform


@pytest.fixture
def ds(tmp_path):
    records = [photo_like(w, h, seed=k) for k, (w, h) in enumerate(SIZES)]
    with PackedImageDataset(write_jpeg_pack(tmp_path / "j.bin", records, (96, 96))) as d:
        yield d


def full_canvas(ds, idx) -> torch.Tensor:
    h, w, c = ds.shape
    images = np.zeros((len(idx), h, w, c), np.uint8)
    ds.decode_into(idx, images, np.empty(len(idx), np.int64))
    return torch.from_numpy(images).permute(0, 3, 1, 2)


def region_canvas(full: torch.Tensor, box: np.ndarray) -> torch.Tensor:
    """The regions of a full decode, each at the top-left of a canvas as large as the largest."""
    ext = box[:, 2:] - box[:, :2]
    out = torch.zeros((len(box), full.shape[1], int(ext[:, 1].max()), int(ext[:, 0].max())))
    for i, (left, top, right, bottom) in enumerate(box.tolist()):
        out[i, :, : bottom - top, : right - left] = full[i, :, top:bottom, left:right]
    return out.to(torch.uint8)


def test_a_region_holds_the_crop_and_what_the_filter_reaches():
    from imgpack.reader.augment import Draw

    crop = np.array([[10.3, 20.0, 50.7, 40.0], [0.0, 0.0, 8.0, 8.0], [5.5, 6.5, 7.0, 8.0]])
    sizes = np.array([[96, 96], [8, 8], [96, 96]])
    draw = Draw(np.arange(3), crop, np.zeros(3, bool), crop, sizes, 10)
    box, shifted = regions(draw)
    # row 0, x: scale 4.04, reach [10.3 + 2.02 - 4.04, 50.7 - 2.02 + 4.04] -> [8, 53);
    # y: scale 2, reach [20 + 1 - 2, 40 - 1 + 2] -> [19, 41)
    assert box[0].tolist() == [8, 19, 53, 41]
    assert box[1].tolist() == [0, 0, 8, 8]  # the whole record: the edge stops the reach
    # row 2 enlarges (scale 0.15): a tap is within one pixel of a centre
    assert box[2].tolist() == [4, 5, 8, 9]
    np.testing.assert_allclose(shifted.crop[0], [2.3, 1.0, 42.7, 21.0])
    assert shifted.sizes.tolist() == [[45, 22], [8, 8], [4, 4]]
    assert (box[:, :2] <= np.floor(crop[:, :2])).all() and (
        box[:, 2:] >= np.ceil(crop[:, 2:])
    ).all()


@pytest.mark.parametrize("mode,size", [("train", 24), ("train", 200), ("eval", 24), ("eval", 64)])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-9), (torch.float32, 2e-4)])
def test_a_draw_on_its_regions_is_the_draw_on_the_full_decode(ds, mode, size, dtype, tol):
    t = getattr(DeviceTransform, mode)(ds, size=size, dtype=dtype)
    idx = np.arange(len(ds))
    for seed in range(4):
        draw = t.draw(idx, ds.shape[:2], generator=torch.Generator().manual_seed(seed))
        full = full_canvas(ds, idx)
        box, shifted = regions(draw)
        want = t.apply(full, draw)
        got = t.apply(region_canvas(full, box), shifted)
        assert (got - want).abs().max().item() <= tol * 255  # the same taps, the same weights
        assert (box[:, 2:] - box[:, :2]).prod(1).sum() <= ds.record_sizes.prod(1).sum()


@pytest.fixture
def fake_gpu(monkeypatch):
    """nvdecode replaced by the CPU decoder: every device 'available', each record decoded
    by simplejpeg and cut to its region, as a (C, h, w) CPU tensor. Keeps the calls."""
    calls = []

    def decode_batch(buffers, channels, device, regions=None, *, names=None, sizes=None):
        calls.append((len(buffers), regions, names))
        out = []
        for i, buf in enumerate(buffers):
            hwc = jpeg.decode(buf, *sizes[i], channels, where=names[i])
            if regions is not None:
                left, top, right, bottom = regions[i]
                hwc = hwc[top:bottom, left:right]
            out.append(torch.from_numpy(np.ascontiguousarray(hwc)).permute(2, 0, 1))
        return out

    monkeypatch.setattr(nvdecode, "available", lambda device: True)
    monkeypatch.setattr(nvdecode, "decode_batch", decode_batch)
    return calls


def batches(ds, decode, transform, **kw):
    torch.manual_seed(7)  # the crops' pass seed
    loader = make_loader(
        ds,
        3,
        seed=1,
        device="cpu",
        transform=transform,
        options=InProcessOptions(decode=decode),
        **kw,
    )
    with loader:
        assert isinstance(loader.pipeline.read, Encoded) is (decode != "cpu")
        return [b for b in loader]


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_the_device_paths_regions_and_shifted_draws_give_the_cpu_paths_batches(
    ds, fake_gpu, mode, canvas_on_cpu
):
    """The stand-in decodes only each region it is asked for: wrong regions, a draw not
    shifted into them or a tile pasted at the wrong place would change the batches."""
    # crops of 96 px records to 25: the CPU path decodes every record at 1/1 too (jpeg.GAP)
    t = getattr(DeviceTransform, mode)(ds, size=25, dtype=torch.float64)
    want, got = batches(ds, "cpu", t), batches(ds, "gpu", t)
    assert len(got) == len(want) == 3 and len(fake_gpu) == 3
    for (gi, gl), (wi, wl) in zip(got, want):
        assert torch.equal(gl, wl)
        assert (gi - wi).abs().max().item() < 1e-9
    n, boxes, names = fake_gpu[0]
    assert n == 3 and len(boxes) == 3 and names[0].startswith(str(ds.index.data_path))
    areas = [(r - left) * (b - top) for _, bs, _ in fake_gpu for left, top, r, b in bs]
    whole = [w * h for w, h in ds.record_sizes.tolist()]
    assert sum(areas) < len(fake_gpu) * 3 * max(whole)  # regions, not whole records


def test_a_plain_transform_gets_the_canvas_the_cpu_path_makes(ds, fake_gpu):
    def plain(images, records):
        return images.clone()

    want, got = batches(ds, "cpu", plain), batches(ds, "gpu", plain)
    assert fake_gpu[0][1] is None  # no crop known: whole records
    for (gi, _), (wi, _) in zip(got, want):
        assert gi.shape == wi.shape and torch.equal(gi, wi)


def test_a_damaged_record_is_named_on_the_gpu_path_too(ds, fake_gpu, monkeypatch):
    real = ds.encoded
    monkeypatch.setattr(ds, "encoded", lambda idx: [b[: len(b) // 3] for b in real(idx)])
    with pytest.raises(FormatError, match=r"j\.bin record \d+: damaged JPEG record"):
        batches(ds, "gpu", DeviceTransform.eval(ds, size=20))


def test_auto_picks_the_gpu_only_where_it_can_decode(ds, fake_gpu):
    t = DeviceTransform.eval(ds, size=20)
    assert batches(ds, "auto", t) and fake_gpu  # 'available' here
    with make_loader(ds, 3, device="cpu", transform=t, num_workers=0) as loader:
        assert loader.mode == "workers"  # workers decode on the CPU, always
    with make_loader(ds, 3, transform=t) as loader:
        assert not isinstance(loader.pipeline.read, Encoded)  # no device: nothing to decode on


def test_auto_stays_on_the_cpu_without_a_gpu(ds):
    with make_loader(ds, 3, device="cpu", transform=DeviceTransform.eval(ds, 20)) as loader:
        assert not isinstance(loader.pipeline.read, Encoded) and loader.pipeline.read.threads >= 1


def test_forcing_the_gpu_says_why_it_cannot(ds, monkeypatch):
    t = DeviceTransform.eval(ds, size=20)
    with pytest.raises(InvalidArgumentError, match="needs a CUDA device"):
        make_loader(ds, 3, device="cpu", transform=t, options=InProcessOptions(decode="gpu"))
    with pytest.raises(InvalidArgumentError, match=r"needs make_loader\(device=\.\.\.\)"):
        make_loader(ds, 3, transform=t, options=InProcessOptions(decode="gpu"))
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # only to build the loader
    gpu = InProcessOptions(decode="gpu")
    with pytest.raises(MissingExtraError, match=r"pip install imgpack\[gpu\]"):
        make_loader(ds, 3, device="cuda:0", transform=t, options=gpu)
    with make_loader(
        ds, 3, device="cuda:0", transform=t, options=InProcessOptions(decode="cpu")
    ) as ld:
        assert not isinstance(ld.pipeline.read, Encoded)


def test_forcing_the_gpu_on_a_pack_with_nothing_to_decode_is_refused(make_pack):
    path, _, _ = make_pack(count=4)
    gpu = InProcessOptions(decode="gpu")
    with PackedImageDataset(path) as raw:
        with pytest.raises(InvalidArgumentError, match="decodes JPEG packs"):
            make_loader(raw, 2, device="cpu", options=gpu)


def test_the_decode_option_is_checked():
    with pytest.raises(InvalidArgumentError, match="decode should be 'auto', 'cpu' or 'gpu'"):
        InProcessOptions(decode="tpu")


# --- on a GPU -----------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_on_the_gpu_the_loader_decodes_there_close_to_the_cpu_path(ds, mode):
    pytest.importorskip("nvidia.nvimgcodec", reason="needs nvImageCodec (imgpack[gpu])")
    assert nvdecode.available("cuda"), nvdecode._problem(torch.cuda.current_device())
    t = getattr(DeviceTransform, mode)(ds, size=20)

    def run(decode):
        torch.manual_seed(7)
        opts = InProcessOptions(decode=decode)
        with make_loader(ds, 3, seed=1, device="cuda", transform=t, options=opts) as loader:
            assert isinstance(loader.pipeline.read, Encoded) is (decode == "gpu")
            return [(x.cpu(), y.cpu()) for x, y in loader]

    want, got = run("cpu"), run("gpu")
    assert len(got) == len(want)
    std = torch.tensor(ds.std).view(1, -1, 1, 1) * 255  # back to levels
    for (gi, gl), (wi, wl) in zip(got, want):
        assert torch.equal(gl, wl)
        assert ((gi - wi).abs() * std).mean().item() < 2.0  # two IDCTs: a level or two apart


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu_a_region_is_that_part_of_the_full_decode(ds):
    pytest.importorskip("nvidia.nvimgcodec", reason="needs nvImageCodec (imgpack[gpu])")
    idx = np.arange(len(ds))
    sizes = [tuple(s) for s in ds.record_sizes.tolist()]
    full = nvdecode.decode_batch(ds.encoded(idx), 3, "cuda", sizes=sizes)
    boxes = [(w // 4, h // 3, w - 1, h) for w, h in sizes]
    part = nvdecode.decode_batch(ds.encoded(idx), 3, "cuda", boxes, sizes=sizes)
    for f, p, (left, top, right, bottom) in zip(full, part, boxes):
        cut = f[:, top:bottom, left:right].int()
        assert (p.int() - cut).abs().float().mean().item() < 1.0
