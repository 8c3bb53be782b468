"""``make_loader``: the usual DataLoader template as one short call, plus resumable epochs.

A loader is a chain of stages, chosen here once, from what the pack and the call ask, and
then only assembled (``print(loader)`` shows the chain)::

    order -> plan -> read (in this process, or in workers) -> move -> convert -> transform

order      ``order.EpochOrder``: which records each batch holds, a pure function of (seed,
           epoch, rank), so a run resumes from three numbers (``state_dict``).
plan       ``read.Plan``: each batch as a ``Batch`` request; with ``DeviceTransform.train``
           or ``.eval``, the crops drawn first (the row's ``draws``: ``Drawn``, or
           ``Scaled`` for JPEG records decoded at the scale their crops need).
read       the row's ``read``: ``read.Gather``, ``.Pixels`` or ``.Crops`` (which fill the
           batch through the dataset's ``dataset.Packs``), run by ``run.InProcess`` (in the
           loop's thread or one ahead of it) or by ``run.Workers`` (a torch DataLoader's
           processes, ``num_workers=N``); with ``resident=True``,
           ``resident.ResidentRecords``: gathered on the device from records held there.
move       ``device.Move`` to ``device=``; on CUDA, it and what follows run on a side stream.
convert    the row's ``convert``: yuv to RGB (``device.ToRgb``).
transform  the row's ``finish`` under ``DeviceTransform.train``/``.eval``: ``ApplyDraw`` (the
           plan's crops, batched), ``Normalise`` (crops the read made already) or
           ``Call`` (a resident canvas on a CPU: ``T(images, records)``, drawing then); any
           other transform: ``device.Call``.

Every stage follows from the row of ``STAGES`` that (codec, where) picks, and from nothing
else. So the default raw batch passes ``PackLoader`` -> ``run.InProcess`` -> ``read.Gather``
(its parts through ``run.POOL``) -> ``dataset.Packs.copy`` (the
dataset's ``_run``) -> ``np.take``.

Any other dataset (anyone's map-style dataset, or a ``PackedImageDataset`` with
ImageFolder's per-sample ``transform``) is read sample by sample instead
(``read.Samples``: torch's own fetch and collate), in worker processes unless
in-process is asked for, with one warning saying so.

Either way the sequence of batches depends only on the seed, the epoch and the rank, so
every mode yields the same batches, and ``state_dict()`` taken at any point restores to the
next unseen batch (after a full epoch: the start of the next one). Each full pass advances
the epoch by itself; ``set_epoch(e)`` jumps to epoch ``e`` (a no-op for an epoch that
``load_state_dict`` restored and is not finished, so it does not undo a restore). As with
a DataLoader, every ``iter()`` is a whole epoch: after a pass that stopped early
(``break``, a peek) the next one starts the next epoch; only the first pass after
``load_state_dict`` continues mid-epoch. Every batch yielded is the user's: no mode writes
into it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sized
from inspect import signature
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate

from imgpack.errors import InvalidArgumentError
from imgpack.machine import usable_cores
from imgpack.reader.canvas import slot_shape
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.device import ApplyDraw, Call, Deliver, Move, Normalise, ToRgb
from imgpack.reader.options import (
    DATALOADER_KEYWORDS,
    DistributedOptions,
    InProcessOptions,
    OrderOptions,
    WorkerOptions,
)
from imgpack.reader.order import EpochOrder, check_flag, int_at_least
from imgpack.reader.read import BufferPool, Crops, Drawn, Gather, Pixels, Plan, Samples, Scaled
from imgpack.reader.resident import ResidentRecords
from imgpack.reader.run import InProcess, Workers
from imgpack.reader.transform import DeviceTransform, draws_at_random

__all__ = ["make_loader", "PackLoader", "STAGES"]


# How a pack's records become the batch's pixels, by (codec, where):
#   copy     copied as stored (a yuv420 batch crosses to a CUDA device as yuv, half the bytes)
#   cpu      read as RGB by the loader's threads (or its workers): yuv420 converted, jpeg
#            decoded (under DeviceTransform, each record at the scale its crop needs)
#   crops    read as RGB and cropped by the loader's threads, for DeviceTransform on a CPU
#            (jpeg decoded whole: a uint8 crop leaves no precision for the 1/2 decode's loss)
#   resident raw and yuv420 records gathered on the device from a copy held there (on a
#            CPU device, under DeviceTransform, cropped there as the streamed loader does)
# Each row names every stage a batch passes: (read: the read stage's class; convert: the
# device stage that finishes the pixels (yuv to RGB), or None; draws: what the plan draws
# under DeviceTransform.train/.eval, Drawn, Scaled or None; finish: what applies that
# transform after the read, ApplyDraw, Normalise or Call).
STAGES: dict[tuple[str, str], tuple] = {
    ("raw", "copy"): (Gather, None, Drawn, ApplyDraw),
    ("yuv420", "copy"): (Gather, ToRgb, Drawn, ApplyDraw),
    ("yuv420", "cpu"): (Pixels, None, Drawn, ApplyDraw),
    ("jpeg", "cpu"): (Pixels, None, Scaled, ApplyDraw),
    **{(codec, "crops"): (Crops, None, Drawn, Normalise) for codec in ("raw", "yuv420", "jpeg")},
    ("raw", "resident"): (ResidentRecords, None, Drawn, ApplyDraw),
    ("yuv420", "resident"): (ResidentRecords, ToRgb, Drawn, ApplyDraw),
    ("raw", "resident crops"): (ResidentRecords, None, None, Call),
    ("yuv420", "resident crops"): (ResidentRecords, ToRgb, None, Call),
}
# A batch smaller than this is read in the loop's thread: copying 1 MiB takes about as long
# as handing a batch between threads (wake-ups, the GIL).
INLINE_BYTES = 1 << 20
_BACKGROUND_PREFETCH = 2  # batches read ahead by the background thread
_COPY_THREADS = 2  # threads sharing a copy read in the background: two reach the memory bus
# pooled buffers beyond ``prefetch``: the one being read, the one in the user's loop, the
# one before it (still bound while the next is fetched), and one spare
_SPARE = 4
_PASSED_ON = "options=WorkerOptions(dataloader_kwargs={...}) with num_workers=N"
DEFAULT_WORKERS = 2  # at most this many worker processes (fewer on fewer cores)
DEFAULT_PREFETCH_FACTOR = 4  # batches in flight per worker


class PackLoader:
    """Iterable of (images uint8 (B,C,H,W), labels int64 (B,)[, targets]) with resumable epochs."""

    # As on a DataLoader built with batch_size=None: ``sampler`` yields whole batches and
    # there is no batch sampler. Frameworks that find ``sampler`` read this one too
    # (Lightning's shuffle check on validation loaders raised AttributeError without it).
    batch_sampler = None

    def __init__(self, dataset: Any, plan: Plan, read: Any, run: str, source: Any, stages: Deliver):
        """The stages ``make_loader`` chose: the plan, the read stage and where it ``run``s
        (by ``source``), the device ``stages``: what ``print(loader)`` shows."""
        self.dataset, self.plan, self.read, self._run = dataset, plan, read, run
        self.order, self.sampler = plan.order, plan
        self._source, self._deliver = source, stages
        self.mode = "inprocess" if isinstance(source, InProcess) else "workers"
        self._passes = 0  # iter() calls begun: only the latest one counts batches
        self._remote = isinstance(dataset, PackedImageDataset) and dataset._remote is not None

    def __repr__(self) -> str:
        names = [type(s).__name__ for s in (self.plan.draws, self.read, *self._deliver.stages)]
        draws, read, *stages = names
        plan = "records" if self.plan.draws is None else f"records + crops ({draws})"
        chain = " -> ".join(["order", f"plan: {plan}", f"read: {read}, {self._run}", *stages])
        return f"<PackLoader of {len(self)} batches: {chain}>"

    # the torch DataLoader in workers mode; else None
    dataloader = property(lambda self: self._source.dataloader if self.mode == "workers" else None)

    @property
    def resident_bytes(self) -> int:
        """Bytes this loader holds on its device (``resident=True``; 0 until the first pass
        and after ``close``)."""
        return self.read.nbytes if isinstance(self.read, ResidentRecords) else 0

    epoch = property(lambda self: self.order.epoch)
    batch_size = property(lambda self: self.order.batch_size)
    # batches of the current epoch handed over so far
    batches_done = property(lambda self: self.order.batches_done)

    def __len__(self) -> int:
        """Batches in one epoch on this rank."""
        return len(self.order)

    def __iter__(self) -> Iterator[Any]:
        epoch, start = self.plan.begin()
        self._passes = mine = self._passes + 1
        done = lambda: self.order.batches_done - start  # noqa: E731
        ahead = self._remote and self.dataset._run.ahead(self.order.batches(epoch, start), done)
        read = self._source.batches(self.plan)
        batches = self._deliver(read)
        try:
            for batch in batches:
                if self._passes == mine:  # an older iterator still held no longer moves the place
                    self.order.batches_done += 1  # counted as handed over, not as fetched
                yield batch
                batch = None  # noqa: F841 - the user's now; hold no reference of our own
            if self._passes == mine:  # the loop asked for more: this rank's epoch is over
                self.order.end_pass()
        finally:
            ahead and ahead.close()
            batches.close()
            read.close()

    def close(self) -> None:
        """Stop the loader's thread or worker processes now rather than at garbage
        collection, and let go of a resident pack's memory; iterating again starts afresh."""
        self._source.close()
        if isinstance(self.read, ResidentRecords):
            self.read.close()

    def __enter__(self) -> PackLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch (a no-op for an epoch ``load_state_dict``
        restored and that is not finished)."""
        self.order.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Epoch, batches consumed and seeds (of the order, and of a ``DeviceTransform``'s
        random draws), plus the layout and pack they are valid for."""
        seed = {} if self.plan.draw_seed is None else {"draw_seed": self.plan.draw_seed}
        return {**self.order.state_dict(), "pack_id": _pack_id(self.dataset), **seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the next unseen batch of ``state``; refuses a state of another loader.

        A state saved over another pack (another ``pack_id``) is refused: its positions
        would index different records.
        """
        given = state if isinstance(state, dict) else {}  # (the order refuses a non-dict)
        theirs, mine = given.get("pack_id"), _pack_id(self.dataset)
        if None not in (theirs, mine) and theirs != mine:
            raise InvalidArgumentError(
                f"loader state: saved for pack {theirs!r}, this loader reads pack {mine!r}"
            )
        # every check before anything is restored: a refused state leaves the loader as it was
        seed = given.get("draw_seed") if self.plan.draw_seed is not None else None
        seed = int_at_least("loader state: draw_seed", seed, 0, none_ok=True)
        self.order.load_state_dict(state)
        if isinstance(self.read, ResidentRecords):
            self.read.hold(self.order.reads())
        if seed is not None:
            self.plan.draw_seed = seed


def _pack_id(dataset: Any) -> str | None:
    """The records' identity (None for a dataset that is no ``PackedImageDataset``)."""
    return dataset.pack_id if isinstance(dataset, PackedImageDataset) else None


def _name(ds: Any) -> str:
    pid = _pack_id(ds)
    return f"a {type(ds).__name__} of {len(ds)} records" + (f" (pack {pid[:8]})" if pid else "")


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
    resident: bool = False,
    **dataloader_keywords: Any,
) -> PackLoader:
    """A loader over ``ds``; see the module docstring for the stages it chooses.

    ``seed``: None draws one from torch's default generator. ``transform``/``device``:
    each batch is moved to ``device`` and its images replaced by ``transform(images,
    records)``. ``num_workers``: None for the in-process loader, N (even 0) for a torch
    DataLoader. ``pin_memory``: None pins where CUDA exists. ``pad``: under
    torch.distributed, False visits every record exactly once across ranks (evaluation).
    ``order``: "uniform", "block", "sequential" or an ``OrderOptions``. ``distributed``: None
    follows torch.distributed; ``DistributedOptions`` sets ranks or shard-local reading.
    ``options``: ``InProcessOptions`` or ``WorkerOptions``, the expert knobs of each mode.
    ``resident``: copy the records this rank reads to ``device`` once, at the first pass,
    and gather every batch there. A ``DataLoader`` keyword passed here by name
    (``prefetch_factor=``, ``sampler=``, ...) is refused with the argument that does the
    same here; any other is a ``TypeError``.
    """
    flags = {"shuffle": shuffle, "drop_last": drop_last, "pad": pad, "resident": resident}
    if isinstance(ds, PackedImageDataset) and ds._remote is not None:  # (imgpack.remote)
        order = ds._remote.order(order)  # blocks as the cache holds them
    order = _check_call(ds, flags, transform, dataloader_keywords, num_workers, options, order)
    int_at_least("batch_size", batch_size, 1)
    seed = int_at_least("seed", seed, 0, none_ok=True)
    dev, pin = _device(device, pin_memory)
    packed = isinstance(ds, PackedImageDataset)
    # the one question asked of the dataset: is it a pack read whole?
    whole = packed and ds.transform is None and ds.target_transform is None
    wopts = options if isinstance(options, WorkerOptions) else WorkerOptions()
    iopts = options if isinstance(options, InProcessOptions) else InProcessOptions()
    extra = dict(wopts.dataloader_kwargs)
    workers = num_workers is not None or isinstance(options, WorkerOptions)
    workers = workers or (not whole and options is None)  # per-sample work: over cores
    n_workers = max(1, min(DEFAULT_WORKERS, usable_cores())) if num_workers is None else num_workers
    rank, world_size, shard_local = resolve_ranks(distributed)
    epoch_order = EpochOrder(
        len(ds),
        batch_size=batch_size,
        shuffle=shuffle,
        seed=resolve_seed(seed, world_size) if shuffle else (seed or 0),
        **vars(order),  # OrderOptions' order, block, window and repeat, as they are
        # the block size is counted in the records' mean stored size
        record_bytes=max(1, round(float(np.mean(ds._record_lengths)))) if packed else None,
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        shard_sizes=(ds._shard_sizes if packed else [len(ds)]) if shard_local else None,
        pad=pad,
        pack_sizes=ds._shard_sizes if packed else None,
    )
    # the seed of every random draw the transform makes (read.py): None where it makes none
    seeds = Plan.seed_draws(seed, transform.generator) if draws_at_random(transform) else None
    stages = [] if dev is None or (whole and (dev.type == "cpu" or resident)) else [Move(dev)]
    if not whole:  # anyone's dataset, or one with a per-sample transform: torch collates
        where = f"{n_workers} worker processes" if workers else "in this process"
        collate = _check_samples(ds, resident, where, iopts, extra)
        plan, read = Plan(epoch_order, (0, 0), None, None, seeds), Samples(ds, collate)
        stages += [] if transform is None else [Call(transform)]
    else:  # a pack read whole: one row of STAGES, then only assembled
        drawn = isinstance(transform, DeviceTransform) and transform.mode is not None
        cuda = dev is not None and dev.type == "cuda"
        if resident:
            _check_resident(ds, dev, num_workers, options)
            where = "resident crops" if drawn and not cuda else "resident"
        elif drawn and not cuda:
            where = "crops"
        elif ds.codec == "jpeg" or (ds.codec == "yuv420" and not cuda):
            where = "cpu"
        else:
            where = "copy"
        reader, convert, draws, finish = STAGES[(ds.codec, where)]
        _check_whole(ds, transform, extra)
        draws = draws(transform) if drawn and draws is not None else None
        sizes = None if ds._fills else ds.record_sizes
        plan = Plan(epoch_order, ds.shape[:2], draws, sizes, seeds)
        stages += [] if convert is None else [convert()]
        stages += [] if transform is None else [finish(transform) if drawn else Call(transform)]

    if resident:  # no thread, no copy: the batch is gathered on the device
        read = reader(ds, BufferPool(_SPARE, device=dev), epoch_order.reads(), dev)
        source = InProcess(read, prefetch=0)
        run = f"on {dev}, from {len(read.held)} records held there"
    elif workers:
        if whole:
            read = reader(ds, BufferPool(), 1 if reader.copies else None, pad=not drawn)
        # the DataLoader's arguments besides the dataset and the sampling; ``extra`` (what
        # WorkerOptions.dataloader_kwargs adds) cannot hold any of them (WorkerOptions)
        kw = dict(extra, num_workers=n_workers, pin_memory=pin, timeout=wopts.timeout)
        kw.update(multiprocessing_context=wopts.multiprocessing_context)  # None: torch's own
        kw.update(worker_init_fn=wopts.worker_init_fn)  # torch seeds random and numpy per worker
        kw.update(generator=torch.Generator().manual_seed(epoch_order.seed % 2**63))
        if n_workers > 0:  # (torch refuses both without workers)
            kw.update(prefetch_factor=wopts.prefetch_factor or DEFAULT_PREFETCH_FACTOR)
            kw.update(persistent_workers=wopts.persistent is not False)
        source, run = Workers(plan, kw, read), f"in {n_workers} worker processes"
    else:
        # a copy whose consumer is this CPU, or a small one, is read in the loop's thread, on
        # that thread alone; anything else (a copy for a GPU, a decode) a batch or two ahead,
        # a copy on two threads, a decode on every core
        copies, prefetch = whole and reader.copies, iopts.prefetch
        if prefetch is None:
            # the batch is used by this CPU: delivered to it, or to no device where none has CUDA
            cpu_consumer = dev.type == "cpu" if dev is not None else not torch.cuda.is_available()
            small = copies and batch_size * np.prod(slot_shape(ds.codec, ds.shape)) < INLINE_BYTES
            here = copies and (cpu_consumer or small)
            prefetch = 0 if here and iopts.timeout is None else _BACKGROUND_PREFETCH
        copy_threads = 1 if prefetch == 0 else min(_COPY_THREADS, usable_cores())
        threads = iopts.gather_threads or (copy_threads if copies else usable_cores())
        run = "in the loop's thread" if prefetch == 0 else f"{prefetch} ahead in a thread"
        if whole:
            read = reader(ds, BufferPool(prefetch + _SPARE, pin), threads, pad=not drawn)
            run += f", {threads} thread(s) per batch"

        def hint(idx: np.ndarray) -> None:  # MADV_WILLNEED: the reads run in parallel
            if whole and (iopts.hints or (iopts.hints is None and not ds._in_page_cache)):
                ds._run.will_need(idx)

        source = InProcess(read, hint, prefetch=prefetch, timeout=iopts.timeout)
    return PackLoader(ds, plan, read, run, source, Deliver(stages, dev))


def _check_call(
    ds: Any, flags: dict, transform: Any, keywords: dict, num_workers: Any, options: Any, order: Any
) -> OrderOptions:
    """Refuse, in one line, a dataset or an argument ``make_loader`` cannot take; the order."""
    if isinstance(ds, (str, bytes, os.PathLike)):
        raise InvalidArgumentError(
            f"make_loader takes a dataset, not the path {os.fsdecode(ds)!r}: "
            "make_loader(PackedImageDataset(path), batch_size)"
        )
    if not isinstance(ds, Sized):
        raise InvalidArgumentError(
            f"make_loader takes a map-style dataset (with len()), not {type(ds).__name__}"
        )
    if len(ds) == 0:
        raise InvalidArgumentError(f"make_loader: {type(ds).__name__} holds no records")
    for name, flag in flags.items():
        check_flag(name, flag)
    if transform is not None and not callable(transform):
        raise InvalidArgumentError(f"transform should be callable, not {type(transform).__name__}")
    accepted = signature(DataLoader).parameters
    if keywords:  # a torch DataLoader keyword is answered with what does the same here
        name = sorted(keywords)[0]
        if name not in accepted:
            raise TypeError(f"make_loader() got an unexpected keyword argument {name!r}")
        use = DATALOADER_KEYWORDS.get(name, _PASSED_ON)
        raise InvalidArgumentError(f"make_loader({name}=...): use {use}")
    int_at_least("num_workers", num_workers, 0, none_ok=True)
    # what needs worker processes, refused without them (left at its default: not asked)
    asked = ("prefetch_factor", "persistent", "multiprocessing_context", "timeout")
    name = next((k for k in asked if getattr(options, k, None) not in (None, False, 0)), None)
    if num_workers == 0 and isinstance(options, WorkerOptions) and name is not None:
        raise InvalidArgumentError(f"WorkerOptions({name}=...) needs num_workers > 0, not 0")
    if options is not None and not isinstance(options, (InProcessOptions, WorkerOptions)):
        raise InvalidArgumentError(
            f"options should be InProcessOptions or WorkerOptions, found {type(options).__name__}"
        )
    if isinstance(options, InProcessOptions) and num_workers is not None:
        raise InvalidArgumentError(
            f"num_workers={num_workers} asks for a DataLoader: pass WorkerOptions, or drop it"
        )
    order = OrderOptions(order) if isinstance(order, str) else order
    if not isinstance(order, OrderOptions):
        raise InvalidArgumentError(f"order should be a name or OrderOptions, found {order!r}")
    # a DeviceTransform.train/.eval follows one dataset's geometry: it must be the loader's
    # (the same object, or the same records: the same pack id and length)
    drawn = isinstance(transform, DeviceTransform) and transform.mode is not None
    own = transform.dataset if drawn else ds
    same = _pack_id(own) is not None and _pack_id(own) == _pack_id(ds) and len(own) == len(ds)
    if own is not ds and not same:
        raise InvalidArgumentError(
            f"DeviceTransform.{transform.mode} was built on {_name(own)}, this loader reads "
            f"{_name(ds)}: build it on the loader's, DeviceTransform.{transform.mode}(ds, ...)"
        )
    return order


def _device(device: Any, pin_memory: bool | None) -> tuple[torch.device | None, bool]:
    """The device batches are delivered to (None: where they are read), and whether their host
    buffers are pinned: only where an async copy to a GPU will read them (None), or as asked
    (without CUDA, ignored with a warning)."""
    cuda = torch.cuda.is_available()
    try:
        dev = None if device is None else torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise InvalidArgumentError(f"device {device!r} is not a torch device: {e}") from None
    if dev is not None and dev.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"device {device!r}: imgpack delivers to 'cpu' or 'cuda' only")
    if dev is not None and dev.type == "cuda" and not cuda:
        raise InvalidArgumentError(f"device {device!r}: this torch has no CUDA device, pass 'cpu'")
    if pin_memory and not cuda:
        warn_once("pin", "pin_memory=True ignored: no CUDA device")
    pin = (dev is None or dev.type == "cuda") if pin_memory is None else bool(pin_memory)
    return dev, cuda and pin


def _check_samples(ds: Any, resident: bool, where: str, opts: InProcessOptions, extra: dict) -> Any:
    """What a dataset served sample by sample cannot take, refused in one line; else the
    collate function (and the one warning saying it is slower than a gather). ``opts``: what
    the in-process loader was given (its gather_threads only with InProcessOptions, which
    no worker process takes)."""
    packed = isinstance(ds, PackedImageDataset)
    if resident:
        raise InvalidArgumentError(
            f"resident=True gathers whole batches of a pack; {type(ds).__name__} is served "
            "sample by sample (it has a per-sample transform, or is no PackedImageDataset)"
        )
    if opts.gather_threads is not None:
        raise InvalidArgumentError(
            "InProcessOptions(gather_threads=...) splits a whole-batch read, and this dataset "
            "is served sample by sample: drop gather_threads"
        )
    collate = extra.pop("collate_fn", default_collate)
    if packed and ds.transform is None and collate is default_collate and not ds._fills:
        raise InvalidArgumentError(
            f"{type(ds).__name__}: records of many sizes (up to {ds.shape[1]}x{ds.shape[0]}) "
            "cannot be stacked by the default collate: pass WorkerOptions(dataloader_kwargs="
            "{'collate_fn': ...}), or drop target_transform"
        )
    why = "has a per-sample transform" if packed else "has no gather()"
    warn_once(
        "per-sample",
        f"{type(ds).__name__} {why}: make_loader builds each batch sample by sample ({where}), "
        "slower than one gather; make_loader(transform=...) takes a batched transform",
    )
    return collate


def _check_whole(ds: Any, transform: Any, extra: dict) -> None:
    """What a pack read whole cannot take, refused in one line."""
    if "collate_fn" in extra:
        raise InvalidArgumentError(
            "collate_fn applies to per-sample work, and this pack is read whole: drop collate_fn"
        )
    if transform is None and not ds._fills:
        raise InvalidArgumentError(
            f"{type(ds).__name__}: records of many sizes (up to {ds.shape[1]}x{ds.shape[0]}) "
            "travel as one padded canvas: pass make_loader(..., transform=DeviceTransform.train("
            "ds, 224)) (or .eval, or any T(images, records)), or pack with --resize stretch or "
            "center-crop"
        )


def _check_resident(ds: Any, dev: torch.device | None, num_workers: Any, options: Any) -> None:
    """Refuse, in one line, a resident loader that cannot be."""
    if dev is None:  # the records are held on a device: none was given
        raise InvalidArgumentError("resident=True: pass make_loader(..., device='cuda')")
    if num_workers is not None or options is not None:
        raise InvalidArgumentError(
            "resident=True reads each batch on the device, with no worker process: drop "
            "InProcessOptions, WorkerOptions and num_workers"
        )
    if (ds.codec, "resident") not in STAGES:
        raise InvalidArgumentError(
            f"resident=True holds raw or yuv420 records, this pack's are {ds.codec}: decode it "
            "to a raw or yuv420 pack (pack-images --codec raw), or pass resident=False"
        )


_warned: set[str] = set()  # warnings given once per process


def warn_once(key: str, message: str) -> None:
    """A RuntimeWarning once per process, pointing at make_loader's caller (this is called
    by a helper of make_loader)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def resolve_ranks(distributed: Any) -> tuple[int, int, bool]:
    """(rank, world size, shard_local) from ``distributed=`` and the process group."""
    if distributed not in (None, True, False) and not isinstance(distributed, DistributedOptions):
        raise InvalidArgumentError(
            f"distributed should be None, True, False or DistributedOptions, found {distributed!r}"
        )
    opts = distributed if isinstance(distributed, DistributedOptions) else DistributedOptions()
    if opts.rank is not None:
        return opts.rank, opts.world_size, opts.shard_local
    group = torch.distributed.is_available() and torch.distributed.is_initialized()
    if group and distributed is not False:
        return torch.distributed.get_rank(), torch.distributed.get_world_size(), opts.shard_local
    if distributed is True:
        raise InvalidArgumentError(
            "distributed=True needs torch.distributed initialised, or DistributedOptions ranks"
        )
    return 0, 1, opts.shard_local  # one process: shard-local reading changes nothing


def resolve_seed(seed: int | None, world_size: int) -> int:
    """``seed``, or one drawn from torch's default generator (so torch.manual_seed governs it);
    under torch.distributed every rank takes rank 0's draw."""
    if seed is not None:
        return seed
    drawn = int(torch.empty((), dtype=torch.int64).random_().item())
    if world_size > 1:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise InvalidArgumentError(
                "shuffle=True on many ranks without torch.distributed needs seed=..."
            )
        box = [drawn]
        torch.distributed.broadcast_object_list(box, src=0)
        drawn = int(box[0])
    return drawn
