"""imgpack's default loader beside the loops it replaces, in one run, with a consumer that
reads every byte.

The obvious alternative to imgpack's reader is thirty lines: ``numpy.memmap`` the records,
sort each batch's indices (file order), gather, ``torch.from_numpy``, one thread. Three
such loops run here, each an epoch per call:

``mm[idx]``             fancy indexing: a fresh array per batch (``memmap_epochs``).
``np.take(out=)``       ``np.take(mm, idx, axis=0, out=buf)`` into one reused buffer, as a
                        careful engineer writes it; numpy buffers ``out`` in its default
                        ``mode="raise"``, so this is one more copy (``careful_epochs``).
``np.take(out=, clip)`` the same with ``mode="clip"``: numpy writes straight into ``buf``.
                        The fastest loop; the one imgpack must not trail.

A consumer that only counted batches would flatter any loader whose batches are views, so
each batch is copied into the consumer's own tensor, as a training step's host-to-device
copy reads every byte: ``into="reused"`` copies into one tensor kept per shape (what a
device buffer from a caching allocator is), ``into="new"`` into a fresh tensor per batch
(which adds the consumer's own page faults to every side). ``into="none"`` touches nothing:
what a GPU consumer costs the CPU (its copy is DMA), where the loader's gather is the only
CPU copy, compared with one core's ``memcpy``.

The sides alternate ``alternations`` times, ``epochs`` full epochs each; the result is the
median images/s of each side and imgpack's ratio to each loop.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

__all__ = [
    "LOOPS",
    "memmap_epochs",
    "careful_epochs",
    "Consumer",
    "versus_loops",
    "versus_table",
]


def _mapped(pack: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """(index, the records as an (N, H, W, C) numpy.memmap, int64 labels)."""
    from imgpack.format.index import read_index

    ix = read_index(pack)
    pixels = ix.sections["pixels"]
    mm = np.memmap(
        ix.data_path, dtype=np.uint8, mode="r", offset=pixels.offset, shape=(ix.count, *ix.shape)
    )
    return ix, mm, ix.read_section("labels").astype(np.int64)


def memmap_epochs(pack: Any, batch_size: int, seed: int = 0) -> Callable[[], Iterator[Any]]:
    """The 30-line reference: each call is one shuffled epoch of (images, labels) batches."""
    ix, mm, labels = _mapped(pack)
    rng = np.random.default_rng(seed)

    def epoch() -> Iterator[Any]:
        order = rng.permutation(ix.count)
        for start in range(0, ix.count, batch_size):
            idx = np.sort(order[start : start + batch_size])  # file order: sequential-ish reads
            images = torch.from_numpy(mm[idx]).permute(0, 3, 1, 2)  # (B,C,H,W) as imgpack's
            yield images, torch.from_numpy(labels[idx])

    return epoch


def careful_epochs(
    pack: Any, batch_size: int, seed: int = 0, mode: str = "raise"
) -> Callable[[], Iterator[Any]]:
    """The careful loop: each batch gathered with ``np.take(..., out=buf, mode=mode)`` into
    one buffer reused for every batch (the consumer copies a batch before the next)."""
    ix, mm, labels = _mapped(pack)
    rng = np.random.default_rng(seed)
    buf = np.empty((batch_size, *ix.shape), dtype=np.uint8)
    lab = np.empty(batch_size, dtype=np.int64)

    def epoch() -> Iterator[Any]:
        order = rng.permutation(ix.count)
        for start in range(0, ix.count, batch_size):
            idx = np.sort(order[start : start + batch_size])
            n = len(idx)
            np.take(mm, idx, axis=0, out=buf[:n], mode=mode)
            np.take(labels, idx, out=lab[:n])
            yield torch.from_numpy(buf[:n]).permute(0, 3, 1, 2), torch.from_numpy(lab[:n])

    return epoch


LOOPS: dict[str, Callable[..., Callable[[], Iterator[Any]]]] = {
    "mm[idx]": memmap_epochs,
    "np.take(out=)": careful_epochs,
    "np.take(out=, clip)": lambda pack, bs, seed: careful_epochs(pack, bs, seed, mode="clip"),
}


class Consumer:
    """Copies each batch's images into its own tensor (a fresh one, or one kept per shape),
    or, ``into="none"``, leaves them as they are (a GPU's DMA costs the CPU nothing)."""

    def __init__(self, into: str = "reused") -> None:
        if into not in ("reused", "new", "none"):
            raise ValueError(f"into should be 'reused', 'new' or 'none', found {into!r}")
        self.into = into
        self._kept: dict[tuple, torch.Tensor] = {}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self.into == "none":
            return images
        if self.into == "new":
            return torch.empty_like(images).copy_(images)
        key = (tuple(images.shape), images.stride())
        out = self._kept.get(key)
        if out is None:
            out = self._kept[key] = torch.empty_like(images)
        return out.copy_(images)

    def describe(self) -> str:
        if self.into == "none":
            return "reads nothing (a GPU's DMA)"
        return f"copies each batch into a {self.into} tensor"


def _epoch_rate(batches: Iterable[Any], consume: Consumer) -> float:
    n, t0 = 0, time.perf_counter()
    for images, labels, *_ in batches:
        consume(images)
        n += len(labels)
    return n / (time.perf_counter() - t0)


def versus_loops(
    pack: Any,
    *,
    batch_size: int = 256,
    epochs: int = 5,
    alternations: int = 3,
    into: str = "reused",
    seed: int = 0,
) -> dict[str, Any]:
    """Median images/s of each loop of ``LOOPS`` and of ``make_loader(ds, batch_size)``,
    alternated; every side gets one untimed epoch first (page tables, buffers); the page
    cache is warm."""
    from imgpack.reader.dataset import PackedImageDataset
    from imgpack.reader.loader import make_loader

    ds = PackedImageDataset(pack)
    loader = make_loader(ds, batch_size, seed=seed)
    sides: dict[str, Callable[[], Iterable[Any]]] = {
        name: make(pack, batch_size, seed) for name, make in LOOPS.items()
    }
    sides["imgpack"] = lambda: loader
    consume = Consumer(into)
    samples: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for epoch in sides.values():
            _epoch_rate(epoch(), consume)
        for _ in range(alternations):
            for name, epoch in sides.items():
                samples[name] += [_epoch_rate(epoch(), consume) for _ in range(epochs)]
    finally:
        loader.close()
        ds.close()
    medians = {name: statistics.median(v) for name, v in samples.items()}
    ours = medians["imgpack"]
    return {
        "row": "versus",
        "cache": "warm",
        "consumer": consume.describe(),
        "batch_size": batch_size,
        "epochs": epochs,
        "alternations": alternations,
        "loader": str(loader.pipeline),
        "rates": {name: round(m) for name, m in medians.items()},
        "ratio": {name: round(ours / medians[name], 2) for name in LOOPS},
        "samples": {name: [round(r) for r in v] for name, v in samples.items()},
    }


def versus_table(rows: list[dict[str, Any]]) -> str:
    """The ``versus_loops`` rows as a markdown table for docs/benchmarks.md."""
    names = list(LOOPS)
    lines = [
        "| consumer | " + " | ".join(f"`{n}`, images/s" for n in names)
        + " | `make_loader(ds, B)`, images/s | " + " | ".join(f"vs `{n}`" for n in names) + " |",
        "|---|" + "---:|" * (2 * len(names) + 1),
    ]  # fmt: skip
    for r in rows:
        rates = " | ".join(f"{r['rates'][n]:,}" for n in names)
        ratios = " | ".join(f"{r['ratio'][n]:.2f}x" for n in names)
        lines.append(f"| {r['consumer']} | {rates} | {r['rates']['imgpack']:,} | {ratios} |")
    return "\n".join(lines)
