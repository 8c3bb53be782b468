#!/usr/bin/env python3
"""A small but real training loop: device-side augmentation, progressive resizing, the meter,
checkpoints that resume at the next unseen batch.

    python scripts/train_example.py --train train.bin --val val.bin --sizes 96,128 \\
        --epochs 4 --checkpoint ckpt.pt --device cuda

The CPU only gathers records (``make_loader``); ``DeviceTransform.train`` (RandomResizedCrop +
flip, antialiased, normalised) makes the training batches on ``--device``, and
``DeviceTransform.eval`` (Resize + CenterCrop) the validation ones. ``--sizes`` are spread over
the epochs (small crops early, larger late: set ``T.size`` per epoch). ``watch`` reports how
long the loop waits for data. ``--checkpoint`` saves model, optimizer and loader after every
epoch (and at ``--stop-after N`` steps, as a preemption would); the same command continues at
the next unseen batch with the crops an uninterrupted run draws (they come from the seed, the
epoch and the batch, and the loader's state carries the seed).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from imgpack import DeviceTransform, PackedImageDataset, make_loader, watch


def small_cnn(channels: int, classes: int) -> nn.Module:
    """Conv-BN-ReLU blocks, global pooling, a linear head: takes any input size."""
    layers, cin = [], channels
    for cout in (16, 32, 64):
        layers += [nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


def size_for_epoch(sizes: list[int], epoch: int, epochs: int) -> int:
    """Progressive resizing: ``sizes`` in equal runs of epochs, the last one to the end."""
    return sizes[min(epoch * len(sizes) // epochs, len(sizes) - 1)]


def accuracy(model: nn.Module, val: PackedImageDataset, size: int, batch: int, dev) -> float:
    loader = make_loader(
        val, batch, shuffle=False, transform=DeviceTransform.eval(val, size), device=dev
    )
    right = total = 0
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            right += int((model(x).argmax(1) == y).sum())
            total += len(y)
    model.train()
    return right / max(total, 1)


def train(a: argparse.Namespace) -> list[dict]:
    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    ds = PackedImageDataset(a.train)
    val = PackedImageDataset(a.val, classes_from=ds) if a.val else None  # the same labels
    model = small_cnn(ds.channels, len(ds.classes)).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-5)
    T = DeviceTransform.train(ds, size=a.sizes[0], generator=torch.Generator().manual_seed(a.seed))
    loader = make_loader(
        ds,
        a.batch_size,
        seed=a.seed,
        num_workers=a.workers,
        drop_last=True,
        transform=T,
        device=dev,
    )
    if a.checkpoint and a.checkpoint.exists():
        state = torch.load(a.checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
    st = loader.state_dict()
    if a.checkpoint and a.checkpoint.exists():
        print(f"resumed at epoch {st['epoch']}, batch {st['batches_done']}", flush=True)
    start = st["epoch"] + (st["batches_done"] >= len(loader))
    history, steps = [], 0
    for epoch in range(start, a.epochs):
        loader.set_epoch(epoch)
        T.size = size_for_epoch(a.sizes, epoch, a.epochs)
        t0, losses = time.perf_counter(), []
        for x, y in watch(loader, every=30.0, progress=False):
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            steps += 1
            if steps == a.stop_after:
                break
        if a.checkpoint:
            tmp = a.checkpoint.with_name(f".{a.checkpoint.name}.{os.getpid()}")
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "loader": loader.state_dict(),
                },
                tmp,
            )
            os.replace(tmp, a.checkpoint)
        row = {
            "epoch": epoch,
            "size": T.size,
            "batches": len(losses),
            "loss": sum(losses) / max(len(losses), 1),
        }
        if val is not None and steps != a.stop_after:
            row["val_acc"] = accuracy(model, val, a.eval_size or T.size, a.batch_size, dev)
        history.append(row)
        acc = f", val accuracy {row['val_acc']:.3f}" if "val_acc" in row else ""
        print(
            f"epoch {epoch} at {T.size}px: loss {row['loss']:.4f}{acc}, "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        if steps == a.stop_after:
            print(f"stopped after {steps} steps; run again to continue", flush=True)
            break
    loader.close()
    return history


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True, help="the training pack (.bin or .json)")
    p.add_argument("--val", help="a validation pack, evaluated each epoch")
    p.add_argument("--sizes", default="96,128", help="crop sizes spread over the epochs")
    p.add_argument("--eval-size", type=int, help="validation crops (default: the training size)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, help="DataLoader worker processes")
    p.add_argument("--checkpoint", type=Path, help="save after every epoch; resume from it")
    p.add_argument("--stop-after", type=int, help="stop after this many steps, as preempted")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    try:
        a.sizes = [int(s) for s in a.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes: expected comma-separated sizes, found {a.sizes!r}")
    train(a)


if __name__ == "__main__":
    main()
