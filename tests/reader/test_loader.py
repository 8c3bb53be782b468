"""make_loader / PackLoader: both modes, real workers, epochs, mid-epoch resume, defaults."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from imgpack.errors import LoaderConfigError
from imgpack.reader import loader as loader_mod
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import PackLoader, _SeedWorker, choose_mode, make_loader
from imgpack.reader.order import EpochOrder


@pytest.fixture
def pack(make_pack):
    path, pixels, labels = make_pack(count=45, height=8, width=6)
    return PackedImageDataset(path), pixels, labels


def ids(images, pixels):
    """Which records a batch holds, recovered from the pixels themselves."""
    flat = pixels.reshape(len(pixels), -1)
    got = images.permute(0, 2, 3, 1).reshape(images.shape[0], -1).numpy()
    return [int(np.flatnonzero((flat == row).all(axis=1))[0]) for row in got]


def sequence(loader, pixels, batches):
    """Record ids of the next ``batches`` batches, across epoch ends."""
    out = []
    while len(out) < batches:
        for images, _labels in loader:
            out.append(ids(images, pixels))
            if len(out) == batches:
                break
    return out


def test_inprocess_and_workers_yield_the_same_batches(pack):
    ds, pixels, labels = pack
    fast = make_loader(ds, 8, seed=3)
    workers = make_loader(ds, 8, seed=3, num_workers=2)
    assert (fast.mode, workers.mode) == ("inprocess", "workers")
    assert isinstance(workers.dataloader, torch.utils.data.DataLoader) and fast.dataloader is None
    for epoch in range(2):  # the epoch advances by itself after each full pass
        expected = EpochOrder(45, batch_size=8, seed=3).indices(epoch)
        compared = 0
        for k, ((x, y), (u, v)) in enumerate(zip(fast, workers)):  # in-process views: check now
            compared += 1
            assert torch.equal(x, u) and torch.equal(y, v)
            idx = expected[k * 8 : (k + 1) * 8]
            np.testing.assert_array_equal(x.permute(0, 2, 3, 1).numpy(), pixels[idx])
            np.testing.assert_array_equal(y.numpy(), labels[idx])
            assert x.is_contiguous(memory_format=torch.channels_last)
        assert compared == len(fast) == len(workers) == 6
        assert fast.epoch == workers.epoch == epoch


def test_resume_mid_epoch_with_workers_continues_the_same_sequence(pack):
    ds, pixels, _ = pack
    kw = dict(seed=11, num_workers=2, drop_last=True)
    uninterrupted = sequence(make_loader(ds, 4, **kw), pixels, 16)  # 11 per epoch: crosses one
    first = make_loader(ds, 4, **kw)
    head = sequence(first, pixels, 7)
    state = first.state_dict()
    assert (state["epoch"], state["batches_done"]) == (0, 7)
    second = make_loader(ds, 4, **kw)
    second.load_state_dict(state)
    second.set_epoch(0)  # a training loop's set_epoch for the restored epoch keeps the place
    tail = sequence(second, pixels, 9)
    assert head + tail == uninterrupted


def test_a_state_from_one_mode_resumes_in_the_other(pack):
    ds, pixels, _ = pack
    workers = make_loader(ds, 5, seed=2, num_workers=1)
    head = sequence(workers, pixels, 4)
    fast = make_loader(ds, 5, seed=2)
    fast.load_state_dict(workers.state_dict())
    assert head + sequence(fast, pixels, 5) == sequence(make_loader(ds, 5, seed=2), pixels, 9)


def test_break_continues_where_it_stopped_and_set_epoch_jumps(pack):
    ds, pixels, _ = pack
    loader = make_loader(ds, 10, seed=1)
    whole = sequence(make_loader(ds, 10, seed=1), pixels, 5)
    assert sequence(loader, pixels, 2) + sequence(loader, pixels, 3) == whole
    loader.set_epoch(4)
    assert loader.epoch == 4
    expected = EpochOrder(45, batch_size=10, seed=1).indices(4)
    assert sum(sequence(loader, pixels, 5), []) == expected.tolist()


def test_sequential_order_without_shuffle(pack):
    ds, pixels, _ = pack
    got = sum(sequence(make_loader(ds, 7, shuffle=False), pixels, 7), [])
    assert got == list(range(45))


def test_explicit_ranks_split_each_epoch(pack):
    ds, pixels, _ = pack
    shares = [
        sum(sequence(make_loader(ds, 4, rank=r, world_size=3, seed=5), pixels, 4), [])
        for r in range(3)
    ]
    assert sorted(sum(shares, [])) == list(range(45))


def test_workers_mode_defaults(pack):
    ds, _, _ = pack
    dl = make_loader(ds, 8, mode="workers").dataloader
    assert dl.num_workers == loader_mod.default_workers() >= 1
    assert dl.prefetch_factor == loader_mod.DEFAULT_PREFETCH_FACTOR
    assert dl.persistent_workers is True
    assert dl.pin_memory is torch.cuda.is_available()
    assert make_loader(ds, 8, num_workers=0).dataloader.num_workers == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")
def test_pin_memory_without_cuda_is_turned_off_with_one_warning(pack, monkeypatch):
    ds, _, _ = pack
    monkeypatch.setattr(loader_mod, "_warned_pin", False)
    with pytest.warns(RuntimeWarning, match="pin_memory=True ignored"):
        a = make_loader(ds, 8, num_workers=0, pin_memory=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = make_loader(ds, 8, pin_memory=True)  # in-process: no second warning, no error
    assert a.dataloader.pin_memory is False and b.mode == "inprocess"
    assert len(list(b)) == 6


def test_auto_mode_picks_workers_only_when_asked(pack):
    ds, _, _ = pack
    assert choose_mode(ds, num_workers=None, dataloader_kwargs={}) == loader_mod.AUTO_MODE
    assert choose_mode(ds, num_workers=None, dataloader_kwargs={"timeout": 5}) == "inprocess"
    assert choose_mode(ds, num_workers=2, dataloader_kwargs={}) == "workers"
    assert choose_mode(ds, num_workers=None, dataloader_kwargs={"collate_fn": id}) == "workers"
    ds.transform = lambda x: x
    assert choose_mode(ds, num_workers=None, dataloader_kwargs={}) == "workers"
    assert choose_mode([1, 2], num_workers=None, dataloader_kwargs={}) == "workers"


def test_worker_init_seeds_numpy_from_torch_and_calls_the_users_fn():
    called = []
    torch.manual_seed(1234)
    _SeedWorker(called.append)(3)
    assert called == [3]
    assert np.random.get_state()[1][0] == np.random.RandomState(1234).get_state()[1][0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "threads"}, "mode should be one of"),
        ({"sampler": None}, "make_loader sets sampler itself"),
        ({"mode": "inprocess", "num_workers": 2}, "takes no worker processes"),
        ({"mode": "inprocess", "collate_fn": id}, "takes no collate_fn"),
        ({"num_workers": 0, "persistent_workers": True}, "persistent_workers=True needs"),
        ({"num_workers": 0, "prefetch_factor": 2}, "prefetch_factor needs num_workers"),
        ({"distributed": True}, "needs torch.distributed initialised"),
        ({"distributed": False, "rank": 1}, "distributed=False with rank=1"),
        ({"order": "shuffled"}, "order should be one of"),
        ({"num_workers": -1}, "num_workers should be an integer >= 0"),
    ],
)
def test_bad_arguments_are_refused(pack, kwargs, match):
    with pytest.raises(LoaderConfigError, match=match):
        make_loader(pack[0], 8, **kwargs)


def test_pack_loader_is_what_make_loader_returns(pack):
    loader = make_loader(pack[0], 8, order="block", block=4, window=2)
    assert isinstance(loader, PackLoader) and len(loader) == 6 and loader.batch_size == 8
    assert loader.order.block == 4


def test_close_stops_workers_and_the_loader_still_works_after(pack):
    psutil = pytest.importorskip("psutil")
    ds, pixels, _ = pack
    me = psutil.Process()
    before = {p.pid for p in me.children()}
    with make_loader(ds, 8, num_workers=2, seed=4) as loader:
        first = sequence(loader, pixels, 6)
        workers = [p for p in me.children() if p.pid not in before]
        assert len(workers) == 2  # persistent workers stay up between passes
        loader.close()
        assert loader.dataloader._iterator is None
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive
        loader.set_epoch(0)
        assert sequence(loader, pixels, 6) == first


def test_prefetch_hints_are_sent_only_for_packs_not_prefaulted_whole(make_pack):
    path, _, _ = make_pack(count=12)
    for prefault, hinted in ((True, False), (False, True)):
        ds = PackedImageDataset(path, prefault=prefault)
        assert ds.resident is prefault
        calls = []
        ds.will_need = calls.append  # instance attribute: the loader thread calls this
        list(make_loader(ds, 4, copy=True))
        assert bool(calls) is hinted
        assert list(make_loader(ds, 4, copy=True, prefetch_hints=True)) and calls


def test_default_gather_threads_follow_the_usable_cores(pack, monkeypatch):
    ds, _, _ = pack
    monkeypatch.setattr(loader_mod, "usable_cores", lambda: 1)
    assert make_loader(ds, 4)._source.threads == 1
    monkeypatch.setattr(loader_mod, "usable_cores", lambda: 16)
    assert make_loader(ds, 4)._source.threads == loader_mod.DEFAULT_GATHER_THREADS
    assert make_loader(ds, 4, gather_threads=3)._source.threads == 3
