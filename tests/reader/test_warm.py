"""Warming the page cache: behind the loader, never before the first batch, once per node.

The warm reads through ``mapping.prefault``, chunk by chunk: the tests replace it to make a
warm slow, endless or logged, and watch it through its thread ("imgpack-warm") and the node's
lock file, which says "done" once a warm is complete.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from imgpack.reader import mapping
from imgpack.reader.dataset import PackedImageDataset, Packs
from imgpack.reader.loader import make_loader
from imgpack.reader.mapping import PackMapping, lock_path
from imgpack.reader.options import InProcessOptions, WorkerOptions
from imgpack.reader.run import DEMAND


def warm_threads(before=()):
    return [t for t in threading.enumerate() if t.name == "imgpack-warm" and t not in before]


def ended(before=(), timeout=10.0) -> bool:
    """Join the warm threads started since ``before``: True once every one has ended."""
    threads = warm_threads(before)
    for thread in threads:
        thread.join(timeout)
    return not any(thread.is_alive() for thread in threads)


def warmed(ds) -> bool:
    """Whether the node's lock file of the dataset's (first) pack says its warm is done."""
    px = ds.indexes[0].sections["pixels"]
    try:
        with open(lock_path(ds.indexes[0].data_path, px.offset, px.nbytes)) as f:
            return f.read() == "done\n"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("threaded", [False, True])
def test_the_first_batch_does_not_wait_for_the_warm(make_pack, monkeypatch, threaded):
    opts = InProcessOptions(prefetch=2 if threaded else 0)  # a background thread, or none
    path, pixels, _ = make_pack(count=40)
    gate, calls, gathers = threading.Event(), [], []
    real = mapping.prefault
    real_gather = Packs.copy

    def slow(mm, start, length):  # a warm that takes as long as the test wants
        calls.append(len(gathers))  # how many batches were gathered before this chunk
        gate.wait(10)
        return real(mm, start, length)

    def counted(self, *args):
        out = real_gather(self, *args)
        gathers.append(1)
        return out

    monkeypatch.setattr(mapping, "prefault", slow)
    # a batch's read, seen from inside: the only witness of its order against the warm's
    monkeypatch.setattr(Packs, "copy", counted)
    before = warm_threads()
    ds = PackedImageDataset(path, prefault=True)
    loader = make_loader(ds, 8, shuffle=False, options=opts)
    images, _ = next(iter(loader))
    np.testing.assert_array_equal(images.permute(0, 2, 3, 1).numpy(), pixels[:8])
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:  # the warm goes on behind the batch
        time.sleep(0.01)
    assert calls and calls[0] >= 1  # its first chunk came after the first batch was read
    [thread] = warm_threads(before)
    assert thread.is_alive() and not warmed(ds)
    gate.set()
    thread.join(10)
    assert not thread.is_alive() and warmed(ds)


def test_the_warm_pauses_while_a_loader_waits_for_a_batch(make_pack, monkeypatch):
    path, _, _ = make_pack(count=10)
    monkeypatch.setattr("imgpack.reader.mapping.CHUNK_BYTES", 8)  # many tiny chunks
    chunks = []
    monkeypatch.setattr(mapping, "prefault", lambda mm, s, n: chunks.append(s))
    ds = PackedImageDataset(path)
    px = ds.indexes[0].sections["pixels"]
    warmer, before = _mapped(ds.indexes[0]), warm_threads()
    DEMAND.add(1)  # a loader is waiting for a batch
    try:
        assert warmer.start_warm() == "warming"
        assert not ended(before, 0.2) and chunks == []  # nothing read while it waits
    finally:
        DEMAND.add(-1)
    assert ended(before) and warmer.warm_state == "done"
    assert len(chunks) == -(-px.nbytes // 8)


def test_one_warm_per_node_and_none_after_it_is_done(make_pack, monkeypatch):
    path, _, _ = make_pack(count=10)
    gate = threading.Event()
    monkeypatch.setattr(mapping, "prefault", lambda mm, s, n: gate.wait(10))
    ix = PackedImageDataset(path).indexes[0]
    first, second = _mapped(ix), _mapped(ix)
    before = warm_threads()
    assert first.start_warm() == "warming"
    assert second.start_warm() == "skipped" and not second.warm  # the lock is taken
    gate.set()
    assert ended(before) and first.warm_state == "done"
    assert second.warm  # the lock file now says so
    monkeypatch.setattr(mapping, "prefault", lambda mm, s, n: pytest.fail("warmed twice"))
    third = _mapped(ix)
    assert third.start_warm() == "skipped" and third.warm


def test_close_stops_the_warm_and_frees_the_lock(make_pack, monkeypatch):
    path, _, _ = make_pack(count=10)
    stop_seen = threading.Event()
    monkeypatch.setattr(mapping, "prefault", lambda mm, s, n: stop_seen.wait(0.05))
    monkeypatch.setattr("imgpack.reader.mapping.CHUNK_BYTES", 8)  # many tiny chunks
    before = warm_threads()
    ds = PackedImageDataset(path, prefault=True)
    ds[0]
    [thread] = warm_threads(before)  # an endless warm
    assert thread.is_alive()
    ds.close()
    assert not thread.is_alive() and not warmed(ds)  # stopped and joined, not done
    monkeypatch.setattr(mapping, "prefault", lambda mm, s, n: None)
    again = _mapped(ds.indexes[0])
    assert again.start_warm() == "warming" and ended(before)  # the lock was freed
    assert again.warm_state == "done" and warmed(ds)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="counts warms across forked workers")
def test_real_workers_warm_once_between_them(make_pack, tmp_path, monkeypatch):
    path, _, _ = make_pack(count=60)
    log = tmp_path / "warms.log"
    real = mapping.prefault

    def logged(mm, start, length):  # inherited by the forked workers
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(mm, start, length)

    monkeypatch.setattr(mapping, "prefault", logged)
    ds = PackedImageDataset(path, prefault=True)
    options = WorkerOptions(multiprocessing_context="fork")
    loader = make_loader(ds, 6, seed=1, num_workers=2, options=options)
    assert sum(len(y) for _, y in loader) == 60
    loader.close()
    warmers = set(log.read_text().split())
    assert len(warmers) == 1 and str(os.getpid()) not in warmers  # one worker, not the parent
    assert warmed(ds)


def _mapped(index):
    """A mapping of ``index``, mapped in this process, whose warm has not started."""
    pack = PackMapping(index, prefault=False)
    pack.views  # noqa: B018 - maps the file
    return pack
