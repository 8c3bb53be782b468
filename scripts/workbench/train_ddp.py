"""A small torch.distributed training run over a sharded pack: the pattern, end to end.

    torchrun --nproc-per-node 2 scripts/train_ddp.py --data all.manifest.json \\
        --epochs 2 --checkpoint ckpt.pt --shard-local

Each rank opens the same dataset (a manifest, a pack, or several ``--data`` packs),
``make_loader`` finds the rank and world size in the initialised process group and
gives each rank a disjoint share of every epoch, and the loader's position is saved in
the checkpoint (``loader.state_dict()``), so a restarted run continues at the next
unseen batch. ``--stop-after N`` stops after N steps, checkpoint written, as a
preemption would. ``--log-samples FILE`` appends, per rank and epoch, the ids of the
samples the rank was handed; the ids are recovered from the delivered pixels (their
CRC-32 looked up among the records' stored checksums), not from the sampler, so the
log shows what the model saw (identical images share an id).

Without torchrun it trains in one process. CPU runs use the gloo backend, CUDA runs
NCCL. This is an example, sized for a CPU: a tiny CNN, no augmentation.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from imgpack.errors import ImgpackError
from workbench.train_options import (
    checkpoint_option,
    seed_option,
    stop_after_option,
    workers_option,
)

__all__ = ["tiny_cnn", "record_checksums", "sample_ids", "train", "main"]


def tiny_cnn(num_classes: int) -> nn.Module:
    """Two strided convolutions, global pooling, a linear head: enough to show the loop."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, max(num_classes, 1)),
    )


def record_checksums(ds: Any) -> np.ndarray:
    """Every record's stored CRC-32, in dataset order (one pack or many)."""
    return np.concatenate([ix.read_section("checksums") for ix in ds.indexes])


def sample_ids(images: torch.Tensor, lookup: dict[int, int]) -> list[int]:
    """Dataset ids of a delivered uint8 (B, 3, H, W) batch, from each record's CRC-32."""
    hwc = images.permute(0, 2, 3, 1).contiguous().numpy()
    return [lookup.get(zlib.crc32(rec) & 0xFFFFFFFF, -1) for rec in hwc]


def _setup(device: str | None) -> tuple[torch.device, int, int]:
    """Join the process group torchrun describes (if any); return (device, rank, world)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    if dist.is_initialized():
        if dev.type == "cuda":
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(dev)
        return dev, dist.get_rank(), dist.get_world_size()
    return dev, 0, 1


def _save(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _log(path: Path | None, rank: int, world: int, entry: dict) -> None:
    """Gather every rank's entry and append them, one JSON line each, from rank 0."""
    if path is None:
        return
    entries = [{**entry, "rank": rank}]
    if world > 1:
        entries = [None] * world
        dist.all_gather_object(entries, {**entry, "rank": rank})
    if rank == 0:
        with open(path, "a", encoding="utf-8") as f:
            for e in entries:
                f.write(json.dumps(e) + "\n")


def train(
    *,
    data: list[str],
    epochs: int = 1,
    batch_size: int = 32,
    lr: float = 0.05,
    seed: int = 0,
    workers: int | None = None,
    shard_local: bool = False,
    checkpoint: Path | None = None,
    stop_after: int | None = None,
    log_samples: Path | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Train ``tiny_cnn`` on ``data`` for ``epochs``; return what this rank did."""
    from imgpack.reader.dataset import PackedImageDataset
    from imgpack.reader.loader import make_loader
    from imgpack.reader.options import DistributedOptions

    dev, rank, world = _setup(device)
    torch.manual_seed(seed)
    ds = PackedImageDataset(data[0] if len(data) == 1 else data)
    loader = make_loader(
        ds,
        batch_size,
        seed=seed,
        num_workers=workers,
        distributed=DistributedOptions(shard_local=True) if shard_local else None,
    )
    model = tiny_cnn(len(ds.classes)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    resumed = None
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])  # rank 0's state restores every rank
        resumed = {"epoch": state["loader"]["epoch"], "batch": state["loader"]["batches_done"]}
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    mean = torch.tensor(ds.mean, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(ds.std, device=dev).view(1, 3, 1, 1)
    lookup: dict[int, int] = {}
    if log_samples is not None:
        for i, c in enumerate(record_checksums(ds).tolist()):
            lookup.setdefault(c, i)  # identical images: the first one's id

    def save() -> None:
        if checkpoint is not None and rank == 0:
            _save(
                checkpoint,
                {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "loader": loader.state_dict(),
                },
            )
        if world > 1:
            dist.barrier()

    st = loader.state_dict()
    start = st["epoch"] + (st["batches_done"] >= len(loader))
    steps, loss = 0, float("nan")
    for epoch in range(start, epochs):
        loader.set_epoch(epoch)  # a no-op for a restored epoch under way
        first, seen, t0 = loader.state_dict()["batches_done"], [], time.perf_counter()
        for images, labels in loader:
            if lookup:
                seen += sample_ids(images, lookup)
            x = images.to(dev, non_blocking=True).float().div_(255).sub_(mean).div_(std)
            out = F.cross_entropy(ddp(x), labels.to(dev, non_blocking=True))
            opt.zero_grad(set_to_none=True)
            out.backward()
            opt.step()
            steps, loss = steps + 1, float(out.detach())
            if stop_after is not None and steps >= stop_after:
                break
        done = loader.batches_done
        _log(log_samples, rank, world, {"epoch": epoch, "first_batch": first, "ids": seen})
        save()
        stopped = stop_after is not None and steps >= stop_after
        if rank == 0:
            note = " (stopped; run again to continue)" if stopped and done < len(loader) else ""
            print(
                f"epoch {epoch}: batches {first}..{done} of {len(loader)}, loss {loss:.4f}, "
                f"{time.perf_counter() - t0:.1f} s{note}",
                file=sys.stderr,
                flush=True,
            )
        if stopped:
            break
    if dist.is_initialized():
        # DDP's reducer holds the process group: let it go first, or gloo's threads may be
        # torn down with the interpreter (SIGABRT, "terminate called without an active
        # exception", about one exit in 15 here)
        del ddp
        gc.collect()
        dist.destroy_process_group()
    return {"rank": rank, "world_size": world, "steps": steps, "loss": loss, "resumed": resumed}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data", multiple=True, required=True, help="A manifest or pack (repeat for packs).")
@click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0), default=0.05, show_default=True)
@seed_option
@workers_option
@click.option("--shard-local", is_flag=True, help="Each rank reads mostly its own shards.")
@checkpoint_option
@stop_after_option
@click.option(
    "--log-samples",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append each rank's sample ids per epoch here (JSON lines).",
)
@click.option("--device", default=None, help="cpu or cuda.  [default: cuda if available]")
def main(**options: Any) -> None:
    """Train a tiny CNN with DistributedDataParallel from a (sharded) pack."""
    options["data"] = list(options["data"])
    try:
        train(**options)
    except ImgpackError as exc:
        click.echo(f"train_ddp: error: {exc}", err=True)
        sys.exit(1)
