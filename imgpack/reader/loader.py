"""``make_loader``: the usual DataLoader template as one short call, plus resumable epochs.

Two ways to deliver batches:

in-process  (the default) ``InProcessLoader``: no worker processes; a thread gathers each
            batch with ``ds.gather_into`` into buffers it reuses only once you have dropped
            them. Tuned with ``options=InProcessOptions(...)``.
workers     a torch ``DataLoader`` over ``num_workers`` processes, asked for by
            ``num_workers=N`` (even 0) or ``options=WorkerOptions(...)``. Its sampler yields
            one index array per batch with ``batch_size=None``, so each worker calls
            ``ds.gather`` once per batch and the default collate never sees a batch.

Which of the two serves a dataset is decided once, here: a ``PackedSource``
(``imgpack.reader.protocol``: ``PackedImageDataset``) without a per-sample transform is
gathered whole. Any other map-style dataset, or one with a per-sample ``transform``
(ImageFolder style), is served sample by sample, fetched as torch's DataLoader fetches,
through the default collate (``collate_fn`` in ``WorkerOptions.dataloader_kwargs`` replaces
it), over worker processes unless in-process is asked for, with one warning saying so.
``transform=``/``device=`` of ``make_loader`` itself act on whole batches (``deliver.py``).
A JPEG pack is decoded on the loader's threads or in the workers; with ``DeviceTransform``
``.train``/``.eval``, each record at the scale its crop needs, drawn first (``scaled.py``);
or on the GPU, by nvImageCodec, where ``device=`` has one (``devdecode.py``).

Either way the sequence of batches depends only on the seed, the epoch and the rank, so the
two modes yield the same batches, and ``state_dict()`` taken at any point restores to the
next unseen batch (after a full epoch: the start of the next one). Each full pass advances
the epoch by itself; ``set_epoch(e)`` jumps to epoch ``e`` (a no-op for the epoch under
way, so it does not undo a restore). As with a DataLoader, every ``iter()`` is a whole
epoch: after a pass that stopped early (``break``, a peek) the next one starts the next
epoch; only the first pass after ``load_state_dict`` continues mid-epoch. Every batch
yielded is the user's: no mode writes into it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
from torch.utils.data import DataLoader, Sampler
from torch.utils.data._utils.collate import default_collate

from imgpack.errors import InvalidArgumentError
from imgpack.machine import usable_cores
from imgpack.reader import placement
from imgpack.reader.deliver import Canvas, Delivery
from imgpack.reader.devdecode import encodes, use_gpu
from imgpack.reader.gpu import DeviceTransform
from imgpack.reader.inprocess import InProcessLoader
from imgpack.reader.options import (
    DistributedOptions,
    InProcessOptions,
    OrderOptions,
    WorkerOptions,
    check_loader_args,
)
from imgpack.reader.order import EpochOrder
from imgpack.reader.packed import packs_for
from imgpack.reader.protocol import PackedSource, decodes_jpeg
from imgpack.reader.scaled import ScaledPlan
from imgpack.reader.workers import build_dataloader, default_workers

# in-process mode: threads gathering each batch. One thread copying random records into
# fresh buffers reached 46k images/s at 224x224 on the 2-core benchmark machine, two
# reached 82k (memcpy: 86k): a second thread is where the remaining bandwidth is. A JPEG
# pack's batches are decoded instead, on every CPU this process may use (decodepool.py).
DEFAULT_GATHER_THREADS = 2

__all__ = ["make_loader", "PackLoader", "OrderSampler", "DEFAULT_GATHER_THREADS"]


class OrderSampler(Sampler):
    """Yields one index array per batch of an ``EpochOrder`` pass (a DataLoader sampler)."""

    def __init__(self, order: EpochOrder) -> None:
        self.order = order
        self.epoch, self.start = 0, 0

    def plan(self, epoch: int, start: int) -> None:
        """Set the epoch and first batch of the next ``iter()``."""
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.order.batches(self.epoch, self.start)

    def set_epoch(self, epoch: int) -> None:
        """``PackLoader.set_epoch``, for frameworks that set the epoch on ``loader.sampler``.

        Lightning does, each epoch; without it a run resumed from an epoch-end checkpoint
        (whose loader state Lightning does not reload) replayed epoch 0's order.
        """
        self.order.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.order)


class PackLoader:
    """Iterable of (images uint8 (B,C,H,W), labels int64 (B,)[, targets]) with resumable epochs."""

    # As on a DataLoader built with batch_size=None: ``sampler`` yields whole batches and
    # there is no batch sampler. Frameworks that find ``sampler`` read this one too
    # (Lightning's shuffle check on validation loaders raised AttributeError without it).
    batch_sampler = None

    def __init__(
        self,
        dataset: Any,
        order: EpochOrder,
        sampler: OrderSampler,
        source: Any,
        delivery: Delivery,
        plan: Any = None,
    ) -> None:
        self.dataset, self.order, self.sampler = dataset, order, sampler
        self._source, self._delivery = source, delivery
        self._plan = sampler if plan is None else plan  # what the source iterates
        self.mode = "inprocess" if isinstance(source, InProcessLoader) else "workers"
        self._passes = 0  # iter() calls begun: only the latest one counts batches

    @property
    def dataloader(self) -> DataLoader | None:
        """The torch DataLoader in workers mode (it yields (batch, records)); else None."""
        return self._source if self.mode == "workers" else None

    @property
    def epoch(self) -> int:
        return self.order.epoch

    @property
    def batch_size(self) -> int:
        return self.order.batch_size

    @property
    def batches_done(self) -> int:
        """Batches of the current epoch handed over so far."""
        return self.order.batches_done

    def __len__(self) -> int:
        """Batches in one epoch on this rank."""
        return len(self.order)

    def __iter__(self) -> Iterator[Any]:
        epoch, start = self.order.begin_pass()
        self._passes = mine = self._passes + 1
        self._plan.plan(epoch, start)
        items = iter(self._source)
        batches = self._delivery(items)
        try:
            for batch in batches:
                if self._passes == mine:  # an older iterator still held no longer moves the place
                    self.order.batches_done += 1  # counted as handed over, not as fetched
                yield batch
                batch = None  # noqa: F841 - the user's now; hold no reference of our own
        finally:
            batches.close()
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        """Stop worker processes or the loader thread now rather than at garbage collection.

        torch has no public call that stops persistent workers; this does what the
        DataLoader iterator's own ``__del__`` does. Iterating again starts them afresh.
        """
        if isinstance(self._source, InProcessLoader):
            self._source.close()
            return
        it = getattr(self._source, "_iterator", None)
        shutdown = getattr(it, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
            self._source._iterator = None

    def __enter__(self) -> PackLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch (a no-op for the epoch under way)."""
        self.order.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Epoch, batches consumed and seed, plus the layout and pack they are valid for."""
        return {**self.order.state_dict(), "pack_id": _pack_id(self.dataset)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the next unseen batch of ``state``; refuses a state of another loader.

        A state saved over another pack (another ``pack_id``) is refused: its positions
        would index different records. A state or pack without an id (format version 1
        packs have none) is taken.
        """
        theirs, mine = (state.get("pack_id") if isinstance(state, dict) else None), None
        if theirs is not None:
            mine = _pack_id(self.dataset)
        if theirs is not None and mine is not None and theirs != mine:
            raise InvalidArgumentError(
                f"loader state: saved for pack {theirs!r}, this loader reads pack {mine!r}"
            )
        self.order.load_state_dict(state)


def _pack_id(dataset: Any) -> str | None:
    """The dataset's identity as a plain string (None for packs without one, and for
    datasets that are not ``PackedSource``s)."""
    pid = dataset.pack_id if isinstance(dataset, PackedSource) else None
    return None if pid is None else str(pid)


def _per_sample(ds: Any, packed: bool, extra: dict) -> Callable[[list], Any] | None:
    """The collate for per-sample work, or None when batches can be gathered whole."""
    if packed and ds.transform is None and ds.target_transform is None:
        if "collate_fn" in extra:
            raise InvalidArgumentError(
                "collate_fn applies to per-sample work (a dataset transform); "
                "this dataset's batches are gathered whole: drop collate_fn"
            )
        return None
    return extra.pop("collate_fn", default_collate)


def make_loader(
    ds: Any,
    batch_size: int,
    shuffle: bool = True,
    *,
    drop_last: bool = False,
    seed: int | None = None,
    transform: Callable[..., Any] | None = None,
    device: Any = None,
    num_workers: int | None = None,
    pin_memory: bool | None = None,
    pad: bool = True,
    order: str | OrderOptions = "uniform",
    distributed: bool | DistributedOptions | None = None,
    options: InProcessOptions | WorkerOptions | None = None,
    **dataloader_keywords: Any,
) -> PackLoader:
    """A loader over ``ds`` with benchmark-backed defaults; see the module docstring.

    ``seed``: None draws one from torch's default generator. ``transform``/``device``:
    each batch is moved to ``device`` and its images replaced by ``transform(images,
    records)``. ``num_workers``: None for the in-process loader, N (even 0) for a torch
    DataLoader. ``pin_memory``: None pins where CUDA exists. ``pad``: under
    torch.distributed, False visits every record exactly once across ranks (evaluation).
    ``order``: "uniform", "block", "sequential" or an ``OrderOptions``. ``distributed``: None
    follows torch.distributed; ``DistributedOptions`` sets ranks or shard-local reading.
    ``options``: ``InProcessOptions`` or ``WorkerOptions``, the expert knobs of each mode.
    A ``DataLoader`` keyword passed here by name (``prefetch_factor=``, ``sampler=``, ...) is
    refused with the argument that does the same here; any other is a ``TypeError``.
    """
    if isinstance(ds, (str, bytes, os.PathLike)):
        raise InvalidArgumentError(
            f"make_loader takes a dataset, not the path {os.fsdecode(ds)!r}: "
            "make_loader(PackedImageDataset(path), batch_size)"
        )
    order = check_loader_args(dataloader_keywords, num_workers, options, order)
    packed = isinstance(ds, PackedSource)  # the one question asked of the dataset
    wopts = options if isinstance(options, WorkerOptions) else WorkerOptions()
    extra = dict(wopts.dataloader_kwargs)
    collate = _per_sample(ds, packed, extra)
    canvas = Canvas.of(ds) if collate is None else None  # batches gathered whole
    delivery = Delivery(device, transform, canvas)
    if canvas is not None and canvas.varying and transform is None:
        h, w, _ = ds.shape
        raise InvalidArgumentError(
            f"{type(ds).__name__}: records of many sizes (up to {w}x{h}) travel as one padded "
            "canvas: pass make_loader(..., transform=DeviceTransform.train(ds, 224)) (or .eval, "
            "or any T(images, records)), or pack with --resize stretch or center-crop"
        )
    rank, world_size, shard_local = placement.resolve_ranks(distributed)
    epoch_order = EpochOrder(
        len(ds),
        batch_size=batch_size,
        shuffle=shuffle,
        order=order.order,
        seed=placement.resolve_seed(seed, world_size) if shuffle else (seed or 0),
        block=order.block,
        window=order.window,
        record_bytes=placement.record_bytes(ds) if packed else None,
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        shard_sizes=(ds.shard_sizes if packed else [len(ds)]) if shard_local else None,
        pad=pad,
    )
    sampler = OrderSampler(epoch_order)
    plan: Any = sampler
    decodes = packed and collate is None and decodes_jpeg(ds)
    workers_mode = num_workers is not None or isinstance(options, WorkerOptions)
    if options is None and num_workers is None and collate is not None:
        workers_mode = True  # per-sample work: spread it over cores
    opts = options if isinstance(options, InProcessOptions) else InProcessOptions()
    gpu = not workers_mode and use_gpu(opts.decode, delivery.device, decodes and encodes(ds))
    if decodes and isinstance(transform, DeviceTransform) and transform.mode is not None:
        plan = ScaledPlan(sampler, transform, ds.shape[:2], gpu)  # crops drawn, then decoded
    pin = placement.resolve_pin(pin_memory, delivery)
    if collate is not None:
        where = f"{default_workers() if num_workers is None else num_workers} worker processes"
        why = "has a per-sample transform" if packed else "has no gather()"
        placement.warn_once(
            "per-sample",
            f"{type(ds).__name__} {why}: make_loader builds each batch sample by sample "
            f"({where if workers_mode else 'in this process'}), slower than one gather; "
            "make_loader(transform=...) takes a batched transform",
        )
    if not workers_mode:
        if collate is not None and opts.gather_threads is not None:
            raise InvalidArgumentError(
                "InProcessOptions(gather_threads=...) splits a whole-batch gather; this "
                "dataset is served sample by sample: drop gather_threads, or move its "
                "transform to make_loader(transform=...)"
            )
        cpu_decodes = decodes and not gpu  # a GPU decode leaves the loader's thread bytes only
        most = usable_cores() if cpu_decodes else min(DEFAULT_GATHER_THREADS, usable_cores())
        threads = opts.gather_threads or max(1, most)
        source = InProcessLoader(
            ds,
            plan,
            prefetch=opts.prefetch,
            pin_memory=pin,
            hints=opts.hints,
            timeout=opts.timeout,
            threads=threads,
            collate=collate,
            gpu=gpu,
            packed=cpu_decodes and packs_for(delivery),
        )
        return PackLoader(ds, epoch_order, sampler, source, delivery, plan)
    source = build_dataloader(
        ds,
        plan,
        collate=collate,
        num_workers=default_workers() if num_workers is None else num_workers,
        options=wopts,
        extra=extra,
        pin_memory=pin,
        seed=epoch_order.seed,
    )
    return PackLoader(ds, epoch_order, sampler, source, delivery, plan)
