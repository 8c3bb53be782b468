"""imgpack's default loader beside the loop it replaces, in one run, with a consumer that
reads every byte.

The obvious alternative to imgpack's reader is thirty lines: ``numpy.memmap`` the records,
sort each batch's indices (file order), ``mm[idx]``, ``torch.from_numpy``, one thread.
``memmap_epochs`` is exactly that. A consumer that only counts batches would flatter any
loader whose batches are views, so each batch is copied into the consumer's own tensor, as
a training step's host-to-device copy reads every byte: ``into="reused"`` copies into one
tensor kept per shape (what a device buffer from a caching allocator is), ``into="new"``
into a fresh tensor per batch (which adds the consumer's own page faults to both sides).

The two loaders alternate ``alternations`` times, ``epochs`` full epochs each; the result
is the median images/s of each side and their ratio.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["memmap_epochs", "Consumer", "versus_memmap", "versus_table"]


def memmap_epochs(pack: Any, batch_size: int, seed: int = 0) -> Callable[[], Iterator[Any]]:
    """The 30-line reference: each call is one shuffled epoch of (images, labels) batches."""
    from imgpack.format.index import read_index

    ix = read_index(pack)
    pixels = ix.sections["pixels"]
    mm = np.memmap(
        ix.data_path, dtype=np.uint8, mode="r", offset=pixels.offset, shape=(ix.count, *ix.shape)
    )
    labels = ix.read_section("labels").astype(np.int64)
    rng = np.random.default_rng(seed)

    def epoch() -> Iterator[Any]:
        order = rng.permutation(ix.count)
        for start in range(0, ix.count, batch_size):
            idx = np.sort(order[start : start + batch_size])  # file order: sequential-ish reads
            images = torch.from_numpy(mm[idx]).permute(0, 3, 1, 2)  # (B,C,H,W) as imgpack's
            yield images, torch.from_numpy(labels[idx])

    return epoch


class Consumer:
    """Copies each batch's images into its own tensor: a fresh one, or one kept per shape."""

    def __init__(self, into: str = "reused") -> None:
        if into not in ("reused", "new"):
            raise ValueError(f"into should be 'reused' or 'new', found {into!r}")
        self.into = into
        self._kept: dict[tuple, torch.Tensor] = {}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self.into == "new":
            return torch.empty_like(images).copy_(images)
        key = (tuple(images.shape), images.stride())
        out = self._kept.get(key)
        if out is None:
            out = self._kept[key] = torch.empty_like(images)
        return out.copy_(images)


def _epoch_rate(batches: Iterable[Any], consume: Consumer) -> float:
    n, t0 = 0, time.perf_counter()
    for images, labels, *_ in batches:
        consume(images)
        n += len(labels)
    return n / (time.perf_counter() - t0)


def versus_memmap(
    pack: Any,
    *,
    batch_size: int = 256,
    epochs: int = 5,
    alternations: int = 3,
    into: str = "reused",
    seed: int = 0,
) -> dict[str, Any]:
    """Median images/s of the memmap loop and of ``make_loader(ds, batch_size)``, alternated.

    Both get one untimed epoch first (page tables, buffers); the page cache is warm.
    """
    from imgpack.reader.dataset import PackedImageDataset
    from imgpack.reader.loader import make_loader

    reference = memmap_epochs(pack, batch_size, seed)
    ds = PackedImageDataset(pack)
    loader = make_loader(ds, batch_size, seed=seed)
    consume = Consumer(into)
    try:
        _epoch_rate(reference(), consume)
        _epoch_rate(loader, consume)
        ref, ours = [], []
        for _ in range(alternations):
            ref += [_epoch_rate(reference(), consume) for _ in range(epochs)]
            ours += [_epoch_rate(loader, consume) for _ in range(epochs)]
    finally:
        loader.close()
        ds.close()
    ref_med, ours_med = statistics.median(ref), statistics.median(ours)
    return {
        "row": "versus",
        "cache": "warm",
        "consumer": f"copies each batch into a {into} tensor",
        "batch_size": batch_size,
        "epochs": epochs,
        "alternations": alternations,
        "memmap_images_per_s": round(ref_med),
        "imgpack_images_per_s": round(ours_med),
        "ratio": round(ours_med / ref_med, 2),
        "memmap_samples": [round(r) for r in ref],
        "imgpack_samples": [round(r) for r in ours],
    }


def versus_table(rows: list[dict[str, Any]]) -> str:
    """The ``versus_memmap`` rows as a markdown table for docs/benchmarks.md."""
    lines = [
        "| consumer | numpy.memmap loop, images/s | make_loader(ds, B), images/s | ratio |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['consumer']} | {r['memmap_images_per_s']:,} | {r['imgpack_images_per_s']:,} "
            f"| {r['ratio']:.2f}x |"
        )
    return "\n".join(lines)
