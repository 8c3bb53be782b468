"""Which records each rank reads in each epoch, and in what order: pure numpy, no torch.

The order of an epoch depends only on ``(seed, epoch)`` (and the rank's place), never on
worker processes or threads, so a run can be reproduced and resumed mid-epoch from three
numbers: the epoch, the batches already consumed and the seed.

Orders
    ``uniform``     every permutation equally likely (``np.random.default_rng((seed, epoch))``).
    ``block``       for data larger than RAM: the file is cut into contiguous blocks of
                    ``block`` records (about ``DEFAULT_BLOCK_BYTES``); the blocks are permuted,
                    then records are shuffled within consecutive windows of ``window`` blocks.
                    A disk then reads ``window`` MB-sized runs nearly sequentially instead of
                    one random record at a time. The price is randomness: a batch draws from
                    the ``window`` blocks of one window (two windows at a seam), and the packer
                    writes classes in sorted order, so neighbours in the pack tend to share
                    batches. A larger ``window`` (more blocks resident in the page cache at
                    once) mixes better.
    ``sequential``  the file order; also what ``shuffle=False`` gives with any ``order``.

Distributed
    Every rank computes the same global order and takes its own contiguous share of it
    (contiguous rather than strided, so block order stays local on each rank). Like torch's
    ``DistributedSampler``, the order is padded by wrap-around to a multiple of
    ``world_size`` so that all ranks run the same number of steps (a few samples are seen
    twice); with ``drop_last`` the tail is dropped instead (a few are not seen this epoch).
    When ``n`` is a multiple of ``world_size`` every sample is seen exactly once either way.
    With ``pad=False`` (evaluation, exact metrics) nothing is padded or dropped: rank ``r``
    takes positions ``[r*n//W, (r+1)*n//W)``, every record is seen exactly once across
    ranks, and shares differ by at most one record (so ranks may run different numbers of
    batches).

Shard-local (``shard_sizes``)
    For many shards on many nodes: each shard has a fixed *home* rank (shards are dealt out
    as contiguous ranges, by the position of the shard's middle record), so a node needs
    little more than its home shards on local disk. Each epoch, a rank keeps a random
    subset of its home records up to its equal share; the surplus of over-full ranks is
    dealt to the ranks that are short (the only cross-shard reads). Every record is still
    read exactly once per epoch across ranks (up to the padding above). The trade-off: a
    rank sees mostly the same records every epoch, so shards should each hold a mix of
    classes (``pack-images --shard-by interleaved``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from numpy.random import default_rng  # numpy imports its random module on first use: here

from imgpack.errors import InvalidArgumentError

__all__ = [
    "EpochOrder",
    "ORDERS",
    "DEFAULT_BLOCK_BYTES",
    "DEFAULT_WINDOW_BYTES",
    "check_order",
    "check_flag",
    "int_at_least",
]

ORDERS = ("uniform", "block", "sequential")
DEFAULT_BLOCK_BYTES = 8 << 20  # a block: one long sequential read, well past readahead sizes
DEFAULT_WINDOW_BYTES = 256 << 20  # blocks mixed at once: what must stay in the page cache
_FALLBACK_BLOCK = 64  # when the record size is unknown
_STATE_VERSION = 1
# what a saved state must agree on (not the rank: rank 0's checkpoint restores every rank)
_CONFIG_KEYS = ("n", "batch_size", "world_size", "order", "shuffle", "drop_last", "pad")


def check_order(name: Any) -> str:
    """``name`` if it is one of ``ORDERS``, else InvalidArgumentError."""
    if name not in ORDERS:
        raise InvalidArgumentError(f"order should be one of {', '.join(ORDERS)}, found {name!r}")
    return name


def int_at_least(name: str, value: Any, low: int, *, none_ok: bool = False) -> Any:
    """``value`` as an int >= ``low`` (None where ``none_ok``), else InvalidArgumentError:
    the one check of a count imgpack's loader takes."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InvalidArgumentError(f"{name} should be an integer >= {low}, found {value!r}")
    return int(value)


def check_flag(name: str, value: Any, *, none_ok: bool = False) -> Any:
    """``value`` if it is True or False (or None where ``none_ok``), else one line."""
    if not (isinstance(value, bool) or (none_ok and value is None)):
        also = ", False or None" if none_ok else " or False"
        raise InvalidArgumentError(f"{name} should be True{also}, found {value!r}")
    return value


def block_order(m: int, rng: np.random.Generator, block: int, window: int) -> np.ndarray:
    """A block-shuffled permutation of ``range(m)`` (see the module docstring)."""
    nblocks = -(-m // block)
    starts = rng.permutation(nblocks) * block
    lengths = np.minimum(block, m - starts)
    out_starts = np.cumsum(lengths) - lengths
    seq = np.arange(m, dtype=np.int64) + np.repeat(starts - out_starts, lengths)
    bounds = np.append(out_starts[::window], m)  # windows start on block boundaries
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        rng.shuffle(seq[lo:hi])  # shuffles the view in place
    return seq


class EpochOrder:
    """This rank's record order for every epoch, plus the position reached in the current one."""

    def __init__(
        self,
        n: int,
        *,
        batch_size: int,
        shuffle: bool = True,
        order: str = "uniform",
        seed: int = 0,
        block: int | None = None,
        window: int | None = None,
        record_bytes: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        shard_sizes: Sequence[int] | None = None,
        pad: bool = True,
    ) -> None:
        self.n = int_at_least("n (records)", n, 1)
        self.batch_size = int_at_least("batch_size", batch_size, 1)
        self.world_size = int_at_least("world_size", world_size, 1)
        check_order(order)
        self.rank, self.seed = int_at_least("rank", rank, 0), int_at_least("seed", seed, 0)
        if self.rank >= self.world_size:
            raise InvalidArgumentError(f"rank should be in [0, {self.world_size}), found {rank}")
        self.shuffle, self.order, self.drop_last = bool(shuffle), order, bool(drop_last)
        record_bytes = int_at_least("record_bytes", record_bytes, 1, none_ok=True)
        if block is None:
            block = max(1, DEFAULT_BLOCK_BYTES // record_bytes) if record_bytes else _FALLBACK_BLOCK
        self.block = int_at_least("block", block, 1)
        if window is None:
            block_bytes = self.block * record_bytes if record_bytes else DEFAULT_BLOCK_BYTES
            window = max(1, DEFAULT_WINDOW_BYTES // block_bytes)
        self.window = int_at_least("window", window, 1)
        self.pad = bool(pad)
        if not self.pad and (self.drop_last or shard_sizes is not None) and self.world_size > 1:
            what = "drop_last=True drops" if self.drop_last else "shard_local reading may repeat"
            raise InvalidArgumentError(
                f"pad=False visits every record exactly once; {what} some: choose one"
            )
        self.per_rank = self.n // self.world_size if drop_last else -(-self.n // self.world_size)
        self._share = (self.rank * self.per_rank, (self.rank + 1) * self.per_rank)
        if not self.pad:
            w = self.world_size
            self._share = (self.rank * self.n // w, (self.rank + 1) * self.n // w)
            self.per_rank = self._share[1] - self._share[0]
        if self.per_rank == 0 and self.pad:
            raise InvalidArgumentError(
                f"{self.n} records cannot give each of {self.world_size} ranks one with drop_last"
            )
        if self.drop_last and self.per_rank < self.batch_size:
            raise InvalidArgumentError(
                f"batch_size {self.batch_size} with drop_last leaves no batch from "
                f"{self.per_rank} records per rank"
            )
        self.shard_sizes = None if shard_sizes is None else self._check_shards(shard_sizes)
        self._home_cache: list[np.ndarray] | None = None
        self.epoch = 0
        self.batches_done = 0
        self._restored = False  # the next pass continues a loaded state, mid-epoch

    def _check_shards(self, sizes: Sequence[int]) -> np.ndarray:
        arr = np.asarray(sizes)
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu" or (arr < 0).any():
            raise InvalidArgumentError(f"shard_sizes should be counts >= 0, found {list(sizes)!r}")
        if int(arr.sum()) != self.n:
            raise InvalidArgumentError(
                f"shard_sizes add up to {int(arr.sum())}, dataset has {self.n}"
            )
        return arr.astype(np.int64)

    # --- the orders -------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        if self.drop_last:
            return self.per_rank // self.batch_size
        return -(-self.per_rank // self.batch_size)

    def _arrange(self, m: int, rng: np.random.Generator) -> np.ndarray:
        """Positions ``0..m-1`` in this order's sequence."""
        if not self.shuffle or self.order == "sequential":
            return np.arange(m, dtype=np.int64)
        if self.order == "block":
            return block_order(m, rng, self.block, self.window)
        return rng.permutation(m).astype(np.int64, copy=False)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's record indices for ``epoch`` (default: the current one), in order."""
        epoch = self.epoch if epoch is None else int(epoch)
        if self.shard_sizes is not None and self.world_size > 1:
            return self._shard_local(epoch)
        order = self._arrange(self.n, default_rng((self.seed, epoch)))
        if self.pad:
            order = np.resize(order, self.per_rank * self.world_size)  # wraps, or cuts
        return order[self._share[0] : self._share[1]]

    def home_ranks(self) -> np.ndarray:
        """For shard-local order: the rank that owns each shard (fixed for the whole run)."""
        if self.shard_sizes is None:
            raise InvalidArgumentError("home_ranks needs shard_sizes")
        sizes = self.shard_sizes
        middles = 2 * (np.cumsum(sizes) - sizes) + sizes  # twice the middle record's position
        return np.minimum(middles * self.world_size // (2 * self.n), self.world_size - 1)

    def _homes(self) -> list[np.ndarray]:
        if self._home_cache is None:
            by_record = np.repeat(self.home_ranks(), self.shard_sizes)
            self._home_cache = [np.flatnonzero(by_record == r) for r in range(self.world_size)]
        return self._home_cache

    def _shard_local(self, epoch: int) -> np.ndarray:
        rng = default_rng((self.seed, epoch))
        kept, surplus = [], []
        for home in self._homes():
            if self.shuffle:
                home = home[rng.permutation(home.size)]
            kept.append(home[: self.per_rank])
            surplus.append(home[self.per_rank :])
        pool = np.concatenate(surplus)
        needs = [self.per_rank - k.size for k in kept]
        short = sum(needs) - pool.size
        if short > 0:  # padding: wrap around this epoch's own sequence
            pool = np.concatenate([pool, np.resize(np.concatenate([*kept, pool]), short)])
        given = sum(needs[: self.rank])
        mine = np.concatenate([kept[self.rank], pool[given : given + needs[self.rank]]])
        mine.sort()
        local = default_rng((self.seed, epoch, self.rank))
        return mine[self._arrange(mine.size, local)]

    def reads(self) -> np.ndarray:
        """Every record this rank may read in some epoch, sorted (int64): all of them, unless
        shard-local reading keeps the rank on its own shards. Then its home records, plus,
        where its home holds fewer than its share, those of every home with more (their
        surplus is dealt to the ranks that are short); all of them where an epoch pads."""
        share, n = self.per_rank, self.n
        if self.shard_sizes is None or self.world_size == 1 or share * self.world_size > n:
            return np.arange(n, dtype=np.int64)
        homes = self._homes()
        short = homes[self.rank].size < share
        mine = [h for r, h in enumerate(homes) if r == self.rank or (short and h.size > share)]
        return np.sort(np.concatenate(mine)).astype(np.int64)

    def batches(self, epoch: int | None = None, start_batch: int = 0) -> Iterator[np.ndarray]:
        """This rank's batches of ``epoch`` as index arrays, from batch ``start_batch`` on."""
        idx = self.indices(epoch)
        bs = self.batch_size
        for b in range(int(start_batch), len(self)):
            yield idx[b * bs : (b + 1) * bs]

    # --- position and checkpoints ------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch; a no-op for a restored epoch under way.

        Calling it with the epoch a ``load_state_dict`` restored keeps that position, so
        the usual ``for e in range(start, E): loader.set_epoch(e)`` works after a restore.
        """
        epoch = int_at_least("epoch", epoch, 0)
        restored = self._restored and int(epoch) == self.epoch
        if not restored or self.batches_done >= len(self):
            self.epoch, self.batches_done = int(epoch), 0

    def begin_pass(self) -> tuple[int, int]:
        """(epoch, first batch) for the next pass.

        As with a DataLoader, every pass is a whole epoch: one that follows a finished or
        an abandoned pass (``break``, a peek with ``next(iter(loader))``, a sanity check)
        starts the next epoch. Only the first pass after ``load_state_dict`` continues
        mid-epoch, at the next unseen batch.
        """
        if self.batches_done >= len(self) or (self.batches_done and not self._restored):
            self.epoch, self.batches_done = self.epoch + 1, 0
        self._restored = False
        return self.epoch, self.batches_done

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue at the next unseen batch (plain ints and strings).

        Taken after a full epoch, it points at the start of the next one.
        """
        epoch, done = self.epoch, self.batches_done
        if done >= len(self):
            epoch, done = epoch + 1, 0
        state = {"version": _STATE_VERSION, "epoch": epoch, "seed": self.seed}
        state.update(batches_done=done, rank=self.rank)
        state.update({k: getattr(self, k) for k in _CONFIG_KEYS})
        state.update(block=self.block, window=self.window)
        state["shard_sizes"] = None if self.shard_sizes is None else self.shard_sizes.tolist()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; refuse a state saved for a different dataset or layout."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            found = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise InvalidArgumentError(
                f"loader state: expected version {_STATE_VERSION} dict, found {found!r}"
            )
        mine = self.state_dict()
        for key in (*_CONFIG_KEYS, "block", "window", "shard_sizes"):
            theirs = state.get(key)
            if theirs != mine[key]:
                raise InvalidArgumentError(
                    f"loader state: {key} was {theirs!r}, this loader has {mine[key]!r}"
                )
        for key in ("epoch", "batches_done", "seed"):
            int_at_least(f"loader state: {key}", state.get(key), 0)
        if state["batches_done"] > len(self) and not self.pad:
            state = {**state, "batches_done": len(self)}  # rank 0's state, on a shorter share
        if state["batches_done"] > len(self):
            raise InvalidArgumentError(
                f"loader state: batches_done {state['batches_done']} > {len(self)} per epoch"
            )
        self.seed, self.epoch, self.batches_done = (
            state["seed"],
            state["epoch"],
            state["batches_done"],
        )
        self._restored = True
