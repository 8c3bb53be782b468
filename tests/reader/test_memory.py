"""Flat memory in DataLoader workers (issue #3, item 3).

A 5k-record pack at 64x64 is enough: the pixels are file-backed pages shared
through the page cache, so image size does not change what a worker's private
memory does; what grows it is per-record or per-batch Python state (a list of
per-sample objects whose refcount writes copy pages after fork, batches kept
alive, a mapping re-created per item). Batches kept alive would grow a worker by the
pack's 61 MB an epoch, over the 50 MB line; a per-sample list would copy only a few MB,
so a second, exact test checks that the dataset holds no container that grows with the
record count.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from imgpack.packer.writer import PackWriter
from imgpack.reader.dataset import PackedImageDataset

psutil = pytest.importorskip("psutil")

RECORDS, SIDE, EPOCHS, BATCH = 5_000, 64, 3, 125
GROWTH_LIMIT = 50 * 2**20


@pytest.fixture(scope="module")
def big_pack(tmp_path_factory):
    """The 5k-record pack, written once for the module: both tests only read it."""
    out = tmp_path_factory.mktemp("memory") / "big.bin"
    pixels = np.random.default_rng(0).integers(0, 256, (RECORDS, SIDE, SIDE, 3), np.uint8)
    with PackWriter(out, height=SIDE, width=SIDE, classes=["a", "b", "c"]) as w:
        for i in range(RECORDS):
            w.append(pixels[i], i % 3, f"{'abc'[i % 3]}/{i}.png")
        w.finish(packer={"size": [SIDE, SIDE], "resize": "stretch", "filter": "bilinear"})
    return out


def _status(pid: int) -> dict[str, int]:
    """RssAnon/RssFile/RssShmem of a process in bytes (Linux), for the failure message."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("RssAnon", "RssFile", "RssShmem")):
                    key, kb, _ = line.split()
                    out[key.rstrip(":")] = int(kb) * 1024
    except OSError:
        pass
    return out


def _trim_heap() -> None:
    """Hand free heap pages back to the OS (glibc) before forking, so that a worker's
    allocations cannot hide in resident-but-free pages inherited from this process."""
    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


def test_worker_rss_stays_flat_over_three_epochs(big_pack):
    ds = PackedImageDataset(big_pack)
    _trim_heap()
    me = psutil.Process()
    before = {p.pid for p in me.children()}
    loader = DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
        generator=torch.Generator().manual_seed(0),
    )
    rss: dict[int, list[int]] = {}
    detail: dict[int, list[dict[str, int]]] = {}
    seen = 0
    for _epoch in range(EPOCHS):
        for images, _labels in loader:
            seen += len(images)
            del images
        workers = [p for p in me.children() if p.pid not in before]
        assert len(workers) == 2
        for w in workers:
            rss.setdefault(w.pid, []).append(w.memory_info().rss)
            detail.setdefault(w.pid, []).append(_status(w.pid))
    assert seen == EPOCHS * RECORDS
    for pid, series in rss.items():
        assert len(series) == EPOCHS  # the same two persistent workers every epoch
        growth = series[-1] - series[0]
        assert growth < GROWTH_LIMIT, (
            f"worker {pid} RSS grew {growth / 2**20:.1f} MB from epoch 1 to {EPOCHS}: "
            f"{detail[pid][0]} -> {detail[pid][-1]}"
        )


def _containers(obj, depth=0):
    """Every list/tuple/dict/set reachable through attributes, a few levels deep."""
    if depth > 3:
        return
    if isinstance(obj, (list, tuple, dict, set, frozenset)):
        yield obj
        items = obj.values() if isinstance(obj, dict) else obj
        for item in list(items)[:50]:
            yield from _containers(item, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, np.ndarray)):
        for value in vars(obj).values():
            yield from _containers(value, depth + 1)


def test_no_state_grows_with_the_record_count(make_pack, big_pack):
    small_path, _, _ = make_pack(count=10, height=SIDE, width=SIDE, name="small")
    small, big = PackedImageDataset(small_path), PackedImageDataset(big_pack)
    for ds in (small, big):
        ds[0], ds.__getitems__([1, 2]), ds.gather([3]), ds.source_path(3), ds.labels  # lazy parts
        longest = max(len(c) for c in _containers(ds))
        assert longest < 100, f"a Python container of {longest} items: per-record state?"
    # ImageFolder's ``targets`` list is built only when asked for, and never sent to workers
    assert len(big.targets) == RECORDS
    assert abs(len(pickle.dumps(big)) - len(pickle.dumps(small))) < 256
