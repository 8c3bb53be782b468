"""InProcessLoader: right batches, batches that stay the user's, errors, hints, thread cleanup."""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections import deque

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from imgpack.errors import InvalidArgumentError, LoaderError
from imgpack.reader import inprocess
from imgpack.reader.background import THREAD_NAME
from imgpack.reader.buffers import BufferPool
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.inprocess import InProcessLoader


def loader_threads():
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


@pytest.fixture
def pack(make_pack):
    path, pixels, labels = make_pack(count=40, height=8, width=6)
    return PackedImageDataset(path), pixels, labels


class Spy:
    """A PackedSource that delegates to a real dataset; records calls, can fail or stall on
    a chosen batch."""

    transform = target_transform = None
    resident = False  # never known warm: every batch is hinted

    def __init__(self, ds, fail_at=None, stall_at=None):
        self.ds, self.fail_at, self.stall_at = ds, fail_at, stall_at
        self.calls: list[tuple[str, list[int]]] = []
        self.release = threading.Event()

    @property
    def shape(self):
        return self.ds.shape

    @property
    def record_sizes(self):
        return self.ds.record_sizes

    @property
    def codec(self):
        return self.ds.codec

    @property
    def shard_sizes(self):
        return self.ds.shard_sizes

    @property
    def pack_id(self):
        return self.ds.pack_id

    def __len__(self):
        return len(self.ds)

    def gather(self, idx):
        return self.ds.gather(idx)

    def gather_targets(self, idx):
        return self.ds.gather_targets(idx)

    def will_need(self, idx):
        self.calls.append(("will_need", list(idx)))

    def gather_into(self, idx, out_images, out_labels):
        n = sum(1 for kind, _ in self.calls if kind == "gather")
        self.calls.append(("gather", list(idx)))
        if n == self.fail_at:
            raise IndexError(f"boom at {n}")
        if n == self.stall_at:
            self.release.wait(timeout=1.0)
        return self.ds.gather_into(idx, out_images, out_labels)


@pytest.fixture(autouse=True)
def _threaded(monkeypatch):
    """These packs' batches are tiny; the tests here are about the background thread, so
    every batch goes through it (``test_small_batches_*`` cover the in-thread path)."""
    monkeypatch.setattr(inprocess, "INLINE_BYTES", 0)


def plan_of(n=40, bs=6, seed=0):
    order = np.random.default_rng(seed).permutation(n)
    return [order[i : i + bs] for i in range(0, n, bs)]


def batches(loader):
    """The batches of one pass (the loader yields (batch, records) pairs)."""
    for batch, _records in loader:
        yield batch


def hwc(x):
    return x.permute(0, 2, 3, 1).numpy()


def test_batches_equal_the_records_in_channels_last_layout(pack):
    ds, pixels, labels = pack
    plan = plan_of()
    got = [(x, y, r) for (x, y), r in InProcessLoader(ds, plan)]
    assert len(got) == len(plan)
    for (x, y, records), idx in zip(got, plan):
        assert records.dtype == torch.int64 and records.tolist() == idx.tolist()
        assert x.shape == (idx.size, 3, 8, 6) and x.dtype == torch.uint8
        assert x.is_contiguous(memory_format=torch.channels_last)
        np.testing.assert_array_equal(x.permute(0, 2, 3, 1).numpy(), pixels[idx])
        assert y.dtype == torch.int64
        np.testing.assert_array_equal(y.numpy(), labels[idx])


def test_list_of_the_loader_keeps_every_batch_intact(pack):
    ds, pixels, _ = pack
    plan = plan_of(bs=4)
    kept = list(batches(InProcessLoader(ds, plan, prefetch=1)))
    assert len({x.data_ptr() for x, _ in kept}) == len(plan)
    for (x, _), idx in zip(kept, plan):
        np.testing.assert_array_equal(hwc(x), pixels[idx])


def test_views_of_a_batch_and_look_ahead_keep_their_records(pack):
    ds, pixels, _ = pack
    plan = plan_of(n=40, bs=2) * 3
    views, ahead = [], deque()
    for k, (x, _) in enumerate(batches(InProcessLoader(ds, plan, prefetch=1))):
        if k % 5 == 0:
            views.append((k, x[1:], x.permute(0, 2, 3, 1).numpy()[:1]))  # slices outlive x
        ahead.append((k, x))
        if len(ahead) > 3:  # a look-ahead prefetcher holding three batches
            j, old = ahead.popleft()
            np.testing.assert_array_equal(hwc(old), pixels[plan[j]])
    for k, tail, head in views:
        np.testing.assert_array_equal(hwc(tail), pixels[plan[k][1:]])
        np.testing.assert_array_equal(head, pixels[plan[k][:1]])


def test_the_usual_loop_reuses_a_few_buffers_instead_of_allocating(pack):
    ds, pixels, _ = pack
    plan = plan_of(bs=4) * 6
    loader = InProcessLoader(ds, plan, prefetch=2)
    for k, (x, _) in enumerate(batches(loader)):
        np.testing.assert_array_equal(hwc(x), pixels[plan[k]])
    assert loader.buffers.allocated <= loader.prefetch + 4 < len(plan)


def test_the_last_batch_and_a_break_survive_the_next_pass(pack):
    ds, pixels, _ = pack
    plan = plan_of(bs=4)
    loader = InProcessLoader(ds, plan)
    for x, _ in batches(loader):
        last = x
    for x, _ in batches(loader):
        first = x
        break
    for _ in batches(loader):
        pass
    np.testing.assert_array_equal(hwc(last), pixels[plan[-1]])
    np.testing.assert_array_equal(hwc(first), pixels[plan[0]])


def test_per_sample_collate_runs_the_datasets_transform(make_pack):
    path, pixels, labels = make_pack(count=12)
    ds = PackedImageDataset(path, transform=lambda im: im.float() / 2, target_transform=str)
    plan = plan_of(n=12, bs=5)
    got = list(InProcessLoader(ds, plan, collate=default_collate))
    for ((x, y), records), idx in zip(got, plan):
        assert x.dtype == torch.float32 and records.tolist() == idx.tolist()
        np.testing.assert_array_equal(hwc(x), pixels[idx] / 2)
        assert list(y) == [str(v) for v in labels[idx]]


def test_each_pass_restarts_the_plan(pack):
    ds, _, _ = pack
    loader = InProcessLoader(ds, plan_of())
    first = [y for _, y in batches(loader)]
    second = [y for _, y in batches(loader)]
    assert all(torch.equal(a, b) for a, b in zip(first, second)) and len(first) == 7


def test_will_need_announces_each_batch_before_the_one_ahead_of_it_is_gathered(pack):
    spy = Spy(pack[0])
    plan = plan_of(bs=10)
    for _ in InProcessLoader(spy, plan):
        pass
    hinted = [c for c in spy.calls if c[0] == "will_need"]
    assert [h[1] for h in hinted] == [list(p) for p in plan]
    # the first batch's reads go out alone: batch 1 is announced once batch 0 is gathered
    assert spy.calls[:3] == [("will_need", list(plan[0])), ("gather", list(plan[0])),
                             ("will_need", list(plan[1]))]  # fmt: skip
    for k in range(2, len(plan)):  # then batch k is hinted before batch k - 1 is gathered
        assert spy.calls.index(("will_need", list(plan[k]))) < spy.calls.index(
            ("gather", list(plan[k - 1]))
        )
    spy.calls.clear()
    for _ in InProcessLoader(spy, plan, hints=False):
        pass
    assert all(kind == "gather" for kind, _ in spy.calls)


def test_an_error_in_the_thread_is_raised_in_the_consumer_with_context(pack):
    spy = Spy(pack[0], fail_at=2)
    got = []
    with pytest.raises(IndexError, match="boom at 2") as info:
        for x, _ in batches(InProcessLoader(spy, plan_of())):
            got.append(x)
    assert len(got) == 2
    if sys.version_info >= (3, 11):  # exceptions carry notes from 3.11 on
        assert "in-process loader thread while gathering batch 2" in info.value.__notes__[0]
    assert not loader_threads()


def test_timeout_raises_loader_error(pack):
    spy = Spy(pack[0], stall_at=1)
    with pytest.raises(LoaderError, match="no batch within timeout=0.2 s"):
        for _ in InProcessLoader(spy, plan_of(), timeout=0.2):
            pass
    spy.release.set()
    assert not loader_threads()


def test_break_and_garbage_collection_stop_the_thread(pack):
    ds, _, _ = pack
    loader = InProcessLoader(ds, plan_of(bs=2))
    for _ in loader:
        assert len(loader_threads()) == 1
        break
    assert not loader_threads()
    it = iter(loader)
    next(it)
    assert len(loader_threads()) == 1
    del it
    gc.collect()
    assert not loader_threads()


def test_keyboard_interrupt_in_the_loop_stops_the_thread(pack):
    ds, _, _ = pack
    with pytest.raises(KeyboardInterrupt):
        for k, _ in enumerate(InProcessLoader(ds, plan_of(bs=2))):
            if k == 3:
                raise KeyboardInterrupt
    gc.collect()
    assert not loader_threads()


def test_a_new_pass_stops_the_one_before(pack):
    ds, _, _ = pack
    loader = InProcessLoader(ds, plan_of(bs=2))
    a = iter(loader)
    next(a)
    b = iter(loader)
    next(b)
    assert len(loader_threads()) == 1
    b.close()
    assert not loader_threads()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"prefetch": 0}, "prefetch should be an integer >= 1"),
        ({"threads": 0}, "threads should be an integer >= 1"),
        ({"timeout": 0}, "timeout should be > 0"),
    ],
)
def test_bad_arguments_are_refused(pack, kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        InProcessLoader(pack[0], plan_of(), **kwargs)


def test_a_dataset_without_gather_is_refused():
    with pytest.raises(InvalidArgumentError, match="needs a dataset with gather"):
        InProcessLoader([1, 2, 3], [[0]])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")
def test_pinning_without_cuda_is_refused_here(pack):
    with pytest.raises(InvalidArgumentError, match="pin_memory=True needs CUDA"):
        InProcessLoader(pack[0], plan_of(), pin_memory=True)


def test_close_stops_the_pass_under_way(pack):
    ds, _, _ = pack
    loader = InProcessLoader(ds, plan_of(bs=2))
    it = iter(loader)
    next(it)
    loader.close()
    assert not loader_threads()
    with pytest.raises(LoaderError, match="was closed"):
        next(it)
    assert sum(1 for _ in loader) == 20  # a new pass starts afresh


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_batches_split_over_threads_equal_the_records(pack, threads):
    ds, pixels, labels = pack
    plan = plan_of(bs=7) + [np.array([5]), np.array([3, 1])]  # batches smaller than threads too
    spy = Spy(ds)
    got = list(batches(InProcessLoader(spy, plan, threads=threads)))
    assert len(got) == len(plan)
    for (x, y), idx in zip(got, plan):
        np.testing.assert_array_equal(x.permute(0, 2, 3, 1).numpy(), pixels[idx])
        np.testing.assert_array_equal(y.numpy(), labels[idx])
    parts = [idx for kind, idx in spy.calls if kind == "gather"]
    share = -(-7 // min(threads, 7))
    assert sorted(i for p in parts[: min(threads, 7)] for i in p) == sorted(plan[0])  # batch 0,
    assert max(len(p) for p in parts[: min(threads, 7)]) <= share  # due at once, was split
    assert sorted(i for p in parts for i in p) == sorted(i for b in plan for i in b.tolist())


def test_a_batch_gathered_with_the_queue_full_takes_one_thread(pack):
    """While ``prefetch`` batches wait for the consumer, the next one is gathered by one
    thread, leaving the other core to the consumer; until then every batch is split."""
    ds, pixels, _ = pack
    spy = Spy(ds)
    plan = plan_of(bs=8)
    it = iter(InProcessLoader(spy, plan, threads=2, prefetch=2))
    try:
        (first, _), _ = next(it)  # hold on: batches 1 and 2 fill the queue, then batch 3

        def gathered(k):
            return [p for kind, p in spy.calls if kind == "gather" and set(p) & set(plan[k])]

        deadline = time.monotonic() + 10
        while not gathered(3) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [len(p) for p in gathered(0)] == [4, 4]  # nothing queued: split
        assert [len(p) for p in gathered(1)] == [4, 4]  # the queue not full yet: split
        assert gathered(3) == [list(plan[3])]  # batches 1 and 2 sat queued: one thread
        np.testing.assert_array_equal(hwc(first), pixels[plan[0]])
        got = [x for (x, _), _ in it]
        assert len(got) == len(plan) - 1
        for x, idx in zip(got, plan[1:]):
            np.testing.assert_array_equal(hwc(x), pixels[idx])
    finally:
        it.close()


def test_helper_threads_end_with_the_pass(pack):
    ds, _, _ = pack
    loader = InProcessLoader(ds, plan_of(), threads=3)
    for _ in loader:
        break
    helpers = [t for t in threading.enumerate() if t.name.startswith(f"{THREAD_NAME}-helper")]
    assert not [t for t in helpers if t.is_alive()]
    assert not loader_threads()


def test_a_buffer_is_reused_only_once_nothing_refers_to_it():
    pool = BufferPool(limit=4)
    t, fill = pool.take(4, (2, 2, 3))
    fill[...] = 7
    view = t[1:].permute(0, 3, 1, 2)  # a view outlives the tensor it came from
    del t, fill
    other, _ = pool.take(4, (2, 2, 3))
    assert pool.allocated == 2 and other.data_ptr() != view.data_ptr() - 12
    assert int(view.min()) == 7
    del view, other
    again, _ = pool.take(3, (2, 2, 3))  # a shorter batch fits a free buffer
    assert pool.allocated == 2
    _, spare = pool.take(5, (2, 2, 3))  # a longer one does not
    assert pool.allocated == 3 and spare.shape == (5, 2, 2, 3) and again.shape[0] == 3


@pytest.mark.parametrize("prefetch", [1, 4])
def test_small_batches_are_gathered_in_the_callers_thread(pack, monkeypatch, prefetch):
    monkeypatch.setattr(inprocess, "INLINE_BYTES", 1 << 20)  # the shipped threshold
    ds, pixels, labels = pack
    spy = Spy(ds)
    plan = plan_of(bs=6)
    loader = InProcessLoader(spy, plan, prefetch=prefetch, threads=2)
    kept = []
    for (x, y), r in loader:
        assert not loader_threads()  # no thread: a handoff costs more than this copy
        kept.append((x, y, r))
    assert len(kept) == len(plan)
    for (x, y, r), idx in zip(kept, plan):  # every batch kept intact: no buffer reused early
        np.testing.assert_array_equal(hwc(x), pixels[idx])
        np.testing.assert_array_equal(y.numpy(), labels[idx])
        np.testing.assert_array_equal(r.numpy(), idx)
    kinds = [kind for kind, _ in spy.calls]
    assert kinds[:5] == ["will_need", "gather", "will_need", "will_need", "gather"]  # as threaded


def test_small_batches_reuse_buffers_and_raise_errors_directly(pack, monkeypatch):
    monkeypatch.setattr(inprocess, "INLINE_BYTES", 1 << 20)
    ds, _, _ = pack
    loader = InProcessLoader(ds, plan_of(bs=4), prefetch=2)
    for _ in range(3):
        for _ in loader:
            pass
    assert loader.buffers.allocated <= 2
    with pytest.raises(IndexError, match="boom at 2"):
        for _ in InProcessLoader(Spy(ds, fail_at=2), plan_of()):
            pass
