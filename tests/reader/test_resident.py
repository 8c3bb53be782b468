"""Resident packs (make_loader(..., resident=True)) on device "cpu": the same tensor code
as on a GPU. The same batches as the streamed loader for every codec, size kind, order and
transform, across a resume, on two ranks (gloo: in test_distributed.py's ranks) reading
shard-local; the refusals; batches that stay the user's; the memory given back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from packs_v3 import write_v3

from imgpack.errors import InvalidArgumentError
from imgpack.reader import resident
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.options import DistributedOptions, InProcessOptions, OrderOptions
from imgpack.reader.order import EpochOrder
from imgpack.reader.resident import ResidentRecords
from imgpack.reader.transform import DeviceTransform

# records of many sizes within a 20 x 16 bound (packs_v3.SIZES), repeated to fill batches
MANY = [(20, 16), (13, 16), (20, 7), (7, 5), (1, 1), (20, 16), (9, 11), (20, 3)] * 4


def batches(ds, transform=None, **kw):
    torch.manual_seed(5)  # the crops' seed, drawn when the loader is built
    t = None if transform is None else transform(ds)
    with make_loader(ds, 6, seed=3, device="cpu", transform=t, **kw) as loader:
        return [tuple(x.clone() for x in b) for b in loader]


def same(a, b) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y))


def keep_canvas(images, records):
    return images  # a plain transform: the padded canvas, as it comes


@pytest.mark.parametrize("codec", ["raw", "yuv420"])
@pytest.mark.parametrize("sizes", ["one", "many"])
@pytest.mark.parametrize(
    "transform",
    [None, lambda ds: DeviceTransform.eval(ds, 12, dtype=torch.float64),
     lambda ds: DeviceTransform.train(ds, 10, dtype=torch.float64)],
    ids=["none", "eval", "train"],
)  # fmt: skip
def test_a_resident_loader_yields_the_streamed_loaders_batches(tmp_path, codec, sizes, transform):
    shapes = [(20, 16)] * 30 if sizes == "one" else MANY
    path, _, _ = write_v3(tmp_path / "p.bin", codec, sizes=shapes)
    ds = PackedImageDataset(path)
    if transform is None and sizes == "many":
        transform = lambda ds: keep_canvas  # noqa: E731 - records of many sizes need one
    same(batches(ds, transform, resident=True), batches(ds, transform))


@pytest.mark.parametrize(
    "kw",
    [{"shuffle": False}, {"drop_last": True}, {"order": "block"}, {"order": "sequential"},
     {"order": OrderOptions("block", block=3, window=2)}],
)  # fmt: skip
def test_every_order_gives_the_same_batches_resident_or_not(make_pack, kw):
    path, _, _ = make_pack(count=40, height=8, width=6)
    ds = PackedImageDataset(path)
    same(batches(ds, resident=True, **kw), batches(ds, **kw))


def test_several_packs_are_one_resident_dataset(tmp_path):
    paths = [write_v3(tmp_path / f"s{k}.bin", "yuv420", sizes=MANY[k::2], seed=k)[0]
             for k in range(2)]  # fmt: skip
    ds = PackedImageDataset(paths)
    t = lambda ds: DeviceTransform.eval(ds, 12, dtype=torch.float64)  # noqa: E731
    same(batches(ds, t, resident=True), batches(ds, t))


def test_targets_and_labels_are_resident_too(tmp_path):
    path, _, labels = write_v3(tmp_path / "p.bin", "raw", sizes=[(20, 16)] * 12)
    ds = PackedImageDataset(path)
    got = batches(ds, resident=True, shuffle=False)
    assert torch.cat([b[1] for b in got]).tolist() == labels.tolist()


def test_a_resumed_resident_loader_continues_with_the_same_batches_and_crops(tmp_path):
    path, _, _ = write_v3(tmp_path / "p.bin", "yuv420", sizes=MANY)
    ds = PackedImageDataset(path)

    def loader():
        t = DeviceTransform.train(ds, 10, dtype=torch.float64, generator=torch.Generator())
        return make_loader(ds, 6, seed=3, device="cpu", transform=t, resident=True)

    whole = loader()
    want = [x.clone() for x, _ in whole] + [x.clone() for x, _ in whole]  # two epochs
    first = loader()
    it = iter(first)
    seen = [next(it)[0].clone() for _ in range(3)]
    state = first.state_dict()
    first.close()
    torch.manual_seed(1234)  # another process, another global seed: the state decides
    again = loader()
    again.load_state_dict(state)
    rest = [x.clone() for x, _ in again] + [x.clone() for x, _ in again]
    got = seen + rest
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_batches_held_by_the_user_stay_unchanged(make_pack):
    path, pixels, _ = make_pack(count=30, height=8, width=6)
    ds = PackedImageDataset(path)
    loader = make_loader(ds, 4, seed=1, device="cpu", resident=True)
    kept = [b for _ in range(3) for b in loader]  # three epochs, every batch kept
    order = [i for e in range(3) for i in loader.order.indices(e)]
    images = torch.cat([x for x, _ in kept]).permute(0, 2, 3, 1).numpy()
    np.testing.assert_array_equal(images, pixels[order])


def test_resident_bytes_counts_what_is_held_and_close_gives_it_back(make_pack):
    path, _, _ = make_pack(count=30, height=8, width=6)
    ds = PackedImageDataset(path)
    loader = make_loader(ds, 4, device="cpu", resident=True)
    assert loader.resident_bytes == 0  # nothing is copied before the first pass
    next(iter(loader))
    assert loader.resident_bytes >= 30 * 8 * 6 * 3
    loader.close()
    assert loader.resident_bytes == 0
    assert len(list(loader)) == len(loader)  # the next pass copies it again
    assert "ResidentRecords" in repr(loader) and "Move" not in repr(loader)


def test_what_does_not_fit_is_refused_in_one_line_before_any_copy(make_pack, monkeypatch):
    path, _, _ = make_pack(count=30, height=8, width=6)
    ds = PackedImageDataset(path)
    monkeypatch.setattr(resident, "mem_available", lambda: resident.MARGIN_BYTES + 100)
    with pytest.raises(InvalidArgumentError) as info:
        make_loader(ds, 4, device="cpu", resident=True)
    message = str(info.value)
    assert (
        "\n" not in message and "B on cpu for 30 records" in message and "is free there" in message
    )
    assert "--codec yuv420" in message and "shard_local" in message and "resident=False" in message


def test_memory_gone_by_the_first_pass_is_refused_then_too(make_pack, monkeypatch):
    path, _, _ = make_pack(count=30, height=8, width=6)
    ds = PackedImageDataset(path)
    loader = make_loader(ds, 4, device="cpu", resident=True)
    monkeypatch.setattr(resident, "mem_available", lambda: 1000)
    with pytest.raises(InvalidArgumentError, match="is free there"):
        next(iter(loader))
    assert loader.resident_bytes == 0


def test_a_jpeg_pack_is_refused(tmp_path):
    from conftest import photo_like
    from test_jpeg_scaled import write_jpeg_pack

    path = write_jpeg_pack(tmp_path / "j.bin", [photo_like(16, 12)] * 4, (16, 16))
    with PackedImageDataset(path) as ds:
        with pytest.raises(InvalidArgumentError, match="decode it to a raw or yuv420 pack"):
            make_loader(ds, 2, device="cpu", resident=True)


@pytest.mark.parametrize(
    "kw, match",
    [({}, r"pass make_loader\(\.\.\., device="),
     ({"device": "cpu", "num_workers": 2}, "no worker process"),
     ({"device": "cpu", "options": InProcessOptions(prefetch=2)}, "drop InProcessOptions"),
     ({"device": "cpu", "resident": "yes"}, "resident should be True or False"),
     ({"device": "cpu", "resident": 1}, "resident should be True or False")],
)  # fmt: skip
def test_what_cannot_be_resident_is_refused_in_one_line(make_pack, kw, match):
    path, _, _ = make_pack(count=8)
    with pytest.raises(InvalidArgumentError, match=match):
        make_loader(PackedImageDataset(path), 2, **{"resident": True, **kw})


def test_a_dataset_with_a_per_sample_transform_is_refused(make_pack):
    path, _, _ = make_pack(count=8)
    ds = PackedImageDataset(path, transform=lambda x: x)
    with pytest.raises(InvalidArgumentError, match="served sample by sample"):
        make_loader(ds, 2, device="cpu", resident=True)


def test_a_shard_local_rank_holds_only_the_records_it_can_read(tmp_path):
    """Four equal shards on two ranks: each rank holds its own two shards, no more."""
    paths = [write_v3(tmp_path / f"s{k}.bin", "raw", sizes=[(20, 16)] * 6, seed=k)[0]
             for k in range(4)]  # fmt: skip
    ds = PackedImageDataset(paths)
    opts = DistributedOptions(rank=1, world_size=2, shard_local=True)
    loader = make_loader(ds, 3, seed=0, device="cpu", resident=True, distributed=opts)
    held = loader.read.held
    assert isinstance(loader.read, ResidentRecords)
    assert held.tolist() == list(range(12, 24))
    streamed = make_loader(ds, 3, seed=0, device="cpu", distributed=opts)
    same([tuple(b) for b in loader], [tuple(b) for b in streamed])
    whole = make_loader(ds, 3, seed=0, device="cpu", resident=True)
    next(iter(whole))
    assert 0 < loader.resident_bytes < whole.resident_bytes


@pytest.mark.parametrize("world", [2, 3])
def test_what_a_shard_local_rank_holds_covers_every_epoch_it_reads(world):
    """Shards of uneven sizes: some ranks take others' surplus, some the epoch's padding."""
    sizes = [5, 9, 1, 7, 3, 8]
    n = sum(sizes)
    for drop_last in (False, True):
        for rank in range(world):
            o = EpochOrder(n, batch_size=2, seed=1, rank=rank, world_size=world,
                           drop_last=drop_last, shard_sizes=sizes)  # fmt: skip
            held = set(o.reads().tolist())
            for epoch in range(30):
                assert set(o.indices(epoch).tolist()) <= held, (rank, epoch)


# Two ranks on gloo, each holding its own shards of resident packs: checked in the ranks of
# test_distributed.py (one torch import and one gloo group for both files' checks).
