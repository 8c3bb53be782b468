"""DeviceTransform.train/eval through make_loader: the right records' geometry, on a shuffled
multi-pack dataset, in-process and in worker processes, with the size changed between epochs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import write_image

from imgpack.packer.pack import pack_folder
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.transform import DeviceTransform


@pytest.fixture(scope="module")
def two_packs(tmp_path_factory):
    """Two letterboxed packs of sources of many sizes: every record has its own geometry
    (packed once for the module: no test writes them)."""
    tmp_path = tmp_path_factory.mktemp("two-packs")
    rng = np.random.default_rng(0)
    paths = []
    for shard in range(2):
        src = tmp_path / f"src{shard}"
        for i in range(7):
            w, h = (int(v) for v in rng.integers(12, 90, size=2))
            write_image(src / "ab"[i % 2] / f"{i}.png", w, h, seed=10 * shard + i)
        out = tmp_path / f"part{shard}.bin"
        pack_folder(src, out, size=(24, 24), resize="pad", progress=False)
        paths.append(str(out))
    return paths


class Replay:
    """Wraps T; keeps each call's generator state and records so it can be redone by hand."""

    def __init__(self, t):
        self.t, self.calls = t, []

    def __call__(self, images, records):
        state = self.t.generator.get_state() if self.t.generator is not None else None
        self.calls.append((state, torch.as_tensor(records).clone(), self.t.size))
        return self.t(images, records)


@pytest.mark.parametrize("workers", [None, 1])
def test_loader_applies_the_transform_to_the_right_records(two_packs, workers):
    ds = PackedImageDataset(two_packs)
    parts = [PackedImageDataset(p) for p in two_packs]
    for name in ("source_sizes", "source_boxes", "content_boxes"):
        want = np.concatenate([getattr(p, name) for p in parts])
        np.testing.assert_array_equal(getattr(ds, name), want)
    t = Replay(DeviceTransform.train(ds, size=12, generator=torch.Generator().manual_seed(1)))
    loader = make_loader(ds, 4, seed=3, num_workers=workers, transform=t, device="cpu")
    got = []
    for size in (12, 20):
        t.t.size = size  # progressive resizing between epochs
        got += list(loader)
    assert len(got) == len(t.calls) == 2 * len(loader)
    assert sorted(torch.cat([r for _, r, _ in t.calls[: len(loader)]]).tolist()) == list(range(14))
    for (x, y), (state, records, size) in zip(got, t.calls):
        assert x.shape[-1] == size
        by_hand = DeviceTransform.train(ds, size=size, generator=torch.Generator())
        by_hand.generator.set_state(state)
        images, labels = ds.gather(records)
        assert torch.equal(by_hand(images, records), x) and torch.equal(labels, y)
    # the records are the shuffled ones, not 0..B-1: their letterboxes differ
    assert t.calls[0][1].tolist() != list(range(4))


@pytest.mark.parametrize("where", ["the cpu's crops", "a device's matmuls"])
def test_eval_through_the_loader_equals_eval_by_hand(two_packs, where, request):
    """On a CPU the loader's threads crop each record as ``T(images, records)`` does on a
    CPU batch: the same bytes. On a device's path (the batched matmuls, here on the CPU),
    ``T.apply`` on the batch gives the same numbers."""
    device = where == "a device's matmuls"
    if device:
        request.getfixturevalue("canvas_on_cpu")
    ds = PackedImageDataset(two_packs)
    e = DeviceTransform.eval(ds, size=16)
    loader = make_loader(ds, 5, shuffle=False, transform=e, device="cpu")
    x = torch.cat([images for images, _ in loader])
    images, _ = ds.gather(np.arange(len(ds)))
    by_hand = DeviceTransform.eval(ds, size=16)
    if device:
        want = by_hand.apply(images, by_hand.draw(np.arange(len(ds)), images.shape[2:]))
        torch.testing.assert_close(x, want, rtol=0, atol=1e-5)  # batches of 5 vs one of 14
    else:
        assert torch.equal(x, by_hand(images, np.arange(len(ds))))


def test_float_batches_kept_in_a_list_stay_intact(two_packs):
    """On a CPU the float batches come from a pool: a batch the loop still holds is never
    written again, whether the loop keeps every batch or lets each go as the next comes."""
    ds = PackedImageDataset(two_packs)

    def loader():
        t = DeviceTransform.train(ds, size=16, generator=torch.Generator().manual_seed(2))
        return make_loader(ds, 3, seed=1, transform=t, device="cpu")

    copies = [x.clone() for x, _ in loader()]
    ld = loader()
    held = [x for x, _ in ld]  # the batches themselves, every one kept
    assert len(held) == 5 and len({x.data_ptr() for x in held}) == 5
    for a, b in zip(copies, held):
        assert torch.equal(a, b)
    for _epoch in range(2):  # each batch let go as the next comes: still the same batches
        assert all(torch.equal(a, b) for a, (b, _) in zip(copies, loader()))


def test_the_dtype_and_size_may_change_between_epochs(two_packs):
    """What a user of progressive resizing or mixed precision does: change the transform's
    ``size`` and ``dtype`` between epochs of the same loader; each epoch's batches are what
    it asked for, the same as by hand, and the float pool follows them."""
    ds = PackedImageDataset(two_packs)
    e = DeviceTransform.eval(ds, size=16)
    loader = make_loader(ds, 5, shuffle=False, transform=e, device="cpu")
    images, _ = ds.gather(np.arange(len(ds)))
    for size, dtype in [(16, torch.float32), (12, torch.bfloat16), (20, torch.float64),
                        (12, torch.float32)]:  # fmt: skip
        e.size, e.dtype = size, dtype
        x = torch.cat([b for b, _ in loader])
        assert x.dtype == dtype and x.shape == (len(ds), 3, size, size)
        want = DeviceTransform.eval(ds, size=size, dtype=dtype)(images, np.arange(len(ds)))
        level = 1 / (255 * min(ds.std))
        atol = 2.01 * level + (0.05 if dtype == torch.bfloat16 else 0)
        torch.testing.assert_close(x.float(), want.float(), rtol=0.01, atol=atol)
