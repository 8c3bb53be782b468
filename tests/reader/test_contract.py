"""A pack in other people's training code: a plain DataLoader with the default collate, every
common option, real workers under fork (spawn: test_dataset.py's workers test, whose
collate calls the default one), DistributedSampler, torchdata's
StatefulDataLoader (save and restore mid-epoch) and PyTorch Lightning's Trainer.fit."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from imgpack.reader.dataset import PackedImageDataset

N, H, W = 30, 8, 6


@pytest.fixture
def pack(make_pack):
    path, pixels, labels = make_pack(count=N, height=H, width=W)
    return path, pixels, labels


def ids(images, pixels):
    """Which records a batch holds, recovered from the pixels themselves."""
    flat = pixels.reshape(len(pixels), -1)
    got = images.permute(0, 2, 3, 1).reshape(images.shape[0], -1).numpy()
    return [int(np.flatnonzero((flat == row).all(axis=1))[0]) for row in got]


def check_epoch(batches, pixels, labels, batch_size, drop_last=False):
    """Each batch collated right, and together they are the epoch (each record once)."""
    seen = []
    for images, lab in batches:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, H, W)
        assert lab.dtype == torch.int64 and len(lab) == len(images) <= batch_size
        k = ids(images, pixels)
        assert lab.tolist() == labels[k].tolist()
        seen += k
    if drop_last:
        assert len(seen) == N // batch_size * batch_size and len(set(seen)) == len(seen)
    else:
        assert sorted(seen) == list(range(N))


def test_the_template_from_the_issue(pack):
    path, pixels, labels = pack
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own "pin_memory without accelerator" warning
        loader = DataLoader(
            PackedImageDataset(path),
            batch_size=8,
            shuffle=True,
            num_workers=4,
            prefetch_factor=4,
            persistent_workers=True,
            pin_memory=True,
            drop_last=True,
        )
        for _epoch in range(2):
            batches = list(loader)
            assert len(batches) == N // 8
            check_epoch(batches, pixels, labels, 8, drop_last=True)


@pytest.mark.parametrize(
    "kw",
    [
        {"batch_size": 1},
        {"batch_size": 7, "shuffle": True},
        {"batch_size": 4, "drop_last": True, "shuffle": True},
        {"batch_size": 5, "num_workers": 1, "prefetch_factor": 1},
        {"batch_size": 6, "num_workers": 2, "persistent_workers": True, "shuffle": True},
        {"batch_size": 3, "num_workers": 2, "multiprocessing_context": "fork", "pin_memory": True},
    ],
)
def test_a_plain_dataloader_with_the_default_collate(pack, kw):
    path, pixels, labels = pack
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = DataLoader(PackedImageDataset(path), **kw)
        check_epoch(list(loader), pixels, labels, kw["batch_size"], kw.get("drop_last", False))


def test_batch_size_none_gives_single_samples(pack):
    path, pixels, labels = pack
    got = list(DataLoader(PackedImageDataset(path), batch_size=None, num_workers=1))
    assert [int(y) for _, y in got] == labels.tolist()
    assert torch.equal(got[4][0].permute(1, 2, 0), torch.from_numpy(pixels[4]))


def test_distributed_sampler_splits_the_pack(pack):
    path, pixels, labels = pack
    ds = PackedImageDataset(path)
    seen = []
    for rank in range(3):
        sampler = DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=True, seed=1)
        sampler.set_epoch(2)
        batches = list(DataLoader(ds, batch_size=4, sampler=sampler, num_workers=1))
        for images, lab in batches:
            k = ids(images, pixels)
            assert lab.tolist() == labels[k].tolist()
            seen += k
    assert sorted(seen) == list(range(N))


@pytest.mark.parametrize("workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_mid_epoch(pack, workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    path, pixels, labels = pack
    ds = PackedImageDataset(path)

    def make():
        g = torch.Generator().manual_seed(5)
        return stateful.StatefulDataLoader(
            ds, batch_size=4, shuffle=True, num_workers=workers, generator=g
        )

    whole = [ids(x, pixels) for x, _ in make()]
    first = make()
    it = iter(first)
    head = [ids(next(it)[0], pixels) for _ in range(3)]
    state = first.state_dict()
    del it
    second = make()
    second.load_state_dict(state)
    tail = [ids(x, pixels) for x, _ in second]
    assert head + tail == whole
    assert sorted(sum(whole, [])) == list(range(N))


def test_lightning_trainer_fit_on_cpu(pack, tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    path, _, _ = pack
    ds = PackedImageDataset(path)
    seen = []

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(3 * H * W, 3)

        def training_step(self, batch, _):
            images, labels = batch
            seen.append(len(labels))
            logits = self.head(images.flatten(1).float() / 255)
            return torch.nn.functional.cross_entropy(logits, labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = pl.Trainer(
        max_epochs=1,  # a second epoch of re-made workers: test_dataset's workers cases
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice about num_workers
        trainer.fit(Tiny(), DataLoader(ds, batch_size=8, shuffle=True, num_workers=1))
    assert sum(seen) == N and trainer.current_epoch == 1
