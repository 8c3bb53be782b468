"""Warming the page cache: behind the loader, never before the first batch, once per node."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from imgpack.reader import mapping
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.mapping import PackMapping, lock_path
from imgpack.reader.options import InProcessOptions
from imgpack.reader.packs import Packs
from imgpack.reader.run import DEMAND


@pytest.mark.parametrize("threaded", [False, True])
def test_the_first_batch_does_not_wait_for_the_warm(make_pack, monkeypatch, threaded):
    opts = InProcessOptions(prefetch=2 if threaded else 0)  # a background thread, or none
    path, pixels, _ = make_pack(count=40)
    gate, calls, gathers = threading.Event(), [], []
    real = mapping.PackMapping._populate
    real_gather = Packs.copy

    def slow(self, start, length):  # a warm that takes as long as the test wants
        calls.append(len(gathers))  # how many batches were gathered before this chunk
        gate.wait(10)
        real(self, start, length)

    def counted(self, *args):
        out = real_gather(self, *args)
        gathers.append(1)
        return out

    monkeypatch.setattr(mapping.PackMapping, "_populate", slow)
    monkeypatch.setattr(Packs, "copy", counted)
    ds = PackedImageDataset(path, prefault=True)
    loader = make_loader(ds, 8, shuffle=False, options=opts)
    images, _ = next(iter(loader))
    np.testing.assert_array_equal(images.permute(0, 2, 3, 1).numpy(), pixels[:8])
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:  # the warm goes on behind the batch
        time.sleep(0.01)
    assert calls and calls[0] >= 1  # its first chunk came after the first batch was read
    pack = ds._packs[0]
    assert pack.warm_state == "warming" and not ds._in_page_cache
    gate.set()
    assert pack.wait_warm(10) and pack.warm_state == "done" and ds._in_page_cache


def test_the_warm_pauses_while_a_loader_waits_for_a_batch(make_pack, monkeypatch):
    path, _, _ = make_pack(count=10)
    monkeypatch.setattr("imgpack.reader.mapping.CHUNK_BYTES", 8)  # many tiny chunks
    chunks = []
    ds = PackedImageDataset(path)
    px = ds.indexes[0].sections["pixels"]
    warmer = _warm(ds.indexes[0], lambda s, n: chunks.append(s))
    DEMAND.add(1)  # a loader is waiting for a batch
    try:
        assert warmer.start_warm() == "warming"
        assert not warmer.wait_warm(0.2) and chunks == []  # nothing read while it waits
    finally:
        DEMAND.add(-1)
    assert warmer.wait_warm(10) and warmer.warm_state == "done"
    assert len(chunks) == -(-px.nbytes // 8)


def test_one_warm_per_node_and_none_after_it_is_done(make_pack):
    path, _, _ = make_pack(count=10)
    gate = threading.Event()
    ix = PackedImageDataset(path).indexes[0]
    first = _warm(ix, lambda s, n: gate.wait(10))
    second = _warm(ix, lambda s, n: None)
    assert first.start_warm() == "warming"
    assert second.start_warm() == "skipped" and not second.warm  # the lock is taken
    gate.set()
    assert first.wait_warm(10) and first.warm_state == "done"
    assert second.warm  # the lock file now says so
    third = _warm(ix, lambda s, n: pytest.fail("warmed twice"))
    assert third.start_warm() == "skipped" and third.warm


def test_close_stops_the_warm_and_frees_the_lock(make_pack, monkeypatch):
    path, _, _ = make_pack(count=10)
    stop_seen = threading.Event()

    def endless(self, start, length):
        stop_seen.wait(0.05)

    monkeypatch.setattr(mapping.PackMapping, "_populate", endless)
    monkeypatch.setattr("imgpack.reader.mapping.CHUNK_BYTES", 8)  # many tiny chunks
    ds = PackedImageDataset(path, prefault=True)
    ds[0]
    warmer = ds._packs[0]
    assert warmer.warm_state == "warming"
    ds.close()
    assert warmer.warm_state == "stopped" and not warmer.warm
    again = _warm(ds.indexes[0], lambda s, n: None)
    assert again.start_warm() == "warming" and again.wait_warm(10)
    assert again.warm_state == "done"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="counts warms across forked workers")
def test_real_workers_warm_once_between_them(make_pack, tmp_path, monkeypatch):
    path, _, _ = make_pack(count=60)
    log = tmp_path / "warms.log"
    real = mapping.PackMapping._populate

    def logged(self, start, length):  # inherited by the forked workers
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        real(self, start, length)

    monkeypatch.setattr(mapping.PackMapping, "_populate", logged)
    ds = PackedImageDataset(path, prefault=True)
    from imgpack.reader.options import WorkerOptions

    options = WorkerOptions(multiprocessing_context="fork")
    loader = make_loader(ds, 6, seed=1, num_workers=2, options=options)
    assert sum(len(y) for _, y in loader) == 60
    loader.close()
    warmers = set(log.read_text().split())
    assert len(warmers) == 1 and str(os.getpid()) not in warmers  # one worker, not the parent
    with open(lock_path(ds.indexes[0].data_path, *_pixels(ds))) as f:
        assert f.read() == "done\n"


def _warm(index, populate):
    """A mapping of ``index`` whose warm reads through ``populate`` (mapping nothing)."""
    pack = PackMapping(index, prefault=False)
    pack._populate = populate
    return pack


def _pixels(ds):
    px = ds.indexes[0].sections["pixels"]
    return px.offset, px.nbytes
