"""A small but real training loop: device-side augmentation, progressive resizing, the meter.

    python scripts/train_example.py --train train.bin --val val.bin --sizes 96,128 \\
        --epochs 4 --checkpoint ckpt.pt --device cuda

The CPU only gathers uint8 records (``make_loader``); every pixel operation runs
on ``--device``: ``DeviceTransform.train`` (per-sample RandomResizedCrop +
flip, antialiased, normalised) on the training batches, ``DeviceTransform.eval``
(Resize + CenterCrop) on the validation ones. ``--sizes`` are spread over the
epochs (progressive resizing: small crops early, larger ones late; set
``T.size`` per epoch). ``watch`` reports how long the loop waits for data.
``make_loader(ds, bs, transform=T, device=dev)`` draws each batch's crops, applies
them and hands over ready batches; on CUDA one batch ahead of the loop.
``--checkpoint`` saves model, optimizer and loader state after every epoch (and
at ``--stop-after``); a run given the same checkpoint continues at the next
unseen batch, with the same crops an uninterrupted run draws: the loader draws
them from (seed, epoch, batch), and its state carries the seed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from imgpack.diagnose.meter import watch
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.transform import DeviceTransform

__all__ = ["small_cnn", "size_for_epoch", "train"]


def small_cnn(channels: int, num_classes: int) -> nn.Module:
    """Conv-BN-ReLU blocks, global pooling, a linear head: takes any input size."""

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True)]  # fmt: skip

    return nn.Sequential(
        *block(channels, 16), *block(16, 32), *block(32, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, max(num_classes, 1)),
    )  # fmt: skip


def size_for_epoch(sizes: list[int], epoch: int, epochs: int) -> int:
    """Progressive resizing: ``sizes`` in equal runs of epochs, the last one to the end."""
    return sizes[min(epoch * len(sizes) // max(epochs, 1), len(sizes) - 1)]


def _save(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def evaluate(model: nn.Module, ds: Any, size: int, batch_size: int, dev: torch.device) -> float:
    """Top-1 accuracy over ``ds`` with Resize + CenterCrop(size) on the device."""
    t = DeviceTransform.eval(ds, size=size)
    loader = make_loader(ds, batch_size, shuffle=False, num_workers=0, transform=t, device=dev)
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for x, labels in loader:
            correct += int((model(x).argmax(1) == labels).sum())
            total += len(labels)
    model.train()
    return correct / max(total, 1)


def train(
    *,
    train_pack: str,
    val_pack: str | None = None,
    sizes: list[int] = (96, 128),
    eval_size: int | None = None,
    epochs: int = 2,
    batch_size: int = 64,
    lr: float = 0.1,
    seed: int = 0,
    workers: int | None = None,
    checkpoint: Path | None = None,
    stop_after: int | None = None,
    device: str = "cpu",
    log: Any = None,
) -> dict[str, Any]:
    """Train ``small_cnn`` on ``train_pack``; returns per-epoch numbers and what was resumed."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    sizes = list(sizes)
    dev = torch.device(device)
    torch.manual_seed(seed)
    ds = PackedImageDataset(train_pack)
    val = PackedImageDataset(val_pack, classes_from=ds) if val_pack else None  # same labels
    channels = ds.channels
    model = small_cnn(channels, len(ds.classes)).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-5)
    T = DeviceTransform.train(ds, size=sizes[0], generator=torch.Generator().manual_seed(seed))
    loader = make_loader(ds, batch_size, seed=seed, num_workers=workers, drop_last=True,
                         transform=T, device=dev)  # fmt: skip
    resumed = None
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        resumed = {"epoch": state["loader"]["epoch"], "batch": state["loader"]["batches_done"]}

    def save() -> None:
        if checkpoint is not None:
            _save(checkpoint, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                               "loader": loader.state_dict()})  # fmt: skip

    st = loader.state_dict()
    start = st["epoch"] + (st["batches_done"] >= len(loader))
    history, steps = [], 0
    for epoch in range(start, epochs):
        loader.set_epoch(epoch)
        T.size = size_for_epoch(sizes, epoch, epochs)
        meter = watch(loader, every=30.0, log=log, progress=False)
        t0, losses, hits, seen = time.perf_counter(), [], 0, 0
        for x, y in meter:
            out = model(x)
            loss = F.cross_entropy(out, y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            hits += int((out.argmax(1) == y).sum())
            seen += len(y)
            steps += 1
            if stop_after is not None and steps >= stop_after:
                break
        stopped = stop_after is not None and steps >= stop_after
        save()
        row = {"epoch": epoch, "size": T.size, "batches": len(losses),
               "loss": sum(losses) / max(len(losses), 1), "train_acc": hits / max(seen, 1),
               "seconds": time.perf_counter() - t0, "meter": meter.summary().line()}  # fmt: skip
        if val is not None and not stopped:
            row["val_acc"] = evaluate(model, val, eval_size or T.size, batch_size, dev)
        history.append(row)
        acc = f", val acc {row['val_acc']:.3f}" if "val_acc" in row else ""
        log(f"epoch {epoch} at {T.size}px: loss {row['loss']:.4f}, train acc "
            f"{row['train_acc']:.3f}{acc}, {row['seconds']:.1f} s")  # fmt: skip
        if stopped:
            break
    return {"history": history, "resumed": resumed, "steps": steps, "model": model}
