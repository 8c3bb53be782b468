"""Which records each rank reads in each epoch, and in what order: pure numpy, no torch.

An epoch's order is one sequence over the whole job, a function of ``(seed, epoch)`` only:
never of the number of ranks, the batch size, worker processes or threads. So a run can
be reproduced, and resumed mid-epoch on any number of ranks, from the epoch, the seed and
what the job has consumed of that epoch (``state_dict``).

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
    Every rank computes the same sequence and takes its own contiguous share of it
    (contiguous rather than strided, so block order stays local on each rank). Like torch's
    ``DistributedSampler``, the sequence is padded by wrap-around to a multiple of
    ``world_size`` so that all ranks run the same number of steps (a few samples are seen
    twice); with ``drop_last`` the tail is dropped instead (a few are not seen this epoch).
    When ``n`` is a multiple of ``world_size`` every sample is seen exactly once either way.
    With ``pad=False`` (evaluation, exact metrics) nothing is padded or dropped: rank ``r``
    takes positions ``[r*n//W, (r+1)*n//W)``, every record is seen exactly once across
    ranks, and shares differ by at most one record (so ranks may run different numbers of
    batches).

Elastic resume
    A state records what the job consumed of its epoch as one ``[world_size, batch_size,
    steps]`` entry per layout the epoch was read under (usually one): after ``steps`` steps
    every rank has read the first ``steps * batch_size`` records of its share, so the
    states of all ranks at one step are equal. Restored under the same layout, the epoch
    goes on as if never stopped. Under another (other ranks, another batch size), the
    records not yet read, in the sequence's order, are shared out afresh (padded or cut as
    above, over what is left), and the epochs after it are those of a run started on the
    new layout. ``len()`` of a restored epoch stays that of a whole epoch where it can: the
    batches the consumed part stands for are counted as done. (With ``pad=False`` a rank
    whose share ends a batch early saves the job's step until its pass ends, so that its
    state in the last step is the others'; after its loop, it points at the next epoch.)

Mixing (``repeat``)
    One factor per pack: an epoch takes ``round(r * n)`` of a pack's ``n`` records, every
    record ``floor`` of that over ``n`` times, plus a rotating part: consecutive windows of
    a stream of the pack's permutations (``_rotation``), so no record comes back before
    every record of its pack has come. The records taken (each pack's whole passes, then its
    rotating part, each in file order) are ordered together by the order above (``block``
    keeps a pack's neighbours together, and a record's copies apart).

Shard-local (``shard_sizes``)
    For many shards on many nodes: each shard has a fixed *home* rank (shards are dealt out
    as contiguous ranges, by the position of the shard's middle record), so a node needs
    little more than its home shards on local disk. Each epoch, a rank keeps a random
    subset of its home records up to its equal share; the surplus of over-full ranks is
    dealt to the ranks that are short (the only cross-shard reads). Every record is still
    read exactly once per epoch across ranks (up to the padding above). The trade-off: a
    rank sees mostly the same records every epoch, so shards should each hold a mix of
    classes (``pack-images --shard-by interleaved``). Restored on other ranks, the records
    not yet read are dealt out the same way to the new ranks' homes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import InitVar, dataclass
from typing import Any

import numpy as np
from numpy.random import default_rng  # numpy imports its random module on first use: here

from imgpack.errors import InvalidArgumentError

__all__ = ["EpochOrder", "ORDERS", "DEFAULT_BLOCK_BYTES", "check_flag", "int_at_least"]

ORDERS = ("uniform", "block", "sequential")
DEFAULT_BLOCK_BYTES = 8 << 20  # a block: one long sequential read, well past readahead sizes
DEFAULT_WINDOW_BYTES = 256 << 20  # blocks mixed at once: what must stay in the page cache
_FALLBACK_BYTES = DEFAULT_BLOCK_BYTES // 64  # a record's size when unknown: blocks of 64
_MOST_PER_EPOCH = 2**31  # records an epoch takes, repeats included
_STATE_VERSION = 2  # 1: imgpack 0.2's, one layout (world_size, batch_size, batches_done)
# what a saved state must agree on: the records, their sequence and the epoch's tail (not
# the ranks or the batch size: a state restores on any number of ranks, at any batch size)
_CONFIG_KEYS = tuple("n order shuffle drop_last pad block window shard_sizes repeat".split())
_LAYOUT = (("world_size", 1), ("batch_size", 1), ("steps", 0))  # a consumed entry, lowest values
_MIX = 1  # keeps the draws of a mix's rotations apart from those of the epochs' orders


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


@dataclass(eq=False)
class EpochOrder:
    """This rank's record order for every epoch, plus the position reached in the current one.

    Its arguments are checked where the user gives them (``make_loader``, the options
    objects) or derived from the dataset; what only their combination rules out is refused
    here. ``record_bytes``: the records' mean stored size, which the default block and
    window sizes are counted in. ``pack_sizes``: the records of each pack of the dataset, in
    order (default: the ``shard_sizes``, else one pack), which ``repeat`` gives one factor
    each.
    """

    n: int
    batch_size: int
    shuffle: bool = True
    order: str = "uniform"
    seed: int = 0
    block: int | None = None
    window: int | None = None
    record_bytes: InitVar[int | None] = None
    rank: int = 0
    world_size: int = 1
    drop_last: bool = False
    shard_sizes: Sequence[int] | None = None  # kept as a list of ints
    pad: bool = True
    repeat: Sequence[float] | None = None  # kept as a list of floats
    pack_sizes: InitVar[Sequence[int] | None] = None

    def __post_init__(self, record_bytes: int | None, pack_sizes: Sequence[int] | None) -> None:
        self.block = self.block or max(1, DEFAULT_BLOCK_BYTES // (record_bytes or _FALLBACK_BYTES))
        block_bytes = self.block * record_bytes if record_bytes else DEFAULT_BLOCK_BYTES
        self.window = self.window or max(1, DEFAULT_WINDOW_BYTES // block_bytes)
        exact = not self.pad and self.world_size > 1  # every record once across ranks
        if exact and (self.drop_last or self.shard_sizes is not None):
            what = "drop_last=True drops" if self.drop_last else "shard_local reading may repeat"
            raise InvalidArgumentError(
                f"pad=False visits every record exactly once; {what} some: choose one"
            )
        # both kept as plain lists, as a state holds them
        self.shard_sizes = None if self.shard_sizes is None else [int(k) for k in self.shard_sizes]
        self.repeat = None if self.repeat is None else [float(r) for r in self.repeat]
        packs = pack_sizes if pack_sizes is not None else self.shard_sizes
        self._packs = np.asarray([self.n] if packs is None else packs, np.int64)
        factors = (1.0,) * self._packs.size if self.repeat is None else self.repeat
        if len(factors) != self._packs.size:
            raise InvalidArgumentError(
                f"repeat has {len(factors)} factors, the dataset has {self._packs.size} packs"
            )
        takes = [r * k for r, k in zip(factors, self._packs)]
        if sum(takes) >= _MOST_PER_EPOCH:  # an order array that size fills any memory
            raise InvalidArgumentError(
                f"repeat={list(factors)} asks {sum(takes):.3g} records an epoch; "
                f"imgpack orders fewer than {_MOST_PER_EPOCH:,}"
            )
        self._takes = np.array([round(t) for t in takes], dtype=np.int64)
        self.per_epoch = m = int(self._takes.sum())  # records (with repeats) in each epoch
        if m == 0:
            raise InvalidArgumentError(f"repeat={self.repeat} takes no record of any pack")
        if self.drop_last and m // self.world_size < self.batch_size:
            raise InvalidArgumentError(
                f"batch_size {self.batch_size} with drop_last leaves no batch from "
                f"{m // self.world_size} records per rank"
            )
        self._restored = False  # the next pass continues a loaded state, mid-epoch
        self._start(0)

    def _start(self, epoch: int) -> None:
        """Begin ``epoch`` from its first batch, under this loader's layout."""
        self.epoch, self.batches_done = int(epoch), 0
        # the layouts the epoch was read under before this one, [world, batch, steps] each;
        # the records they left; the batches they count for here
        self._before: list[list[int]] = []
        self._left, self._credit = self.per_epoch, 0
        self._ended = False  # end_pass: this rank's pass ran out

    # --- the orders -------------------------------------------------------------------

    def _share(self, m: int, world: int, rank: int) -> int:
        """Records that rank ``rank`` of ``world`` reads of ``m`` (padded, cut or exact)."""
        if self.drop_last:
            return m // world
        if self.pad:
            return -(-m // world)
        return (rank + 1) * m // world - rank * m // world

    def _batches(self, records: int) -> int:
        """Batches of ``records``: whole ones only, with ``drop_last``."""
        return records // self.batch_size if self.drop_last else -(-records // self.batch_size)

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self._credit + self._batches(self._share(self._left, self.world_size, self.rank))

    def _arrange(self, m: int, rng: np.random.Generator) -> np.ndarray:
        """Positions ``0..m-1`` in this order's sequence."""
        if not self.shuffle or self.order == "sequential":
            return np.arange(m, dtype=np.int64)
        if self.order == "block":
            return block_order(m, rng, self.block, self.window)
        return rng.permutation(m).astype(np.int64, copy=False)

    def _rotation(self, p: int, q: int, epoch: int) -> np.ndarray:
        """This epoch's ``q`` records of pack ``p`` (``0 < q < size``), in pack numbering.

        The pack's permutations, one after another, make a stream cut in windows of ``w =
        min(q, size - q)`` records, one per epoch, which the epoch takes (``q <= size/2``)
        or leaves (then it takes the rest): so no record is taken twice, or left out twice,
        before every one has been. Where a window spans two permutations, its part in the
        second skips the records of its part in the first (moving them just behind it), so
        no record is taken twice in one epoch; ``w <= size/2`` keeps that move away from
        the records the next window spanning two permutations reads of this one.
        """
        size = int(self._packs[p])
        w, random = min(q, size - q), self.shuffle and self.order != "sequential"

        def cycle(c: int, fix: bool = True) -> np.ndarray:
            if not random:
                return np.arange(size, dtype=np.int64)
            out = default_rng((self.seed, _MIX, p, c)).permutation(size)
            t = c * size % w  # records of the window spanning permutations c - 1 and c
            if fix and c and t:
                head, tail = out[:w], cycle(c - 1, fix=False)[size - t :]
                first = np.flatnonzero(~np.isin(head, tail))[: w - t]
                out[:w] = np.concatenate([head[first], np.delete(head, first)])
            return out

        c, j = divmod(epoch * w, size)
        window = cycle(c)[j : j + w]
        if window.size < w:
            window = np.concatenate([window, cycle(c + 1)[: w - window.size]])
        return window if q == w else np.setdiff1d(np.arange(size), window)

    def _sequence(self, epoch: int) -> np.ndarray:
        """The epoch's records: each pack's share (``repeat``), pass after pass in file order
        (two copies of a record side by side would share a batch or a block); then, unless
        ranks read shard-local (they arrange their own shares), in this order's sequence."""
        parts, starts = [], np.cumsum(self._packs) - self._packs
        for p, (start, size, take) in enumerate(zip(starts, self._packs, self._takes)):
            whole, q = divmod(int(take), int(size)) if size else (0, 0)
            parts.append(start + np.tile(np.arange(size, dtype=np.int64), whole))
            if q:
                parts.append(start + np.sort(self._rotation(p, q, epoch)))
        ids = np.concatenate(parts)  # without repeat: every record once, in file order
        if self.shard_sizes is not None:
            return ids
        return ids[self._arrange(ids.size, default_rng((self.seed, epoch)))]

    def _shares(self, epoch: int, seq: np.ndarray, rest: np.ndarray, world: int) -> list:
        """Each of ``world`` ranks' positions in ``seq``, out of ``rest`` (the positions
        not read yet, ascending)."""
        m = rest.size
        if self.shard_sizes is None:  # contiguous shares of the rest, wrapped or cut to size
            cuts = np.cumsum([0, *(self._share(m, world, r) for r in range(world))])
            return np.split(np.resize(rest, cuts[-1]), cuts[1:-1])
        per = self._share(m, world, 0)
        rng = default_rng((self.seed, epoch))
        if world == 1:
            return [rest[self._arrange(m, rng)]]
        home = np.repeat(self.home_ranks(world), self.shard_sizes)[seq[rest]]
        cuts = np.cumsum(np.bincount(home, minlength=world))[:-1]
        groups = np.split(rest[np.argsort(home, kind="stable")], cuts)
        if self.shuffle:
            groups = [group[rng.permutation(group.size)] for group in groups]
        kept = [group[:per] for group in groups]
        pool = np.concatenate([group[per:] for group in groups])  # the surplus
        needs = [per - k.size for k in kept]
        short = sum(needs) - pool.size
        if short > 0:  # padding: wrap around this epoch's own sequence
            pool = np.concatenate([pool, np.resize(np.concatenate([*kept, pool]), short)])
        given, out = np.cumsum([0, *needs]), []
        for r, k in enumerate(kept):
            mine = np.sort(np.concatenate([k, pool[given[r] : given[r + 1]]]))
            out.append(mine[self._arrange(mine.size, default_rng((self.seed, epoch, r)))])
        return out

    def _rest(self, epoch: int, seq: np.ndarray, before: list) -> np.ndarray:
        """The positions of ``seq`` the layouts ``before`` left unread, ascending."""
        rest = np.arange(seq.size, dtype=np.int64)
        for world, batch, steps in before:
            shares = self._shares(epoch, seq, rest, world)
            most = max(-(-len(s) // batch) for s in shares)
            if steps > most:  # a state no loader could have saved: refused, not read as "all"
                raise InvalidArgumentError(
                    f"loader state: consumed {[world, batch, steps]} takes more steps than the "
                    f"{most} batches left of epoch {epoch} on {world} ranks"
                )
            rest = np.setdiff1d(rest, np.concatenate([s[: steps * batch] for s in shares]))
        return rest

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's record indices for ``epoch`` (default: the current one), in order:
        for a restored epoch, those it has left."""
        epoch = self.epoch if epoch is None else int(epoch)
        seq = self._sequence(epoch)
        rest = self._rest(epoch, seq, self._before if epoch == self.epoch else [])
        return seq[self._shares(epoch, seq, rest, self.world_size)[self.rank]]

    def home_ranks(self, world: int | None = None) -> np.ndarray:
        """For shard-local order: the rank that owns each shard (fixed for the whole run),
        on ``world`` ranks (default: this loader's)."""
        world, sizes = world or self.world_size, self.shard_sizes
        middles = 2 * (np.cumsum(sizes) - sizes) + sizes  # twice the middle record's position
        return np.minimum(middles * world // (2 * self.n), world - 1)

    def reads(self) -> np.ndarray:
        """Every record this rank may read in some epoch, sorted (int64): all of them, unless
        shard-local reading keeps the rank on its own shards. Then its home records, plus,
        where its home holds fewer than its share, those of every home with more (their
        surplus is dealt to the ranks that are short); all of them where an epoch pads.
        A restored epoch adds what it has left for this rank."""
        m, world = self.per_epoch, self.world_size
        share = self._share(m, world, 0)
        if self.shard_sizes is None or world == 1 or share * world > m:
            return np.arange(self.n, dtype=np.int64)
        homes = self.home_ranks()
        counts = np.bincount(homes, weights=self._takes, minlength=world)
        short = counts[self.rank] < share
        shards = (homes == self.rank) | (short & (counts[homes] > share))
        mine = np.flatnonzero(np.repeat(shards, self.shard_sizes))
        return np.union1d(mine, self.indices()) if self._before else mine

    def batches(self, epoch: int, start_batch: int = 0) -> Iterator[np.ndarray]:
        """This rank's batches of ``epoch`` as index arrays, from batch ``start_batch`` on."""
        idx, bs = self.indices(epoch), self.batch_size
        first = self._credit if epoch == self.epoch else 0  # a restored epoch's batches
        for b in range(max(int(start_batch), first), first + self._batches(idx.size)):
            yield idx[(b - first) * bs : (b - first + 1) * bs]

    # --- position and checkpoints ------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch; a no-op for a restored epoch under way.

        Calling it with the epoch a ``load_state_dict`` restored keeps that position, so
        the usual ``for e in range(start, E): loader.set_epoch(e)`` works after a restore.
        """
        epoch = int_at_least("epoch", epoch, 0)
        if not (self._restored and epoch == self.epoch):  # even with nothing left of it here
            self._start(epoch)

    def begin_pass(self) -> tuple[int, int]:
        """(epoch, first batch) for the next pass.

        As with a DataLoader, every pass is a whole epoch: one that follows a finished or
        an abandoned pass (``break``, a peek with ``next(iter(loader))``, a sanity check)
        starts the next epoch. Only the first pass after ``load_state_dict`` continues
        mid-epoch, at the next unseen batch (an empty pass where a restore on other ranks
        left this one nothing of that epoch).
        """
        if self._ended or (self.batches_done and not self._restored):
            self._start(self.epoch + 1)
        self._restored = False
        return self.epoch, self.batches_done

    def end_pass(self) -> None:
        """The loop asked past this rank's last batch: its epoch is over, even where other
        ranks (the longer shares of an exact epoch) have a step left."""
        self._ended = True

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue at the next unseen batch (plain ints and strings),
        the same on every rank at one step (see Elastic resume in the module docstring).

        Taken after a full epoch, it points at the start of the next one. ``batches_done``
        is this loader's count, for the reader of a checkpoint: ``consumed`` is the position.
        """
        epoch, done, consumed = self.epoch, self.batches_done, [*self._before]
        steps, world = done - self._credit, self.world_size
        # the job's steps: those of the longest share (the last rank's, in an exact epoch)
        most = self._credit + self._batches(self._share(self._left, world, world - 1))
        if self._ended or done >= most:
            epoch, done, consumed = epoch + 1, 0, []
        elif steps:
            consumed.append([world, self.batch_size, steps])
        state = {"version": _STATE_VERSION, "epoch": epoch, "seed": self.seed, "batches_done": done}
        state.update(consumed=consumed, **{k: copy.copy(getattr(self, k)) for k in _CONFIG_KEYS})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``, saved on any number of ranks at any batch size; refuse
        a state saved for a different dataset, sequence or tail."""
        version = state.get("version") if isinstance(state, dict) else type(state).__name__
        if version not in (1, _STATE_VERSION):
            raise InvalidArgumentError(
                f"loader state: expected version {_STATE_VERSION} dict, found {version!r}"
            )
        if version == 1:  # imgpack 0.2's: one layout, the same sequence as this one's
            steps = [state.get(k) for k in ("world_size", "batch_size", "batches_done")]
            state = {**state, "repeat": None, "consumed": [steps] if steps[2] else []}
        mine = self.state_dict()
        for key in _CONFIG_KEYS:
            if state.get(key) != mine[key]:
                raise InvalidArgumentError(
                    f"loader state: {key} was {state.get(key)!r}, this loader has {mine[key]!r}"
                )
        epoch = int_at_least("loader state: epoch", state.get("epoch"), 0)
        seed = int_at_least("loader state: seed", state.get("seed"), 0)
        consumed = state.get("consumed")
        layouts = consumed if isinstance(consumed, list) else [None]
        if not all(isinstance(c, (list, tuple)) and len(c) == 3 for c in layouts):
            raise InvalidArgumentError(
                f"loader state: consumed should be [world, batch, steps] lists, found {consumed!r}"
            )
        before = [
            [int_at_least(f"loader state: consumed {k}", v, low) for (k, low), v in zip(_LAYOUT, c)]
            for c in consumed
        ]
        steps = 0
        if before and before[-1][:2] == [self.world_size, self.batch_size]:
            steps = before.pop()[2]  # the same layout: it goes on where it stopped
        new = copy.copy(self)  # a refused state leaves this loader as it was
        new.seed, new._restored = seed, True
        new._start(epoch)
        new._before = [c for c in before if c[2]]
        if new._before:
            new._left = new._rest(epoch, new._sequence(epoch), new._before).size
            whole = self._batches(self._share(self.per_epoch, self.world_size, 0))
            left = self._batches(self._share(new._left, self.world_size, 0))
            new._credit = max(0, whole - left)
        new.batches_done = new._credit + steps
        if new.batches_done > len(new):
            raise InvalidArgumentError(
                f"loader state: {steps} steps done > {len(new)} batches per epoch"
            )
        self.__dict__.update(vars(new))
