"""Resident packs: the records a rank reads, copied to the device once, each batch gathered
there.

``make_loader(ds, B, device=D, resident=True)`` puts ``ResidentRecords`` in place of the
read stage: at the first pass every record this rank may read (``EpochOrder.reads``: the
whole pack, or its own shards under shard-local reading) is copied to ``D``, end to end,
in record order, with its labels and targets. From then on a batch costs no loader thread
and no host-to-device copy of pixels: its record indices go to the device, and the batch is
gathered there into the canvas the streamed loader makes (each record at the top-left of
its slot, zero beyond; a yuv420 pack's yuv canvas), which the device stages then convert
and transform as usual.

A batch is gathered a row at a time: a record's row is a contiguous run of its stored bytes
(raw: ``w * C``; yuv420: ``w`` of Y, or ``ceil(w/2)`` of Cb or Cr), so the store, viewed as
overlapping windows of a canvas row's width (``as_strided``, no copy), gives every row of
the batch in one ``index_select`` by the rows' start offsets; what lies past each record's
own row, or below its last row, is then masked to zero (nothing, for raw records that all
fill the bound).

The bytes are counted from the index before anything is copied; more than the device has
free (``torch.cuda.mem_get_info``; for ``"cpu"``, the memory this process may still use)
less a margin is refused in one line, with both numbers and the ways out.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Any

import numpy as np
import torch

from imgpack.errors import InvalidArgumentError
from imgpack.machine import mem_available
from imgpack.reader.canvas import slot_shape, yuv_planes
from imgpack.reader.read import Batch, BufferPool

__all__ = ["ResidentRecords", "MARGIN_BYTES"]

MARGIN_BYTES = 512 << 20  # room left beside the store: batches, the model's first steps
_CHUNK = 64 << 20  # bytes staged per copy to the device
_PROGRESS_AFTER_S = 1.0  # a copy that takes longer shows its progress on stderr


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_room(ds: Any, held: np.ndarray, device: torch.device) -> int:
    """The bytes records ``held`` need on ``device`` (their bytes, a canvas row of padding,
    and per record its number, offset, size, label and targets); InvalidArgumentError, with both
    numbers and the ways out, when that is more than is free there less ``MARGIN_BYTES``."""
    targets = ds.target_vectors
    per_record = 8 * 5 + (0 if targets is None else 4 * targets.shape[1])
    need = int(ds._record_lengths[held].sum()) + ds.shape[1] * ds.shape[2] + per_record * len(held)
    free = int(torch.cuda.mem_get_info(device)[0]) if device.type == "cuda" else mem_available()
    if free is not None and need > free - MARGIN_BYTES:
        raise InvalidArgumentError(
            f"resident=True needs {_gib(need)} on {device} for {len(held)} records, and "
            f"{_gib(free)} is free there (less {_gib(MARGIN_BYTES)} kept for batches): pack "
            "smaller records (--size), or --codec yuv420, read shard-local "
            "(DistributedOptions(shard_local=True)), or pass resident=False"
        )
    return need


class ResidentRecords:
    """The read stage of a resident loader (see the module docstring): ``held`` the sorted
    int64 record numbers to hold (``EpochOrder.reads``) on ``device``, ``pool`` where a
    batch's canvas comes from."""

    def __init__(self, ds: Any, pool: BufferPool, held: np.ndarray, device: torch.device):
        self.ds, self.device, self.alloc = ds, device, pool
        self._lock = threading.Lock()
        self.close()  # no store yet (``_load`` makes it at the first pass), ``nbytes`` 0
        self.held = np.empty(0, np.int64)
        self.hold(held)

    def hold(self, held: np.ndarray) -> None:
        """Hold records ``held`` from the next batch on: the store is let go of, to be copied
        again, where it lacks any of them (a restored epoch may read other ranks' homes)."""
        if np.setdiff1d(held, self.held).size:
            self.close()
            self.held = held  # first: refused, it is refused again at the next batch
            check_room(self.ds, held, self.device)

    def close(self) -> None:
        """Let go of everything held on the device."""
        with self._lock:  # the store (tensors by name) and its bytes on the device
            self._store, self.nbytes = None, 0

    # --- the copy, at the first pass ---------------------------------------------------

    def _load(self) -> dict[str, torch.Tensor]:
        with self._lock:
            if self._store is None:  # room checked again: memory may be gone since the hold
                self.nbytes, self._store = check_room(self.ds, self.held, self.device), self._copy()
            return self._store

    def _copy(self) -> dict[str, torch.Tensor]:
        ds, held, dev = self.ds, self.held, self.device
        offsets = np.concatenate(([0], np.cumsum(ds._record_lengths[held], dtype=np.int64)))
        total = int(offsets[-1])
        row = math.prod(slot_shape(ds.codec, ds.shape)[1:])  # the widest window read
        store = torch.empty(total + row, dtype=torch.uint8, device=dev)
        store[total:] = 0  # the padding the last rows' windows reach into
        start, done, said = time.monotonic(), 0, False
        what = f"imgpack: resident pack to {dev}"
        # each run of consecutive records is stored end to end
        for run in np.split(held, np.flatnonzero(np.diff(held) != 1) + 1) if len(held) else []:
            for view in ds._run.stored(int(run[0]), int(run[-1]) + 1):
                for lo in range(0, len(view), _CHUNK):
                    part = view[lo : lo + _CHUNK]
                    if dev.type == "cpu":  # numpy's copy out of a mapping beats torch's
                        np.copyto(store[done : done + len(part)].numpy(), part)
                    else:  # through pinned memory: the host allocator keeps it for the copy
                        staged = torch.empty(len(part), dtype=torch.uint8, pin_memory=True)
                        staged.numpy()[...] = part
                        store[done : done + len(part)].copy_(staged, non_blocking=True)
                    done += len(part)
                    if not said and time.monotonic() - start >= _PROGRESS_AFTER_S:
                        sys.stderr.write(f"{what}: copying {_gib(total)}\n")
                        said = True
        if said:  # a copy that took a second shows its progress: a line on, one at the end
            sys.stderr.write(f"{what}: done in {time.monotonic() - start:.1f} s\n")
        # per record held, in ``held``'s (sorted) order: int64 columns
        columns = {"held": held, "offsets": offsets[:-1], "sizes": ds.record_sizes[held],
                   "labels": ds.labels[held]}  # fmt: skip
        out = {k: torch.from_numpy(np.asarray(v, np.int64)).to(dev) for k, v in columns.items()}
        out["store"] = store
        targets = ds._gather_targets(held)
        if targets is not None:
            out["targets"] = targets.to(dev)
        return out

    # --- a batch -------------------------------------------------------------------------

    def __call__(self, batch: Batch, stop: threading.Event | None = None) -> Batch:
        s = self._load()
        idx = torch.from_numpy(batch.records).to(self.device, non_blocking=True)
        slot = torch.searchsorted(s["held"], idx)  # where each record is held
        rest = tuple(s[k].index_select(0, slot) for k in ("labels", "targets") if k in s)
        return batch.filled(self._canvas(s, slot, len(idx)), rest)

    def _canvas(self, s: dict, slot: torch.Tensor, b: int) -> torch.Tensor:
        """The batch's canvas (``canvas.slot_shape``): a raw record's rows of ``w * C``
        bytes, a yuv420 record's planes where ``canvas.yuv_planes`` lays them."""
        h, w, c = self.ds.shape
        off, size = s["offsets"].index_select(0, slot), s["sizes"].index_select(0, slot)
        rw, rh = size[:, 0], size[:, 1]
        canvas = self.alloc.take(b, slot_shape(self.ds.codec, (h, w, c)))[0]
        if self.ds.codec == "raw":  # records that fill the bound have nothing to zero
            planes = [(canvas.view(b, h, w * c), off, rw * c, rh, not self.ds._fills)]
        else:
            cw, ch = (rw + 1) // 2, (rh + 1) // 2
            starts = (off, off + rw * rh, off + rw * rh + cw * ch)
            planes = zip(yuv_planes(canvas[..., 0], h), starts, (rw, cw, cw), (rh, ch, ch),
                         (True,) * 3)  # fmt: skip
        for plane, start, stride, count, pad in planes:
            self._plane(s["store"], plane, start, stride, count, pad)
        return canvas.permute(0, 3, 1, 2)

    def _plane(self, store: torch.Tensor, into: torch.Tensor, start, stride, count, pad: bool):
        """Fill ``into`` (B, rows, width): row y of record r is the ``stride[r]`` bytes of
        ``store`` from ``start[r] + y * stride[r]`` while y < ``count[r]``, zero beyond and
        below where ``pad``. The store viewed as overlapping windows of ``width`` bytes gives
        them all in one ``index_select`` (ends of the store padded: ``_copy``)."""
        b, rows, width = into.shape
        y = torch.arange(rows, device=self.device)
        starts = (start[:, None] + y[None, :] * stride[:, None]).view(-1)
        lens = torch.where(y[None, :] < count[:, None], stride[:, None], 0).view(-1)
        windows = store.as_strided((store.numel() - width + 1, width), (1, 1))
        # straight into the canvas where its rows are one block (raw), else through a buffer
        flat = into.is_contiguous()
        out = into.view(-1, width) if flat else self.alloc.take(len(starts), (width,))[0]
        torch.index_select(windows, 0, starts.masked_fill(lens == 0, 0), out=out)
        if pad:  # past each record's own row, or below its last row
            cols = torch.arange(width, device=self.device)
            out.masked_fill_(cols[None, :] >= lens[:, None], 0)
        if not flat:
            into.copy_(out.view(b, rows, width))
