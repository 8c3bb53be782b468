"""JPEG batches bound for a CUDA device cross packed (read.DecodePacked, device.Unpack).

Everywhere: ``decode_into`` with a 1-D buffer lays the records end to end exactly as they
decode; ``device.unpack`` gives the canvas the CPU path makes; the whole loader, made to
take the CUDA row of its table on device "cpu", gives the canvas path's batches, over
several threads and chunked reads too. Marked ``cuda``: the real thing, on a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import photo_like
from test_jpeg_scaled import SIZES, write_jpeg_pack

from imgpack.errors import InvalidArgumentError
from imgpack.reader import loader as loader_module
from imgpack.reader import read
from imgpack.reader.canvas import packed_ends
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.device import extents, unpack
from imgpack.reader.jpeg import scaled_size
from imgpack.reader.loader import make_loader
from imgpack.reader.options import InProcessOptions
from imgpack.reader.read import DecodePacked
from imgpack.reader.transform import DeviceTransform


@pytest.fixture
def ds(tmp_path):
    records = [photo_like(w, h, seed=k) for k, (w, h) in enumerate(SIZES)]
    with PackedImageDataset(write_jpeg_pack(tmp_path / "j.bin", records, (96, 96))) as d:
        yield d


def canvas(ds, idx, scales=None) -> np.ndarray:
    h, w, c = ds.shape
    out = np.zeros((len(idx), h, w, c), np.uint8)
    ds.decode_into(idx, out, np.empty(len(idx), np.int64), scales)
    return out


@pytest.mark.parametrize("scales", [None, [1, 2, 4, 8, 2, 1, 2, 8]])
def test_a_flat_buffer_gets_each_record_whole_and_end_to_end(ds, scales):
    idx = np.arange(len(ds))[::-1].copy()
    d = [1] * len(idx) if scales is None else scales
    sizes = [scaled_size(*ds.record_sizes[i], s) for i, s in zip(idx, d)]
    need = sum(w * h * 3 for w, h in sizes)
    flat = np.full(need + 10, 7, np.uint8)
    labels = np.empty(len(idx), np.int64)
    out, lab = ds.decode_into(idx, flat, labels, scales)
    assert out is flat and lab is labels
    assert labels.tolist() == [ds[int(i)][1] for i in idx]
    want, start = canvas(ds, idx, scales), 0
    for k, (w, h) in enumerate(sizes):
        block = flat[start : start + w * h * 3].reshape(h, w, 3)
        assert np.array_equal(block, want[k, :h, :w])
        start += w * h * 3
    assert (flat[need:] == 7).all()  # nothing past the records is written


def test_a_flat_buffer_too_small_or_of_another_type_is_refused(ds):
    labels = np.empty(2, np.int64)
    with pytest.raises(InvalidArgumentError, match="at least"):
        ds.decode_into([0, 1], np.empty(100, np.uint8), labels)
    with pytest.raises(InvalidArgumentError, match="uint8"):
        ds.decode_into([0, 1], np.empty(10**6, np.float32), labels)


def test_the_packed_layout_places_each_record_after_those_before_it():
    sizes = np.array([[2, 3], [4, 1], [1, 1]])
    assert packed_ends(sizes, 3).tolist() == [0, 18, 30, 33]
    assert packed_ends(sizes, 1).tolist() == [0, 6, 10, 11]
    assert packed_ends(np.empty((0, 2), np.int64), 3).tolist() == [0]


def test_a_packed_batch_lays_out_the_canvas_the_cpu_path_makes(ds):
    idx = np.array([6, 0, 3])
    sizes = np.asarray(ds.record_sizes)[idx]
    flat = np.empty(int(sizes.prod(1).sum()) * 3, np.uint8)
    ds.decode_into(idx, flat, np.empty(3, np.int64))
    got = unpack(torch.from_numpy(flat), sizes, (96, 96), 3)
    assert got.shape == (3, 3, 96, 96) and got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, torch.from_numpy(canvas(ds, idx)).permute(0, 3, 1, 2))


def test_the_devices_one_scatter_lays_out_what_the_copies_do(ds):
    """Off the CPU the canvas is one masked_scatter_ of the packed bytes: the same canvas."""
    idx = np.array([2, 6, 0, 5])
    sizes = -(-np.asarray(ds.record_sizes)[idx] // np.array([[1], [2], [4], [1]]))
    flat = np.empty(int(sizes.prod(1).sum()) * 3, np.uint8)
    ds.decode_into(idx, flat, np.empty(4, np.int64), [1, 2, 4, 1])
    pixels = torch.from_numpy(flat)
    out = torch.zeros((4, 96, 96, 3), dtype=torch.uint8)
    out.masked_scatter_(extents(sizes, 96, 96, "cpu")[..., None], pixels)
    assert torch.equal(out.permute(0, 3, 1, 2), unpack(pixels, sizes, (96, 96), 3))


def test_records_that_fill_the_canvas_are_a_view_of_the_buffer():
    pixels = torch.arange(2 * 4 * 5 * 3, dtype=torch.int64).to(torch.uint8)
    got = unpack(pixels, np.array([[5, 4], [5, 4]]), (4, 5), 3)
    assert got.data_ptr() == pixels.data_ptr()
    assert torch.equal(got.permute(0, 2, 3, 1).reshape(-1), pixels)


def packed_on_the_cpu(monkeypatch) -> None:
    """make_loader takes the row of its table that a CUDA device gets, on device "cpu"."""
    stages = loader_module.STAGES
    for where in ("cpu", "crops"):
        monkeypatch.setitem(stages, ("jpeg", where), stages[("jpeg", "packed")])


def batches(ds, transform, packed, monkeypatch, **kw):
    """The loader's batches on device "cpu" through the canvas a GPU gets: decoded by the
    loader's threads into a canvas, or (``packed``) end to end and laid out after."""
    with monkeypatch.context() as m:
        stages = loader_module.STAGES
        m.setitem(stages, ("jpeg", "crops"), stages[("jpeg", "cpu")])  # no CPU crops here
        if packed:
            packed_on_the_cpu(m)
        torch.manual_seed(3)
        with make_loader(ds, 3, seed=1, device="cpu", transform=transform, **kw) as loader:
            assert isinstance(loader.pipeline.read, DecodePacked) is packed
            return [b for b in loader]


def same(a, b) -> None:
    assert len(a) == len(b) == 3
    for (ai, al), (bi, bl) in zip(a, b):
        assert torch.equal(al, bl) and torch.equal(ai, bi)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_loader_packed_gives_the_canvas_paths_batches(ds, monkeypatch, mode, threads):
    def transform():
        return getattr(DeviceTransform, mode)(ds, size=20, dtype=torch.float64)

    opts = InProcessOptions(gather_threads=threads)
    want = batches(ds, transform(), False, monkeypatch, options=opts)
    same(batches(ds, transform(), True, monkeypatch, options=opts), want)


def test_a_plain_transform_gets_the_same_zero_padded_canvas(ds, monkeypatch):
    seen = []

    def plain(images, records):  # as a stranger writes one: keeps the canvas
        seen.append(records.tolist())
        return images.clone()

    want = batches(ds, plain, False, monkeypatch)
    got = batches(ds, plain, True, monkeypatch)
    same(got, want)
    sizes = np.asarray(ds.record_sizes)[np.concatenate(seen[len(want) :])]
    images = torch.cat([i for i, _ in got])
    assert images.shape[1:] == (3, 96, 96) and (sizes < 96).any()
    for k, (w, h) in enumerate(sizes.tolist()):
        assert (images[k, :, :, w:] == 0).all() and (images[k, :, h:, :] == 0).all()


def test_a_chunked_read_splits_the_packed_buffer_by_record(ds, monkeypatch):
    """A pack not known to be in the page cache is read a few records at a time."""
    monkeypatch.setattr(PackedImageDataset, "in_page_cache", property(lambda self: False))
    monkeypatch.setattr(read, "CHUNK_BYTES", 1)  # one record per chunk
    opts = InProcessOptions(gather_threads=2)
    t = DeviceTransform.eval(ds, size=20, dtype=torch.float64)
    want = batches(ds, t, False, monkeypatch, options=opts)
    same(batches(ds, t, True, monkeypatch, options=opts), want)


def test_a_chunked_read_cuts_by_the_records_mean_size_not_the_first_ones(tmp_path, monkeypatch):
    """A tiny first record must not make the whole batch one chunk (close() is checked
    between chunks): a packed batch is cut by the mean bytes of its records."""
    records = [photo_like(2, 2, seed=0)] + [photo_like(96, 96, seed=k) for k in range(1, 8)]
    path = write_jpeg_pack(tmp_path / "t.bin", records, (96, 96))
    monkeypatch.setattr(PackedImageDataset, "in_page_cache", property(lambda self: False))
    monkeypatch.setattr(read, "CHUNK_BYTES", 2 * 96 * 96 * 3)  # two large records
    calls: list[int] = []
    decode_into = PackedImageDataset.decode_into

    def counted(self, idx, *args, **kw):
        calls.append(len(idx))
        return decode_into(self, idx, *args, **kw)

    monkeypatch.setattr(PackedImageDataset, "decode_into", counted)
    packed_on_the_cpu(monkeypatch)
    opts = InProcessOptions(gather_threads=1)
    with PackedImageDataset(path) as ds:
        with make_loader(ds, 8, shuffle=False, device="cpu", transform=lambda x, r: x,
                         options=opts) as loader:  # fmt: skip
            assert isinstance(loader.pipeline.read, DecodePacked)
            assert len(list(loader)) == 1
    assert sum(calls) == 8 and max(calls) <= 3


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_on_cuda_a_cpu_decoded_batch_crosses_packed_and_matches_the_cpu(ds, mode):
    def run(device):
        torch.manual_seed(3)
        t = getattr(DeviceTransform, mode)(ds, size=20, dtype=torch.float64)
        opts = InProcessOptions(decode="cpu")
        with make_loader(ds, 3, seed=1, device=device, transform=t, options=opts) as loader:
            assert isinstance(loader.pipeline.read, DecodePacked) is (device == "cuda")
            return [(x.cpu(), y.cpu()) for x, y in loader]

    want, got = run("cpu"), run("cuda")
    for (gi, gl), (wi, wl) in zip(got, want):
        assert torch.equal(gl, wl) and (gi - wi).abs().max().item() < 1e-6
