"""InProcess: the read stage in this process, in the loop's thread or one ahead of it: right
batches, batches that stay the user's, errors, hints, thread cleanup."""

from __future__ import annotations

import gc
import sys
import threading
from collections import deque

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from imgpack.errors import LoaderError
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.order import EpochOrder
from imgpack.reader.read import Batch, BufferPool, Gather, Plan, Samples
from imgpack.reader.run import THREAD_NAME, InProcess


def loader_threads():
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


@pytest.fixture
def pack(make_pack):
    path, pixels, labels = make_pack(count=40, height=8, width=6)
    return PackedImageDataset(path), pixels, labels


class Spy:
    """The read stage of a raw pack with every hint and every batch's read recorded, which can
    fail or stall on a chosen batch: ``InProcess``'s two callables, ``hint`` and ``read``."""

    def __init__(self, ds, fail_at=None, stall_at=None):
        self.ds, self.fail_at, self.stall_at = ds, fail_at, stall_at
        self.calls: list[tuple[str, list[int]]] = []
        self.release = threading.Event()

    def hint(self, idx):
        self.calls.append(("will_need", list(idx)))

    def reading(self, read):
        """``read``, recorded (and failing or stalling) batch by batch."""

        def spied(batch, stop=None):
            n = sum(1 for kind, _ in self.calls if kind == "gather")
            self.calls.append(("gather", batch.records.tolist()))
            if n == self.fail_at:
                raise IndexError(f"boom at {n}")
            if n == self.stall_at:
                self.release.wait(timeout=0.5)  # past the loader's 0.2 s
            return read(batch, stop)

        return spied


class Loader:
    """The read stage of a raw pack run by ``InProcess`` over a fixed plan: what make_loader
    assembles, without the order and the device stages. Each pass yields (images, labels,
    records). ``ds`` may be a ``Spy`` of a dataset, which sees the hints and the reads."""

    def __init__(self, ds, plan, *, prefetch=2, threads=1, hints=True, timeout=None):
        spy = ds if isinstance(ds, Spy) else None
        ds = ds.ds if spy else ds
        self.buffers = BufferPool(prefetch + 4)
        self.plan, self.hw = [np.asarray(p, np.int64) for p in plan], ds.shape[:2]
        read = Gather(ds, self.buffers, threads)
        self.prefetch = prefetch
        hint = spy.hint if spy and hints else None
        read = spy.reading(read) if spy else read
        self.source = InProcess(read, hint, prefetch=prefetch, timeout=timeout)

    def __iter__(self):
        # each pass makes its requests, as ``Plan`` does: a batch has one owner at a time
        for batch in self.source.batches(Batch(p, self.hw) for p in self.plan):
            yield (*batch.output(), torch.from_numpy(batch.records))

    def close(self):
        self.source.close()


def plan_of(n=40, bs=6, seed=0):
    order = np.random.default_rng(seed).permutation(n)
    return [order[i : i + bs] for i in range(0, n, bs)]


def batches(loader):
    """The (images, labels) of one pass."""
    for x, y, _records in loader:
        yield x, y


def hwc(x):
    return x.permute(0, 2, 3, 1).numpy()


def test_batches_equal_the_records_in_channels_last_layout(pack):
    ds, pixels, labels = pack
    plan = plan_of()
    got = list(Loader(ds, plan))
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
    kept = list(batches(Loader(ds, plan, prefetch=1)))
    assert len({x.data_ptr() for x, _ in kept}) == len(plan)
    for (x, _), idx in zip(kept, plan):
        np.testing.assert_array_equal(hwc(x), pixels[idx])


def test_views_of_a_batch_and_look_ahead_keep_their_records(pack):
    ds, pixels, _ = pack
    plan = plan_of(n=40, bs=2) * 3
    views, ahead = [], deque()
    for k, (x, _) in enumerate(batches(Loader(ds, plan, prefetch=1))):
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
    loader = Loader(ds, plan, prefetch=2)
    for k, (x, _) in enumerate(batches(loader)):
        np.testing.assert_array_equal(hwc(x), pixels[plan[k]])
    assert loader.buffers.allocated <= loader.prefetch + 4 < len(plan)


def test_the_last_batch_and_a_break_survive_the_next_pass(pack):
    ds, pixels, _ = pack
    plan = plan_of(bs=4)
    loader = Loader(ds, plan)
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
    order = EpochOrder(12, batch_size=5, shuffle=False)
    plan = Plan(order, (0, 0), None)
    plan.begin()
    samples = InProcess(Samples(ds, default_collate), prefetch=2)
    got = [(b.output(), b.records) for b in samples.batches(plan)]
    assert len(got) == 3
    for ((x, y), records), idx in zip(got, order.batches(0)):
        assert x.dtype == torch.float32 and records.tolist() == idx.tolist()
        np.testing.assert_array_equal(hwc(x), pixels[idx] / 2)
        assert list(y) == [str(v) for v in labels[idx]]


def test_each_pass_restarts_the_plan(pack):
    ds, _, _ = pack
    loader = Loader(ds, plan_of())
    first = [y for _, y in batches(loader)]
    second = [y for _, y in batches(loader)]
    assert all(torch.equal(a, b) for a, b in zip(first, second)) and len(first) == 7


def test_will_need_announces_each_batch_before_the_one_ahead_of_it_is_gathered(pack):
    spy = Spy(pack[0])
    plan = plan_of(bs=10)
    for _ in Loader(spy, plan):
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
    for _ in Loader(spy, plan, hints=False):
        pass
    assert all(kind == "gather" for kind, _ in spy.calls)


def test_an_error_in_the_thread_is_raised_in_the_consumer_with_context(pack):
    spy = Spy(pack[0], fail_at=2)
    got = []
    with pytest.raises(IndexError, match="boom at 2") as info:
        for x, _ in batches(Loader(spy, plan_of())):
            got.append(x)
    assert len(got) == 2
    if sys.version_info >= (3, 11):  # exceptions carry notes from 3.11 on
        assert "in-process loader thread while reading batch 2" in info.value.__notes__[0]
    assert not loader_threads()


def test_timeout_raises_loader_error(pack):
    spy = Spy(pack[0], stall_at=1)
    with pytest.raises(LoaderError, match="no batch within timeout=0.2 s"):
        for _ in Loader(spy, plan_of(), timeout=0.2):
            pass
    spy.release.set()
    assert not loader_threads()


def test_break_and_garbage_collection_stop_the_thread(pack):
    ds, _, _ = pack
    loader = Loader(ds, plan_of(bs=2))
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
        for k, _ in enumerate(Loader(ds, plan_of(bs=2))):
            if k == 3:
                raise KeyboardInterrupt
    gc.collect()
    assert not loader_threads()


def test_a_new_pass_stops_the_one_before(pack):
    ds, _, _ = pack
    loader = Loader(ds, plan_of(bs=2))
    a = iter(loader)
    next(a)
    b = iter(loader)
    next(b)
    assert len(loader_threads()) == 1
    b.close()
    assert not loader_threads()


def test_close_stops_the_pass_under_way(pack):
    ds, _, _ = pack
    loader = Loader(ds, plan_of(bs=2))
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
    got = list(batches(Loader(ds, plan, threads=threads)))
    assert len(got) == len(plan)
    for (x, y), idx in zip(got, plan):
        np.testing.assert_array_equal(x.permute(0, 2, 3, 1).numpy(), pixels[idx])
        np.testing.assert_array_equal(y.numpy(), labels[idx])


def test_a_pass_split_over_threads_leaves_only_the_pools_threads(pack):
    """The pool's helpers are the process's (joined at exit); the pass's own thread ends."""
    ds, _, _ = pack
    loader = Loader(ds, plan_of(), threads=3)
    for _ in loader:
        break
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


def test_when_the_shape_changes_the_pool_keeps_the_new_one():
    """A progressive resize: once the pool is full, a free buffer of the old shape makes way
    for the new shape's, which is then reused like any other."""
    pool = BufferPool(limit=2)
    for _ in range(3):
        pool.take(4, (8, 8, 3))  # each dropped at once: one buffer, reused
    assert pool.allocated == 1
    held = [pool.take(4, (8, 8, 3))[0] for _ in range(2)]  # both kept: the pool is full
    assert pool.allocated == 2
    del held
    for _ in range(4):
        t, _ = pool.take(4, (12, 12, 3))
        assert t.shape == (4, 12, 12, 3)
        del t, _
    assert pool.allocated == 3  # one buffer of the new shape, reused


def test_with_prefetch_0_batches_are_read_in_the_loops_thread(pack):
    ds, pixels, labels = pack
    spy = Spy(ds)
    plan = plan_of(bs=6)
    loader = Loader(spy, plan, prefetch=0)
    kept = []
    for x, y, r in loader:
        assert not loader_threads()  # no thread: the batch was read when the loop asked
        kept.append((x, y, r))
    assert len(kept) == len(plan)
    for (x, y, r), idx in zip(kept, plan):  # every batch kept intact: no buffer reused early
        np.testing.assert_array_equal(hwc(x), pixels[idx])
        np.testing.assert_array_equal(y.numpy(), labels[idx])
        np.testing.assert_array_equal(r.numpy(), idx)
    kinds = [kind for kind, _ in spy.calls]
    assert kinds[:5] == ["will_need", "gather", "will_need", "will_need", "gather"]  # as threaded


def test_with_prefetch_0_buffers_are_reused_and_errors_raised_directly(pack):
    ds, _, _ = pack
    loader = Loader(ds, plan_of(bs=4), prefetch=0)
    for _ in range(3):
        for _ in loader:
            pass
    assert loader.buffers.allocated <= 2
    with pytest.raises(IndexError, match="boom at 2") as info:
        for _ in Loader(Spy(ds, fail_at=2), plan_of(), prefetch=0):
            pass
    assert not getattr(info.value, "__notes__", None)  # raised here, not handed over
