"""make_loader / PackLoader: both modes, real workers, epochs, resume, order, options, refusals."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import warnings
import weakref

import numpy as np
import pytest
import torch

from imgpack.errors import InvalidArgumentError, LoaderError
from imgpack.reader import loader as loader_mod
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.device import Move, takes_records
from imgpack.reader.loader import DEFAULT_PREFETCH_FACTOR, PackLoader, make_loader
from imgpack.reader.options import (
    DistributedOptions,
    InProcessOptions,
    OrderOptions,
    WorkerOptions,
)
from imgpack.reader.order import EpochOrder
from imgpack.reader.read import Batch
from imgpack.reader.transform import DeviceTransform


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


@pytest.mark.parametrize("workers", [None, 2])
def test_a_pass_cut_short_is_followed_by_a_whole_epoch_as_with_a_dataloader(pack, workers):
    ds, pixels, _ = pack
    loader = make_loader(ds, 10, seed=1, num_workers=workers)
    whole = [ids(x, pixels) for x, _ in make_loader(ds, 10, seed=1)]  # epoch 0, 5 batches
    next(iter(loader))  # a peek at one batch, as people do to see the shapes
    for i, _ in enumerate(loader):  # then a pass cut short after 2 batches
        if i == 1:
            break
    assert loader.epoch == 1
    got = [ids(x, pixels) for x, _ in loader]  # a whole epoch, not the 3 left of it
    assert len(got) == len(loader) == 5
    assert loader.epoch == 2 and sum(got, []) != sum(whole, [])
    assert sorted(sum(got, [])) == list(range(45))


def test_a_restored_state_continues_mid_epoch_then_epochs_are_whole(pack):
    ds, pixels, _ = pack
    whole = sequence(make_loader(ds, 10, seed=1), pixels, 10)  # epochs 0 and 1
    first = make_loader(ds, 10, seed=1)
    for i, _ in enumerate(first):
        if i == 1:
            break
    state = first.state_dict()  # taken after 2 batches: the next unseen is batch 2
    again = make_loader(ds, 10, seed=1)
    again.load_state_dict(state)
    rest = [ids(x, pixels) for x, _ in again]
    assert rest == whole[2:5]
    assert [ids(x, pixels) for x, _ in again] == whole[5:10]


def test_set_epoch_jumps(pack):
    ds, pixels, _ = pack
    loader = make_loader(ds, 10, seed=1)
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
        sum(
            sequence(make_loader(ds, 4, seed=5, distributed=DistributedOptions(r, 3)), pixels, 4),
            [],
        )
        for r in range(3)
    ]
    assert sorted(sum(shares, [])) == list(range(45))


def test_workers_mode_defaults(pack):
    ds, _, _ = pack
    dl = make_loader(ds, 8, options=WorkerOptions()).dataloader
    assert 1 <= dl.num_workers <= 2  # at most two, fewer on fewer cores
    assert dl.prefetch_factor == DEFAULT_PREFETCH_FACTOR
    assert dl.persistent_workers is True
    assert dl.pin_memory is torch.cuda.is_available()
    assert make_loader(ds, 8, num_workers=0).dataloader.num_workers == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")
def test_pin_memory_without_cuda_is_turned_off_with_one_warning(pack, monkeypatch):
    ds, _, _ = pack
    monkeypatch.setattr(loader_mod, "_warned", set())
    with pytest.warns(RuntimeWarning, match="pin_memory=True ignored"):
        a = make_loader(ds, 8, num_workers=0, pin_memory=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = make_loader(ds, 8, pin_memory=True)  # in-process: no second warning, no error
    assert a.dataloader.pin_memory is False and b.mode == "inprocess"
    assert len(list(b)) == 6


def test_the_mode_follows_what_is_asked_for(pack):
    ds, _, _ = pack
    assert make_loader(ds, 8).mode == "inprocess"
    assert make_loader(ds, 8, options=InProcessOptions(timeout=5)).mode == "inprocess"
    assert make_loader(ds, 8, num_workers=0).mode == "workers"
    assert make_loader(ds, 8, options=WorkerOptions(prefetch_factor=2)).mode == "workers"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"options": {"prefetch": 2}}, "options should be InProcessOptions or WorkerOptions"),
        ({"options": InProcessOptions(), "num_workers": 2}, "pass WorkerOptions, or drop"),
        (
            {"num_workers": 0, "options": WorkerOptions(persistent=True)},
            r"persistent=\.\.\.\) needs num_workers > 0",
        ),
        (
            {"num_workers": 0, "options": WorkerOptions(prefetch_factor=2)},
            r"prefetch_factor=\.\.\.\) needs",
        ),
        (
            lambda: {"options": WorkerOptions(dataloader_kwargs={"sampler": None})},
            "sampler is set by make_loader's order=",
        ),
        (
            lambda: {"options": WorkerOptions(dataloader_kwargs={"timeout": 3})},
            r"WorkerOptions\(timeout=",
        ),
        (
            {"options": WorkerOptions(dataloader_kwargs={"collate_fn": id})},
            "collate_fn applies to per-sample",
        ),
        (
            lambda: {"options": WorkerOptions(dataloader_kwargs={"prefetch": 3})},
            "prefetch is not an argument of this torch's DataLoader",
        ),
        (
            lambda: {"options": InProcessOptions(timeout=0)},
            r"timeout should be seconds > 0, or None",
        ),
        (
            lambda: {"options": WorkerOptions(timeout=-1)},
            r"timeout should be seconds > 0, or 0 \(no timeout\), found -1",
        ),
        ({"distributed": True}, "needs torch.distributed initialised"),
        ({"distributed": "yes"}, "distributed should be None, True, False or DistributedOptions"),
        ({"distributed": DistributedOptions(1, 2)}, "needs seed=..."),
        ({"order": "shuffled"}, "order should be one of"),
        (lambda: {"order": OrderOptions("block", block=0)}, "OrderOptions block should be"),
        (lambda: {"order": OrderOptions(repeat=[-1])}, "repeat should be a list of factors"),
        (lambda: {"order": OrderOptions(repeat=[True])}, "repeat should be a list of factors"),
        (lambda: {"order": OrderOptions(repeat=[1, 1])}, "repeat has 2 factors"),
        (lambda: {"distributed": DistributedOptions(2, 2)}, r"rank should be in \[0, 2\)"),
        ({"seed": -1}, "seed should be an integer >= 0"),
        ({"seed": 1.5}, "seed should be an integer >= 0"),
        (lambda: {"order": OrderOptions("uniform", block=4)}, "applies to order='block' only"),
        ({"num_workers": -1}, "num_workers should be an integer >= 0"),
        ({"device": "warp9"}, "is not a torch device"),
        ({"transform": 3}, "transform should be callable"),
        (
            {"seed": 1, "pad": False, "drop_last": True, "distributed": DistributedOptions(0, 2)},
            "pad=False visits every record exactly once; drop_last=True drops",
        ),
    ],
)
def test_bad_arguments_are_refused(pack, kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):  # options objects refuse when made
        make_loader(pack[0], 8, **(kwargs() if callable(kwargs) else kwargs))


@pytest.mark.parametrize("batch_size", [0, -3, 2.0, True])
def test_a_batch_size_that_is_no_count_is_refused(pack, batch_size):
    with pytest.raises(InvalidArgumentError, match="batch_size should be an integer >= 1"):
        make_loader(pack[0], batch_size)


def test_pack_loader_is_what_make_loader_returns(pack):
    loader = make_loader(pack[0], 8, order=OrderOptions("block", block=4, window=2))
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


def test_hints_are_sent_until_the_pack_is_known_warm(make_pack):
    path, _, _ = make_pack(count=12)
    for prefault in (True, False):
        ds = PackedImageDataset(path, prefault=prefault)
        assert ds._in_page_cache is False  # nothing is known before the first read
        ds[0]  # maps it: with prefault, the background warm starts
        if prefault:
            for thread in threading.enumerate():  # the warm's, to its end
                if thread.name == "imgpack-warm":
                    thread.join(10)
            assert ds._in_page_cache
        calls = []
        ds._run.will_need = calls.append  # instance attribute: the loader thread calls this
        list(make_loader(ds, 4))
        assert bool(calls) is not prefault
        assert list(make_loader(ds, 4, options=InProcessOptions(hints=True))) and calls
        calls.clear()
        list(make_loader(ds, 4, options=InProcessOptions(hints=False)))
        assert not calls


def test_default_gather_threads_follow_the_usable_cores(pack, monkeypatch):
    """A copy read in the loop's thread takes that thread alone; one read ahead in the
    background takes two threads where there are two cores."""
    ds, _, _ = pack
    ahead = InProcessOptions(prefetch=2)
    monkeypatch.setattr(loader_mod, "usable_cores", lambda: 1)
    assert make_loader(ds, 4, options=ahead).read.threads == 1
    monkeypatch.setattr(loader_mod, "usable_cores", lambda: 16)
    assert make_loader(ds, 4, options=ahead).read.threads == 2
    assert make_loader(ds, 4).read.threads == 1  # read in the loop's thread
    three = InProcessOptions(gather_threads=3)
    assert make_loader(ds, 4, options=three).read.threads == 3


# --- resume and order semantics --------------------------------------------------------


@pytest.mark.parametrize("workers", [None, 1])
def test_a_state_after_a_full_epoch_resumes_at_the_next_one(pack, workers):
    ds, pixels, _ = pack
    first = make_loader(ds, 8, seed=6, num_workers=workers)
    sequence(first, pixels, len(first))  # exactly one epoch
    state = first.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 0)
    second = make_loader(ds, 8, seed=6, num_workers=workers)
    second.load_state_dict(state)
    second.set_epoch(1)  # the loop's set_epoch for the epoch it resumes: no replay
    expected = EpochOrder(45, batch_size=8, seed=6).indices(1).tolist()
    assert sum(sequence(second, pixels, len(second)), []) == expected


def test_shuffle_without_seed_follows_torch_manual_seed(pack):
    ds, pixels, _ = pack

    def epoch_of(**kw):
        return sum(sequence(make_loader(ds, 9, **kw), pixels, 5), [])

    torch.manual_seed(21)
    a = epoch_of()
    torch.manual_seed(21)
    assert epoch_of() == a
    torch.manual_seed(22)
    assert epoch_of() != a
    torch.manual_seed(21)
    pinned = epoch_of(seed=4)
    torch.manual_seed(99)
    assert epoch_of(seed=4) == pinned == EpochOrder(45, batch_size=9, seed=4).indices(0).tolist()


def test_evaluation_shares_visit_every_record_once_across_ranks(pack):
    ds, pixels, _ = pack
    shares = []
    for r in range(4):  # 45 records: shares of 11 and 12, no padding, nothing dropped
        loader = make_loader(ds, 5, shuffle=False, pad=False, distributed=DistributedOptions(r, 4))
        shares.append(sum(sequence(loader, pixels, len(loader)), []))
    assert sorted(len(s) for s in shares) == [11, 11, 11, 12]
    assert sorted(sum(shares, [])) == list(range(45))
    padded = [make_loader(ds, 5, seed=0, distributed=DistributedOptions(r, 4)) for r in range(4)]
    assert sum(len(loader.order.indices()) for loader in padded) == 48  # the default pads


# --- batches belong to the user ----------------------------------------------------------


@pytest.mark.parametrize("workers", [None, 0, 2])
def test_every_batch_kept_stays_what_it_was(pack, workers):
    ds, pixels, _ = pack
    loader = make_loader(ds, 4, seed=8, num_workers=workers)
    kept = list(loader)  # the whole epoch, held at once
    expected = EpochOrder(45, batch_size=4, seed=8).indices(0)
    assert len(kept) == len(loader) == 12
    for k, (x, _) in enumerate(kept):
        np.testing.assert_array_equal(
            x.permute(0, 2, 3, 1).numpy(), pixels[expected[k * 4 : (k + 1) * 4]]
        )
    for x, _ in loader:  # break early, then a new pass: the kept ones still hold
        first = x
        break
    list(loader)
    for k, (x, _) in enumerate(kept):
        np.testing.assert_array_equal(
            x.permute(0, 2, 3, 1).numpy(), pixels[expected[k * 4 : (k + 1) * 4]]
        )
    np.testing.assert_array_equal(
        first.permute(0, 2, 3, 1).numpy(),
        pixels[EpochOrder(45, batch_size=4, seed=8).indices(1)[:4]],
    )


# --- per-sample fallback, batched transform and device -------------------------------------


def test_a_dataset_transform_falls_back_to_samples_and_says_so_once(make_pack, monkeypatch):
    path, pixels, labels = make_pack(count=20)
    ds = PackedImageDataset(
        path, transform=lambda im: im.flip(-1), target_transform=lambda t: t + 10
    )
    monkeypatch.setattr(loader_mod, "_warned", set())
    expected = EpochOrder(20, batch_size=6, seed=3).indices(0)
    for kw in ({}, {"options": InProcessOptions()}, {"num_workers": 1}):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = make_loader(ds, 6, seed=3, **kw)
        assert len([w for w in caught if "per-sample transform" in str(w.message)]) == (kw == {})
        got = list(loader)
        for k, (x, y) in enumerate(got):
            idx = expected[k * 6 : (k + 1) * 6]
            np.testing.assert_array_equal(x.permute(0, 2, 3, 1).numpy(), pixels[idx][:, :, ::-1])
            assert y.tolist() == (labels[idx] + 10).tolist()
    assert make_loader(ds, 6).mode == "workers"  # per-sample work is spread over processes


class Recorder:
    """A batched transform that remembers the records it was given."""

    def __init__(self):
        self.calls = []

    def __call__(self, images, records):
        self.calls.append(records.tolist())
        return images.float() + 1


@pytest.mark.parametrize("workers", [None, 1])
def test_transform_and_device_get_whole_batches_and_their_records(pack, workers):
    ds, pixels, labels = pack
    t = Recorder()
    loader = make_loader(ds, 8, seed=2, transform=t, device="cpu", num_workers=workers)
    expected = EpochOrder(45, batch_size=8, seed=2).indices(0)
    got = list(loader)
    assert t.calls == [expected[k * 8 : (k + 1) * 8].tolist() for k in range(len(loader))]
    for k, (x, y) in enumerate(got):
        idx = expected[k * 8 : (k + 1) * 8]
        assert x.dtype == torch.float32 and x.device.type == "cpu"
        np.testing.assert_array_equal(x.permute(0, 2, 3, 1).numpy(), pixels[idx] + 1.0)
        assert y.tolist() == labels[idx].tolist()


def test_a_one_argument_transform_is_called_without_records(pack):
    ds, pixels, _ = pack
    loader = make_loader(ds, 8, seed=2, transform=lambda images: images.double(), device="cpu")
    x, _ = next(iter(loader))
    assert x.dtype == torch.float64
    assert takes_records(lambda images, records=None: images)


def test_a_transform_with_optional_parameters_is_a_one_argument_transform(pack):
    ds, pixels, _ = pack
    scale = 0.5
    halve = lambda images, s=scale: images.float() * s  # noqa: E731 - the usual capture idiom
    loader = make_loader(ds, 8, shuffle=False, transform=halve, device="cpu")
    for k, (x, _) in enumerate(loader):
        expected = pixels[k * 8 : k * 8 + 8] * 0.5
        np.testing.assert_array_equal(x.permute(0, 2, 3, 1).numpy(), expected)
    assert not takes_records(lambda images, flip=False: images)
    assert takes_records(lambda images, idx: images)


@pytest.mark.parametrize("kw", [{}, {"num_workers": 0}, {"options": InProcessOptions()}])
def test_any_map_style_dataset_without_getitems_is_served_sample_by_sample(make_pack, kw):
    a, pa, la = make_pack(count=7, name="a")
    b, pb, lb = make_pack(count=5, name="b")
    both = torch.utils.data.ConcatDataset([PackedImageDataset(a), PackedImageDataset(b)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one "sample by sample" warning
        loader = make_loader(both, 4, shuffle=False, **kw)
    images = torch.cat([x for x, _ in loader])
    np.testing.assert_array_equal(images.permute(0, 2, 3, 1).numpy(), np.concatenate([pa, pb]))
    plain = torch.utils.data.TensorDataset(torch.arange(10.0), torch.arange(10) * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = [y.tolist() for _, y in make_loader(plain, 4, shuffle=False, **kw)]
    assert got == [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]


def test_a_second_pass_at_once_stops_the_first_with_a_clear_error(pack):
    ds, pixels, _ = pack
    loader = make_loader(ds, 8, shuffle=False)
    first, second = iter(loader), iter(loader)
    next(first)
    images, _ = next(second)  # the second pass is a whole new epoch, as with a DataLoader
    assert ids(images, pixels) == list(range(8)) and loader.epoch == 1
    with pytest.raises(LoaderError, match="a new pass over it began"):
        next(first)


def test_gather_threads_are_refused_where_batches_are_built_sample_by_sample(make_pack):
    path, _, _ = make_pack(count=12)
    ds = PackedImageDataset(path, transform=lambda image: image.float())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one "sample by sample" warning
        with pytest.raises(InvalidArgumentError, match="drop gather_threads"):
            make_loader(ds, 4, options=InProcessOptions(gather_threads=2))
        x, _ = next(iter(make_loader(ds, 4, options=InProcessOptions(prefetch=3))))
    assert x.dtype == torch.float32


class WithTargets(PackedImageDataset):
    """A dataset with per-record target vectors, as packs can carry."""

    @property
    def target_vectors(self):
        return np.arange(len(self) * 2, dtype=np.float32).reshape(-1, 2)


@pytest.mark.parametrize("workers", [None, 1])
def test_target_vectors_travel_as_a_third_element(make_pack, workers):
    path, _, labels = make_pack(count=10)
    ds = WithTargets(path)
    image, label, vec = ds[3]
    assert vec.tolist() == [6.0, 7.0] and vec.dtype == torch.float32
    loader = make_loader(ds, 4, shuffle=False, num_workers=workers)
    for k, (_, y, v) in enumerate(loader):
        idx = np.arange(k * 4, min(10, k * 4 + 4))
        assert v.shape == (len(idx), 2) and v[:, 0].tolist() == (2.0 * idx).tolist()
        assert y.tolist() == labels[idx].tolist()


def test_workers_mode_under_spawn(pack):
    ds, pixels, _ = pack
    options = WorkerOptions(multiprocessing_context="spawn", persistent=False)
    loader = make_loader(ds, 8, seed=3, num_workers=1, options=options)
    expected = EpochOrder(45, batch_size=8, seed=3).indices(0)
    assert sum(sequence(loader, pixels, len(loader)), []) == expected.tolist()


def test_to_device_moves_every_element_of_a_batch():
    images = torch.zeros(2, 4, 4, 3, dtype=torch.uint8).permute(0, 3, 1, 2)  # channels_last
    batch = (images, torch.arange(2), torch.ones(2, 5))
    images, *rest = batch
    request = Batch(np.arange(2), (4, 4), images=images, rest=tuple(rest))
    moved = Move(torch.device("meta"))(request).output()  # a device a CPU-only build has
    assert [(t.device.type, t.dtype, t.shape) for t in moved] == [
        ("meta", t.dtype, t.shape) for t in batch
    ]
    assert moved[0].is_contiguous(memory_format=torch.channels_last)


def test_a_path_or_a_missing_cuda_device_is_refused_in_one_line(pack):
    ds, _, _ = pack
    with pytest.raises(InvalidArgumentError, match=r"takes a dataset, not the path .*PackedImage"):
        make_loader(ds.path, 4)
    if not torch.cuda.is_available():
        with pytest.raises(InvalidArgumentError, match="has no CUDA device"):
            make_loader(ds, 4, device="cuda")


@pytest.mark.parametrize("small", [True, False])
def test_closing_the_dataset_while_its_loader_runs_maps_it_again(make_pack, small):
    path, pixels, _ = make_pack(count=64)
    ds = PackedImageDataset(path, prefault=True)
    got = []
    opts = InProcessOptions(prefetch=0 if small else 2)  # the loop's thread, or a background one
    for images, _labels in make_loader(ds, 8, shuffle=False, options=opts):
        ds.close()  # the next read maps the pack again
        got.append(images.permute(0, 2, 3, 1).numpy().copy())
    np.testing.assert_array_equal(np.concatenate(got), pixels)


# --- what a user reported, or could have --------------------------------------------------


def test_a_device_transform_built_on_another_dataset_is_refused(make_pack):
    a, _, _ = make_pack(count=12, name="train")
    b, _, _ = make_pack(count=10, name="val")  # records of the same size, other records
    train, val = PackedImageDataset(a), PackedImageDataset(b)
    with pytest.raises(
        InvalidArgumentError, match=r"DeviceTransform.eval was built on .*\(ds, \.\.\.\)"
    ):
        make_loader(val, 4, device="cpu", transform=DeviceTransform.eval(train, 8))
    again = PackedImageDataset(a)  # the same pack opened again: the same records
    assert len(list(make_loader(again, 4, device="cpu", transform=DeviceTransform.eval(train, 8))))


def test_an_older_pass_of_workers_raises_instead_of_taking_the_new_ones_batches(pack):
    ds, _, _ = pack
    loader = make_loader(ds, 5, seed=4, num_workers=2)
    first = iter(loader)
    next(first)
    second = iter(loader)
    next(second)
    with pytest.raises(LoaderError, match="one pass at a time"):
        next(first)
    assert 1 + sum(1 for _ in second) == len(loader)  # the new pass is whole
    loader.close()


def test_a_closed_resident_loaders_old_iterator_copies_nothing_again(pack):
    ds, _, _ = pack
    loader = make_loader(ds, 4, device="cpu", resident=True, seed=0)
    it = iter(loader)
    next(it)
    loader.close()
    with pytest.raises(LoaderError):
        next(it)
    assert loader.resident_bytes == 0


def test_a_damaged_record_in_a_worker_is_one_line_and_ends_the_workers(tmp_path):
    from packs_v3 import write_v3
    from test_jpeg_damage import BAD, SIZES

    from imgpack.errors import FormatError
    from imgpack.format.index import read_index

    path, _, _ = write_v3(tmp_path / "j.bin", codec="jpeg", sizes=SIZES)
    ix = read_index(path)
    with open(path, "r+b") as f:  # the record no longer starts with a JPEG SOI marker
        f.seek(ix.data_offset + int(ix.record_offsets[BAD]))
        f.write(b"\x00\x00")
    ds = PackedImageDataset(path)
    loader = make_loader(ds, 4, shuffle=False, transform=lambda x, r: x, num_workers=2)
    first = weakref.ref(loader.dataloader)
    with _no_collection() as new_children:
        with pytest.raises(FormatError) as info:
            list(loader)
        # the workers are gone while the error is still held, not at some later collection
        assert new_children() == []
    assert "\n" not in str(info.value) and f"j.bin record {BAD}: damaged" in str(info.value)
    assert loader.dataloader is not first()  # the workers' DataLoader was dropped with them


class _no_collection:
    """Automatic garbage collection paused; ``new_children()``: the worker processes started
    inside the block that are still alive."""

    def __enter__(self):
        self.before = set(multiprocessing.active_children())
        gc.disable()
        return lambda: [p for p in multiprocessing.active_children() if p not in self.before]

    def __exit__(self, *exc):
        gc.enable()


def test_a_plain_datasets_workers_end_with_their_pass_not_at_a_later_collection():
    """A stranger's map-style dataset, batched sample by sample on two worker processes: once
    the loop is over and the loader dropped, no worker is left for the garbage collector,
    whose shutdown of a DataLoader's workers stalls the program for seconds."""
    plain = torch.utils.data.TensorDataset(torch.arange(10.0), torch.arange(10) * 2)
    with _no_collection() as new_children:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the one "sample by sample" warning
            got = [y.tolist() for _, y in make_loader(plain, 4, shuffle=False, num_workers=2)]
        assert got == [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]
        assert new_children() == []


def test_records_of_many_sizes_with_only_a_target_transform_are_refused_at_once(tmp_path):
    from packs_v3 import write_v3

    path, _, _ = write_v3(tmp_path / "fit.bin")
    ds = PackedImageDataset(path, target_transform=lambda y: y + 1)
    with pytest.raises(InvalidArgumentError, match="cannot be stacked by the default collate"):
        make_loader(ds, 4, transform=DeviceTransform.train(ds, 8))


def test_building_an_eval_loader_leaves_torchs_random_state_alone(pack):
    ds, _, _ = pack
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    make_loader(ds, 4, shuffle=False, device="cpu", transform=DeviceTransform.eval(ds, 8))
    assert torch.equal(torch.rand(3), want)


@pytest.mark.parametrize(
    "args, kw, match",
    [((None, 2), {}, "takes a map-style dataset"),
     ((), {"shuffle": "no"}, "shuffle should be True or False"),
     ((), {"device": "meta"}, "delivers to 'cpu' or 'cuda'")],
)  # fmt: skip
def test_more_bad_calls_are_refused_in_one_line(pack, args, kw, match):
    ds, _, _ = pack
    with pytest.raises(InvalidArgumentError, match=match):
        make_loader(*(args or (ds, 2)), **kw)


def test_an_empty_dataset_is_refused_in_one_line():
    with pytest.raises(InvalidArgumentError, match="holds no records"):
        make_loader([], 2)


class _Broken(torch.utils.data.Dataset):
    """A stranger's dataset whose sample 5 fails."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        if i == 5:
            raise KeyError(f"no sample {i}")
        return torch.zeros(2), i


def test_a_strangers_error_in_a_worker_keeps_its_type_and_story_and_ends_the_workers():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one "sample by sample" warning
        loader = make_loader(_Broken(), 2, shuffle=False, num_workers=2)
    with _no_collection() as new_children:
        with pytest.raises(KeyError, match="no sample 5") as info:
            list(loader)
        assert "DataLoader worker process" in str(info.value)  # torch's story of the worker
        assert new_children() == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        here = make_loader(_Broken(), 2, shuffle=False, num_workers=0)
    with pytest.raises(KeyError, match="no sample 5") as info:
        list(here)
    # raised in this process: the traceback still reaches the dataset's own frame
    assert any(entry.name == "__getitem__" for entry in info.traceback)


class _Unreadable(Exception):
    """An error class that writes its own text (so torch's "Caught ... in DataLoader worker
    process" never reaches it)."""

    def __init__(self, *args) -> None:
        super().__init__("sample unreadable")


class _BrokenAs(_Broken):
    def __init__(self, error: type[BaseException]) -> None:
        self.error = error

    def __getitem__(self, i: int):
        if i == 5:
            raise self.error()
        return torch.zeros(2), i


@pytest.mark.parametrize("error", [_Unreadable, StopIteration])
def test_a_worker_error_of_any_text_ends_the_workers_at_once(error):
    """Errors whose text is their own, and a worker's StopIteration (which ends the pass
    early, as in torch's DataLoader): the workers still end with them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = make_loader(_BrokenAs(error), 2, shuffle=False, num_workers=2)
    with _no_collection() as new_children:
        if error is StopIteration:
            assert sum(1 for _ in loader) == 2
        else:
            with pytest.raises(_Unreadable, match="sample unreadable"):
                list(loader)
        assert new_children() == []
