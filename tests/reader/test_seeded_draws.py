"""Every random draw a ``DeviceTransform`` makes under ``make_loader`` follows the loader's
seed, rank, epoch and batch: the windows and flips of one built directly as much as the
crops of ``.train``. Tried as a training loop uses it: plain loops, a ``state_dict`` taken
mid-epoch, torch's generator used by the loop in between."""

from __future__ import annotations

import pytest
import torch

from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.transform import DeviceTransform

TRANSFORMS = {
    "flip": lambda ds: DeviceTransform.from_dataset(ds, flip=True),
    "window": lambda ds: DeviceTransform(ds.mean, ds.std, crop=(5, 4), flip=True),
    "train": lambda ds: DeviceTransform.train(ds, size=4),
}


def epochs(ds, make_t, n=2, seed=3, **kw):
    loader = make_loader(ds, 4, seed=seed, transform=make_t(ds), device="cpu", **kw)
    out = []
    for _ in range(n):
        for x, y in loader:
            out.append((x.clone(), y))
            torch.rand(10)  # the loop's own use of torch's generator
    return out


def same(a, b):
    return len(a) == len(b) and all(
        torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b)
    )


@pytest.mark.parametrize("kind", sorted(TRANSFORMS))
def test_the_seed_fixes_the_draws_in_every_mode(make_pack, kind):
    path, _, _ = make_pack(count=24, height=8, width=6)
    ds = PackedImageDataset(path)
    torch.manual_seed(0)
    first = epochs(ds, TRANSFORMS[kind])
    for kw in ({}, {"num_workers": 1}, {"resident": True}):
        torch.manual_seed(len(kw) + 1)
        assert same(epochs(ds, TRANSFORMS[kind], **kw), first)
    assert not same(epochs(ds, TRANSFORMS[kind], seed=4), first)


def test_the_flips_are_drawn_per_sample_and_show_the_records(make_pack):
    path, pixels, _ = make_pack(count=24, height=8, width=6)
    ds = PackedImageDataset(path)
    loader = make_loader(ds, 24, shuffle=False, seed=1, transform=lambda x: x, device="cpu")
    plain = next(iter(loader))[0]
    flipped = [
        x
        for x, _ in make_loader(
            ds, 24, shuffle=False, seed=1, transform=DeviceTransform(ds.mean, ds.std, flip=True)
        )
    ]
    t = DeviceTransform(ds.mean, ds.std)
    want, mirror = t(plain), t(plain.flip(-1))
    hits = [torch.equal(flipped[0][i], mirror[i]) for i in range(24)]
    for i, hit in enumerate(hits):
        assert hit or torch.equal(flipped[0][i], want[i])
    assert 0 < sum(hits) < 24


@pytest.mark.parametrize("kind", sorted(TRANSFORMS))
def test_a_run_resumed_mid_epoch_draws_what_it_would_have(make_pack, kind):
    path, _, _ = make_pack(count=24, height=8, width=6)
    ds = PackedImageDataset(path)
    whole = epochs(ds, TRANSFORMS[kind])  # 6 batches an epoch, two epochs
    loader = make_loader(ds, 4, seed=3, transform=TRANSFORMS[kind](ds), device="cpu")
    got = []
    for x, y in loader:
        got.append((x.clone(), y))
        if len(got) == 4:
            break
    state = loader.state_dict()
    torch.manual_seed(123)  # another process, its own torch state
    resumed = make_loader(ds, 4, seed=3, transform=TRANSFORMS[kind](ds), device="cpu")
    resumed.load_state_dict(state)
    for _ in range(2):
        got += [(x.clone(), y) for x, y in resumed]
    assert same(got, whole)


def test_a_numpy_generator_is_refused_naming_numpy(make_pack):
    """numpy's Generator has torch's class name: the one line says whose it is."""
    import numpy as np
    import pytest

    from imgpack.errors import InvalidArgumentError

    path, _, _ = make_pack(count=4, height=8, width=8)
    T = DeviceTransform.train(PackedImageDataset(path), 4)
    images = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    with pytest.raises(InvalidArgumentError, match=r"found numpy\.random\.Generator$"):
        T(images, [0, 1], generator=np.random.default_rng(0))
    with pytest.raises(InvalidArgumentError, match=r"found int$"):
        DeviceTransform.train(PackedImageDataset(path), 4, generator=3)


def test_a_state_with_a_bad_draw_seed_is_refused_and_restores_nothing(make_pack):
    """A refused state leaves the loader as it was: its place as much as its draws."""
    from imgpack.errors import InvalidArgumentError

    path, _, _ = make_pack(count=24, height=8, width=6)
    ds = PackedImageDataset(path)
    saved = make_loader(ds, 4, seed=3, transform=TRANSFORMS["train"](ds), device="cpu")
    batches = iter(saved)
    next(batches)
    next(batches)
    state = {**saved.state_dict(), "draw_seed": -1}
    loader = make_loader(ds, 4, seed=3, transform=TRANSFORMS["train"](ds), device="cpu")
    before = loader.state_dict()
    with pytest.raises(
        InvalidArgumentError, match=r"draw_seed should be an integer >= 0, found -1"
    ):
        loader.load_state_dict(state)
    assert loader.state_dict() == before
