"""The mapping helpers: page ranges, prefault fallbacks, auto prefault, read-only fallback."""

from __future__ import annotations

import errno
import mmap
import os
import warnings

import numpy as np
import torch

from imgpack.reader import mapping
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.mapping import page_ranges

PAGE = mmap.PAGESIZE


def test_page_ranges_cover_records_and_merge_neighbours():
    rb, base = 3000, 4096
    offsets = np.arange(42, dtype=np.int64) * rb  # records of one size
    got = page_ranges(np.array([5, 0, 1, 1, 40]), base, offsets)
    # records 0 and 1 touch neighbouring bytes: one range; 5 and 40 stand alone
    want = []
    for first, last in ((0, 1), (5, 5), (40, 40)):
        start = base + first * rb
        want.append((start - start % PAGE, base + (last + 1) * rb - (start - start % PAGE)))
    assert got == want
    for start, length in got:
        assert start % PAGE == 0 and length > 0
    assert page_ranges(np.array([], dtype=np.intp), base, offsets) == []


def test_page_ranges_merge_records_sharing_a_page():
    # records 0 and 2 are apart, but with 1000-byte records they share the first page
    offsets = np.arange(4, dtype=np.int64) * 1000
    assert page_ranges(np.array([0, 2]), 4096, offsets) == [(4096, 3000)]


def test_prefault_falls_back_to_touching_pages(make_pack, monkeypatch):
    path, pixels, _ = make_pack(count=9, height=32, width=32)
    monkeypatch.setattr(mapping, "madvise", lambda *args: False)  # a kernel without it
    ds = PackedImageDataset(path, prefault=True)  # its warm reads through the fallback too
    np.testing.assert_array_equal(ds[8][0].permute(1, 2, 0).numpy(), pixels[8])
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert mapping.prefault(mm, PAGE, len(mm) - PAGE) == "touch"


def test_auto_prefault_only_when_the_pack_fits_easily(monkeypatch):
    monkeypatch.setattr(mapping, "mem_available", lambda: 1000)
    assert mapping.auto_prefault(499) is True  # (elsewhere than Linux the memory is unknown)
    assert mapping.auto_prefault(500) is False
    monkeypatch.setattr(mapping, "mem_available", lambda: None)
    assert mapping.auto_prefault(1) is False


def test_an_advice_the_platform_lacks_is_skipped(make_pack):
    path, _, _ = make_pack(count=2)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert mapping.madvise(mm, None, 0, len(mm)) is False
    assert set(mapping.ADVICE) == {"normal", "random", "sequential"}


def test_read_only_fallback_copies_samples(make_pack, monkeypatch):
    """Where a private writable mapping is refused (strict overcommit), map read-only."""
    path, pixels, labels = make_pack(count=6)
    real_mmap = mmap.mmap

    def refuse_copy(fileno, length, *args, access=mmap.ACCESS_DEFAULT, **kw):
        if access == mmap.ACCESS_COPY:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real_mmap(fileno, length, *args, access=access, **kw)

    monkeypatch.setattr(mapping.mmap, "mmap", refuse_copy)
    ds = PackedImageDataset(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "non-writable array" warning from torch
        image, label = ds[3]
        images, got = ds.gather([5, 0])
        assert len(ds.__getitems__([5, 0])) == 2
    if os.path.exists("/proc/self/maps"):  # mapped shared and read-only, not private
        with open("/proc/self/maps") as f:
            rows = [line.split() for line in f]
        modes = {r[1] for r in rows if len(r) >= 6 and r[5] == os.path.realpath(path)}
        assert modes == {"r--s"}
    image.fill_(0)  # a private copy: safe to write
    np.testing.assert_array_equal(ds[3][0].permute(1, 2, 0).numpy(), pixels[3])
    assert label == labels[3] and got.tolist() == labels[[5, 0]].tolist()
    assert torch.equal(images, torch.stack([ds[5][0], ds[0][0]]))
