"""The training example on a tiny packed folder, on device cpu: it trains, resizes, resumes."""

from __future__ import annotations

import torch
from click.testing import CliRunner
from workbench.train_example import size_for_epoch, train

from imgpack.packer.pack import pack_folder
from imgpack.reader.device import Deliver


def _packs(image_folder, tmp_path):
    src = image_folder(classes=("a", "b"), per_class=6, width=60, height=44)
    pack_folder(src, tmp_path / "train.bin", size=(40, 40), resize="stretch", progress=False)
    pack_folder(src, tmp_path / "val.bin", size=(32, 32), resize="center-crop", progress=False)
    return str(tmp_path / "train.bin"), str(tmp_path / "val.bin")


def test_sizes_spread_over_the_epochs():
    assert [size_for_epoch([16, 24], e, 4) for e in range(4)] == [16, 16, 24, 24]
    assert [size_for_epoch([8, 16, 24], e, 6) for e in range(7)] == [8, 8, 16, 16, 24, 24, 24]


def _one_ahead(self, batches):
    """Deliver as on CUDA: the transform of batch k+1 runs before batch k is handed over."""
    pending = None
    for batch in batches:
        staged = self._apply(batch)
        if pending is not None:
            yield pending
        pending = staged
    if pending is not None:
        yield pending


def test_trains_with_progressive_sizes_and_resumes(image_folder, tmp_path):
    train_pack, val_pack = _packs(image_folder, tmp_path)
    lines = []
    kw = dict(train_pack=train_pack, val_pack=val_pack, sizes=[16, 24], epochs=2, batch_size=4,
              lr=0.05, device="cpu", log=lines.append)  # fmt: skip
    whole = train(**kw)
    hist = whole["history"]
    assert [h["size"] for h in hist] == [16, 24] and all(h["batches"] == 3 for h in hist)
    assert all(0 <= h["val_acc"] <= 1 and h["loss"] > 0 for h in hist)
    assert any(line.startswith("meter:") for line in lines)
    # stopped after 4 steps (mid epoch 1), then resumed: the same model as the whole run
    ckpt = tmp_path / "ckpt.pt"
    part = train(**kw, checkpoint=ckpt, stop_after=4)
    assert part["steps"] == 4 and ckpt.exists()
    rest = train(**kw, checkpoint=ckpt)
    assert rest["resumed"] == {"epoch": 1, "batch": 1} and rest["steps"] == 2
    for a, b in zip(whole["model"].state_dict().values(), rest["model"].state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_resume_is_exact_when_the_loader_transforms_ahead(image_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(Deliver, "__call__", _one_ahead)
    train_pack, _ = _packs(image_folder, tmp_path)
    kw = dict(train_pack=train_pack, sizes=[16, 24], epochs=2, batch_size=4, lr=0.05,
              device="cpu", log=lambda line: None)  # fmt: skip
    whole = train(**kw)
    ckpt = tmp_path / "ckpt.pt"
    train(**kw, checkpoint=ckpt, stop_after=2)  # mid epoch 0: batch 2 was already transformed
    rest = train(**kw, checkpoint=ckpt)
    assert rest["resumed"] == {"epoch": 0, "batch": 2} and rest["steps"] == 4
    for a, b in zip(whole["model"].state_dict().values(), rest["model"].state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_cli_runs_and_refuses_bad_sizes(image_folder, tmp_path):
    import train_example

    train_pack, _ = _packs(image_folder, tmp_path)
    res = CliRunner().invoke(
        train_example.main,
        ["--train", train_pack, "--sizes", "16", "--epochs", "1", "--batch-size", "6"],
    )
    assert res.exit_code == 0, res.output
    assert "epoch 0 at 16px" in res.output
    bad = CliRunner().invoke(train_example.main, ["--train", train_pack, "--sizes", "a,b"])
    assert bad.exit_code != 0 and "comma-separated" in bad.output
