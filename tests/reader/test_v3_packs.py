"""Format version 3 packs in the reader: records of their own size, raw or yuv420.

Every pack here is written by the real writer; every batch is checked record by record
against ``ds[i]`` (which is checked against what was written), the way a user's code
would read them: ``ds[i]``, ``list(make_loader(...))``, a plain ``DataLoader``.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch
from packs_v3 import BOUND, SIZES, rgb_back, write_v3
from torch.utils.data import DataLoader

from imgpack.errors import InvalidArgumentError
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.mapping import page_ranges
from imgpack.reader.options import InProcessOptions
from imgpack.reader.order import DEFAULT_BLOCK_BYTES

CODECS = ["raw", "yuv420"]
H, W = BOUND


@pytest.mark.parametrize("codec", CODECS)
def test_a_sample_is_rgb_at_the_records_own_size(tmp_path, codec):
    path, records, labels = write_v3(tmp_path / "p.bin", codec)
    ds = PackedImageDataset(path)
    assert ds.codec == codec and ds.shape == (H, W, 3) and len(ds) == len(SIZES)
    assert ds.record_sizes.dtype == np.int64 and ds.record_sizes.tolist() == [
        list(s) for s in SIZES
    ]
    for i, rec in enumerate(records):
        image, label = ds[i]
        assert image.dtype == torch.uint8 and image.shape == (3, *rec.shape[:2])
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), rgb_back(rec, codec))
        assert label == labels[i]
    if codec == "raw" and os.path.exists("/proc/self/maps"):  # zero-copy: in the file's pages
        assert mapped_at(path, ds[3][0].data_ptr())


def mapped_at(path, address: int) -> bool:
    """Whether ``address`` lies in a mapping of the file ``path`` (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        rows = [line.split() for line in f]
    spans = [r[0].split("-") for r in rows if len(r) >= 6 and r[5] == os.path.realpath(path)]
    return any(int(a, 16) <= address < int(b, 16) for a, b in spans)


def canvas_check(images, idx, ds):
    """Each (B, C, H, W) RGB image holds ds[i] at its top-left and zeros beyond."""
    for k, i in enumerate(np.asarray(idx).tolist()):
        w, h = ds.record_sizes[i].tolist()
        assert torch.equal(images[k, :, :h, :w], ds[i][0]), i
        assert not images[k, :, h:].any() and not images[k, :, :, w:].any(), i


def test_a_raw_batch_is_the_padded_canvas(tmp_path):
    path, _, labels = write_v3(tmp_path / "p.bin", "raw")
    ds = PackedImageDataset(path)
    idx = np.array([4, 0, 7, 3, 1, 6])
    images, got = ds.gather(idx)
    assert images.shape == (6, 3, H, W) and images.is_contiguous(memory_format=torch.channels_last)
    canvas_check(images, idx, ds)
    assert got.tolist() == labels[idx].tolist()


@pytest.mark.parametrize("codec", CODECS)
def test_loader_batches_in_reused_buffers_are_the_records(tmp_path, codec):
    path, _, labels = write_v3(tmp_path / "p.bin", codec)
    ds = PackedImageDataset(path)
    seen = []
    loader = make_loader(ds, 3, seed=3, transform=keep_records(seen))
    for _epoch in range(3):  # the loader's buffers come back, full of an older batch
        for images, got in loader:
            canvas_check(images, seen[-1], ds)
            assert got.tolist() == labels[seen[-1].numpy()].tolist()


def test_a_yuv420_batch_in_a_reused_buffer_is_the_yuv_canvas(tmp_path):
    path, _, _ = write_v3(tmp_path / "p.bin", "yuv420")
    ds = PackedImageDataset(path)
    idx = np.array([2, 5, 4])
    out, labels = np.full((3, 24, 20, 1), 255, np.uint8), np.empty(3, np.int64)
    # a pooled yuv canvas is read only on the way to a CUDA device: no public path here
    ds._run.copy(idx, out, labels)
    images, _ = ds.gather(idx)
    assert torch.equal(torch.from_numpy(out).permute(0, 3, 1, 2), images)  # no stale bytes


def test_many_packs_of_many_sizes_are_one_dataset(tmp_path):
    a, _, _ = write_v3(tmp_path / "a.bin", "raw")
    b, _, _ = write_v3(tmp_path / "b.bin", "raw", sizes=SIZES[::-1], seed=40)
    ds = PackedImageDataset([a, b])
    assert ds.record_sizes.tolist() == [list(s) for s in SIZES + SIZES[::-1]]
    idx = np.array([15, 0, 9, 3, 12, 7, 8])
    canvas_check(ds.gather(idx)[0], idx, ds)
    seen = []  # read-ahead over records of many sizes: offsets, not a stride
    options = InProcessOptions(hints=True)
    for images, _ in make_loader(ds, 5, seed=2, transform=keep_records(seen), options=options):
        canvas_check(images, seen[-1], ds)
    assert sorted(torch.cat(seen).tolist()) == list(range(len(ds)))


def test_page_ranges_of_records_of_many_sizes():
    offsets = np.array([0, 100, 5000, 9000, 9001], dtype=np.int64)
    assert page_ranges(np.array([2, 0]), 4096, offsets) == [(4096, 100), (8192, 4904)]
    assert page_ranges(np.array([1, 2, 3]), 4096, offsets) == [(4096, 9001)]


def keep_records(seen):
    """A plain batched transform T(images, records) that notes the records it was given."""

    def transform(images, records):
        seen.append(records.clone())
        return images

    return transform


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("workers", [None, 2])
def test_loader_batches_are_the_records_record_by_record(tmp_path, codec, workers):
    path, _, labels = write_v3(tmp_path / "p.bin", codec)
    ds = PackedImageDataset(path)
    seen = []
    loader = make_loader(ds, 3, seed=5, num_workers=workers, transform=keep_records(seen))
    batches = list(loader)
    assert len(batches) == len(seen) == 3
    assert sorted(torch.cat(seen).tolist()) == list(range(len(SIZES)))
    for (images, got), records in zip(batches, seen):
        assert images.shape == (len(records), 3, H, W)  # RGB whatever the codec
        canvas_check(images, records, ds)
        assert got.tolist() == labels[records.numpy()].tolist()


def test_make_loader_refuses_many_sizes_without_a_transform_in_one_line(tmp_path):
    path, _, _ = write_v3(tmp_path / "p.bin", "raw")
    ds = PackedImageDataset(path)
    with pytest.raises(InvalidArgumentError, match=r"transform=DeviceTransform\.train") as info:
        make_loader(ds, 4)
    assert "\n" not in str(info.value) and "--resize stretch or center-crop" in str(info.value)
    make_loader(ds, 4, transform=lambda images: images)  # any transform will do


@pytest.mark.parametrize("codec", CODECS)
def test_records_of_one_size_need_no_transform(tmp_path, codec):
    path, _, _ = write_v3(tmp_path / "p.bin", codec, sizes=[(W, H)] * 7)
    ds = PackedImageDataset(path)
    for device in (None, "cpu"):  # converted on the CPU without a device, on it with one
        got = list(make_loader(ds, 3, shuffle=False, device=device))
        images = torch.cat([x for x, _ in got])
        assert images.shape == (7, 3, H, W)
        canvas_check(images, np.arange(7), ds)


@pytest.mark.parametrize("codec", CODECS)
def test_a_plain_dataloader_with_the_default_collate(tmp_path, codec):
    path, records, labels = write_v3(tmp_path / "p.bin", codec, sizes=[(W, H)] * 10)
    ds = PackedImageDataset(path)
    batches = list(DataLoader(ds, batch_size=4, num_workers=2))  # one pass: one pair of workers
    images = torch.cat([x for x, _ in batches])
    got = torch.cat([y for _, y in batches])
    want = np.stack([rgb_back(r, codec) for r in records])
    np.testing.assert_array_equal(images.permute(0, 2, 3, 1).numpy(), want)
    assert got.tolist() == labels.tolist()


def test_the_block_order_counts_mean_record_bytes(tmp_path):
    sizes = [(20, 16), (10, 8)] * 4
    path, _, _ = write_v3(tmp_path / "p.bin", "yuv420", sizes=sizes)
    ds = PackedImageDataset(path)
    mean = (20 * 16 + 2 * 10 * 8 + 10 * 8 + 2 * 5 * 4) / 2  # yuv420 bytes of each size
    loader = make_loader(ds, 2, order="block", transform=lambda x: x)
    assert loader.order.block == DEFAULT_BLOCK_BYTES // mean
    assert sum(len(y) for _, y in loader) == 8


def test_from_dataset_normalises_the_rgb_of_a_yuv420_pack(tmp_path):
    from imgpack.reader.transform import DeviceTransform

    path, records, _ = write_v3(tmp_path / "p.bin", "yuv420", sizes=[(W, H)] * 6)
    ds = PackedImageDataset(path)
    t = DeviceTransform.from_dataset(ds, dtype=torch.float64)
    x = torch.cat([x for x, _ in make_loader(ds, 4, shuffle=False, transform=t)])
    rgb = torch.from_numpy(np.stack([rgb_back(r, "yuv420") for r in records])).permute(0, 3, 1, 2)
    mean = torch.tensor(ds.mean, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(ds.std, dtype=torch.float64).view(1, 3, 1, 1)
    torch.testing.assert_close(x, (rgb / 255 - mean) / std, rtol=0, atol=1e-5)


def test_a_per_sample_transform_gets_each_record_at_its_own_size(tmp_path):
    path, records, _ = write_v3(tmp_path / "p.bin", "yuv420")
    shapes = []

    def crop(image):  # ImageFolder style: one sample at a time, to one size
        shapes.append(tuple(image.shape))
        return image[:, :1, :1].float()

    ds = PackedImageDataset(path, transform=crop)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one "sample by sample" warning of a process
        loader = make_loader(ds, 4, shuffle=False, num_workers=0)
    assert [tuple(x.shape) for x, _ in loader] == [(4, 3, 1, 1), (4, 3, 1, 1)]
    assert shapes == [(3, h, w) for w, h in SIZES]
