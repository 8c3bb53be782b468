"""Loader checkpoints as training code takes them: pack identity, epochs, peeks, restores."""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import pytest
import torch

from imgpack.errors import InvalidArgumentError
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.options import WorkerOptions
from imgpack.reader.order import EpochOrder


def ids(images, pixels):
    flat = pixels.reshape(len(pixels), -1)
    got = images.permute(0, 2, 3, 1).reshape(images.shape[0], -1).numpy()
    return [int(np.flatnonzero((flat == row).all(axis=1))[0]) for row in got]


def test_state_records_the_pack_and_stays_plain(make_pack):
    path, _, _ = make_pack(count=20)
    ds = PackedImageDataset(path)
    loader = make_loader(ds, 4, seed=1)
    state = loader.state_dict()
    assert ds.pack_id and state["pack_id"] == ds.pack_id
    assert json.loads(json.dumps(state)) == state
    buf = io.BytesIO()
    torch.save({"loader": state}, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["loader"] == state


def test_state_of_another_pack_is_refused_in_one_line(make_pack):
    a, _, _ = make_pack(count=20, name="a")
    b, _, _ = make_pack(count=20, name="b", classes=("x", "y"))  # same size, other records
    da, db = PackedImageDataset(a), PackedImageDataset(b)
    assert da.pack_id != db.pack_id
    state = make_loader(da, 4, seed=1).state_dict()
    other = make_loader(db, 4, seed=1)
    with pytest.raises(InvalidArgumentError, match="saved for pack") as err:
        other.load_state_dict(state)
    assert "\n" not in str(err.value) and da.pack_id in str(err.value)
    make_loader(PackedImageDataset(a), 4, seed=1).load_state_dict(state)  # same pack reopened


def test_a_state_without_a_pack_id_loads_anywhere(make_pack):
    path, _, _ = make_pack(count=2, height=2, width=3)
    loader = make_loader(PackedImageDataset(path), 1, seed=0, shuffle=False)
    state = loader.state_dict()
    assert len(state["pack_id"]) == 32
    loader.load_state_dict({**state, "pack_id": None})  # saved over a dataset that is no pack


@pytest.fixture
def small(make_pack):
    path, pixels, labels = make_pack(count=22, height=4, width=3)
    return PackedImageDataset(path), pixels


MODES = [{}, {"num_workers": 2, "options": WorkerOptions(persistent=True)}]


@pytest.mark.parametrize("kw", MODES, ids=["inprocess", "workers"])
def test_peeks_breaks_and_restores_as_a_training_loop_meets_them(small, kw):
    ds, pixels = small

    def expected(epoch, start=0):
        return [b.tolist() for b in EpochOrder(22, batch_size=4, seed=5).batches(epoch, start)]

    loader = make_loader(ds, 4, seed=5, **kw)
    assert ids(next(iter(loader))[0], pixels) == expected(0)[0]  # a peek
    assert [ids(x, pixels) for x, _ in loader] == expected(1)  # then a whole epoch
    for k, _ in enumerate(loader):
        if k == 1:
            break
    assert [ids(x, pixels) for x, _ in loader] == expected(3)  # whole, after a break
    loader.set_epoch(7)
    it = iter(loader)
    head = [ids(next(it)[0], pixels) for _ in range(2)]
    state = loader.state_dict()
    del it
    fresh = make_loader(ds, 4, seed=5, **kw)
    fresh.load_state_dict(state)
    fresh.set_epoch(7)  # DistributedSampler style, after the restore
    assert head + [ids(x, pixels) for x, _ in fresh] == expected(7)
    fresh.set_epoch(8)
    assert [ids(x, pixels) for x, _ in fresh] == expected(8)
    loader.load_state_dict(state)  # into the same loader
    assert [ids(x, pixels) for x, _ in loader] == expected(7, 2)
    assert [ids(x, pixels) for x, _ in loader] == expected(8)
    loader.close()
    fresh.close()


def _fit(ds, pixels, tmp_path, epochs, train, val, ckpt=None):
    pl = pytest.importorskip("pytorch_lightning")
    seen = {"train": {}, "val": {}}

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(3 * 4 * 3, 3)

        def training_step(self, batch, _):
            images, labels = batch
            seen["train"].setdefault(self.current_epoch, []).extend(ids(images, pixels))
            logits = self.head(images.flatten(1).float() / 255)
            return torch.nn.functional.cross_entropy(logits, labels)

        def validation_step(self, batch, _):
            key = ("sanity" if self.trainer.sanity_checking else "val", self.current_epoch)
            seen["val"].setdefault(key, []).append(ids(batch[0], pixels))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=2,
        default_root_dir=tmp_path,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice about workers and logging
        trainer.fit(Tiny(), train, val, ckpt_path=ckpt)
    return trainer, seen


@pytest.mark.parametrize("kw", MODES, ids=["inprocess", "workers"])
def test_lightning_sanity_check_costs_the_first_validation_no_batch(small, tmp_path, kw):
    ds, pixels = small
    train, val = make_loader(ds, 4, seed=3, **kw), make_loader(ds, 4, shuffle=False, **kw)
    trainer, seen = _fit(ds, pixels, tmp_path, 2, train, val)
    assert [len(b) for b in seen["val"][("sanity", 0)]] == [4, 4]
    for epoch in (0, 1):
        batches = seen["val"][("val", epoch)]
        assert len(batches) == len(val) == 6
        assert sorted(sum(batches, [])) == list(range(22))
        assert sorted(seen["train"][epoch]) == list(range(22))
    assert train.epoch == 1 and trainer.current_epoch == 2
    train.close()
    val.close()


def test_lightning_resumed_from_a_checkpoint_trains_the_next_epochs_order(small, tmp_path):
    ds, pixels = small
    trainer, _ = _fit(ds, pixels, tmp_path, 2, make_loader(ds, 4, seed=3), None)
    ckpt = trainer.checkpoint_callback.best_model_path
    train = make_loader(ds, 4, seed=3)
    _, seen = _fit(ds, pixels, tmp_path, 3, train, None, ckpt=ckpt)
    assert list(seen["train"]) == [2]
    assert seen["train"][2] == EpochOrder(22, batch_size=4, seed=3).indices(2).tolist()
    assert train.epoch == 2


def test_an_older_iterator_still_held_does_not_move_the_checkpoint(small):
    ds, pixels = small  # non-persistent workers: torch lets two iterators run at once
    loader = make_loader(ds, 4, seed=5, num_workers=2, options=WorkerOptions(persistent=False))
    stale = iter(loader)
    next(stale)
    current = iter(loader)
    head = [ids(next(current)[0], pixels) for _ in range(2)]
    next(stale)  # the old pass goes on, as a DataLoader's would
    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 2)
    del stale, current
    fresh = make_loader(ds, 4, seed=5)
    fresh.load_state_dict(state)
    expected = [b.tolist() for b in EpochOrder(22, batch_size=4, seed=5).batches(1)]
    assert head + [ids(x, pixels) for x, _ in fresh] == expected
