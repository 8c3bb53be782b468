#!/usr/bin/env python3
"""A small torch.distributed training run over a (sharded) pack: the pattern, end to end.

    torchrun --nproc-per-node 2 scripts/train_ddp.py --data all.manifest.json \\
        --epochs 2 --checkpoint ckpt.pt --shard-local

Each rank opens the same dataset (a manifest, a pack, or several ``--data`` packs);
``make_loader`` finds the rank and world size in the process group and gives each rank a
disjoint share of every epoch; the loader's position is saved in the checkpoint, so a
restarted run continues at the next unseen batch (``--stop-after N`` stops after N steps, as
a preemption would). ``--log-samples FILE`` appends, per rank and epoch, the ids of the
samples the rank was handed, recovered from the delivered pixels (each record's CRC-32), not
from the sampler: the log shows what the model saw. Without torchrun it trains in one
process. CPU runs use gloo, CUDA runs NCCL. Sized for a CPU: a tiny CNN, no augmentation.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from imgpack import DistributedOptions, PackedImageDataset, make_loader


def crc(image: torch.Tensor) -> int:
    """The CRC-32 of a uint8 (3, H, W) image's HWC bytes: the pack's record checksum."""
    return zlib.crc32(image.permute(1, 2, 0).contiguous().numpy())


def setup(device: str | None) -> tuple[torch.device, int, int]:
    """Join the process group torchrun describes (if any); (device, rank, world size)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    if not dist.is_initialized():
        return dev, 0, 1
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(dev)
    return dev, dist.get_rank(), dist.get_world_size()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", action="append", required=True, help="a manifest or pack (repeat)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, help="DataLoader worker processes")
    p.add_argument("--shard-local", action="store_true", help="ranks read mostly their shards")
    p.add_argument("--checkpoint", type=Path, help="save after every epoch; resume from it")
    p.add_argument("--stop-after", type=int, help="stop after this many steps, as preempted")
    p.add_argument("--log-samples", type=Path, help="append each rank's sample ids here")
    p.add_argument("--device", help="cpu or cuda (default: cuda where there is one)")
    a = p.parse_args()
    dev, rank, world = setup(a.device)
    torch.manual_seed(a.seed)
    ds = PackedImageDataset(a.data[0] if len(a.data) == 1 else a.data)
    shards = DistributedOptions(shard_local=True) if a.shard_local else None
    loader = make_loader(ds, a.batch_size, seed=a.seed, num_workers=a.workers, distributed=shards)
    model = nn.Sequential(
        nn.Conv2d(ds.channels, 8, 3, 2, 1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, 2, 1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, len(ds.classes)),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    if a.checkpoint and a.checkpoint.exists():
        state = torch.load(a.checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])  # rank 0's state restores every rank
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    mean = torch.tensor(ds.mean, device=dev).view(1, -1, 1, 1) * 255
    std = torch.tensor(ds.std, device=dev).view(1, -1, 1, 1) * 255
    ids = {}
    if a.log_samples:
        for i in range(len(ds)):
            ids.setdefault(crc(ds[i][0]), i)  # identical images: the first one's id
    st = loader.state_dict()
    steps, loss = 0, float("nan")
    for epoch in range(st["epoch"] + (st["batches_done"] >= len(loader)), a.epochs):
        loader.set_epoch(epoch)  # a no-op for a restored epoch under way
        first, seen, t0 = loader.state_dict()["batches_done"], [], time.perf_counter()
        done = first
        for images, labels in loader:
            done += 1
            seen += [ids.get(crc(im), -1) for im in images] if ids else []
            x = (images.to(dev).float() - mean) / std
            out = F.cross_entropy(ddp(x), labels.to(dev))
            opt.zero_grad(set_to_none=True)
            out.backward()
            opt.step()
            steps, loss = steps + 1, float(out.detach())
            if steps == a.stop_after:
                break
        entry = [{"epoch": epoch, "first_batch": first, "ids": seen, "rank": rank}]
        if world > 1:
            entry = [None] * world
            dist.all_gather_object(
                entry, {"epoch": epoch, "first_batch": first, "ids": seen, "rank": rank}
            )
        if rank == 0 and a.log_samples:
            with open(a.log_samples, "a", encoding="utf-8") as f:
                f.writelines(json.dumps(e) + "\n" for e in entry)
        if rank == 0 and a.checkpoint:
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
        if world > 1:
            dist.barrier()
        stopped = steps == a.stop_after and done < len(loader)
        if rank == 0:
            print(
                f"epoch {epoch}: batches {first}..{done} of {len(loader)}, loss {loss:.4f}, "
                f"{time.perf_counter() - t0:.1f} s"
                + (" (stopped; run again to continue)" if stopped else ""),
                flush=True,
            )
        if steps == a.stop_after:
            break
    loader.close()
    if dist.is_initialized():
        # DDP's reducer holds the process group: let it go first, or gloo's threads may be
        # torn down with the interpreter (SIGABRT, about one exit in 15)
        del ddp
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
