"""EpochOrder: permutations, block locality, distributed shares, shard-local, resumable state."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from imgpack.errors import InvalidArgumentError
from imgpack.reader.order import EpochOrder


def ranks(n, world, **kw):
    return [EpochOrder(n, rank=r, world_size=world, **kw) for r in range(world)]


@pytest.mark.parametrize("order", ["uniform", "block", "sequential"])
def test_every_order_is_a_permutation(order):
    o = EpochOrder(1000, batch_size=32, order=order, block=7, window=3)
    for epoch in range(3):
        np.testing.assert_array_equal(np.sort(o.indices(epoch)), np.arange(1000))


def test_uniform_is_reproducible_by_seed_and_new_each_epoch():
    a = EpochOrder(500, batch_size=10, seed=7)
    b = EpochOrder(500, batch_size=10, seed=7)
    np.testing.assert_array_equal(a.indices(3), b.indices(3))
    assert not np.array_equal(a.indices(0), a.indices(1))
    assert not np.array_equal(a.indices(0), EpochOrder(500, batch_size=10, seed=8).indices(0))
    # the order is a function of (seed, epoch) only: numpy's documented seeding
    expected = np.random.default_rng((7, 3)).permutation(500)
    np.testing.assert_array_equal(a.indices(3), expected)


@pytest.mark.parametrize("order", ["uniform", "block"])
def test_no_shuffle_is_file_order(order):
    o = EpochOrder(100, batch_size=8, shuffle=False, order=order)
    np.testing.assert_array_equal(o.indices(5), np.arange(100))
    np.testing.assert_array_equal(
        EpochOrder(9, batch_size=2, order="sequential").indices(1), range(9)
    )


def test_block_order_with_window_one_reads_whole_blocks_in_turn():
    o = EpochOrder(1003, batch_size=16, order="block", block=10, window=1, seed=1)
    seq = o.indices(0)
    runs = np.split(seq, np.flatnonzero(np.diff(seq // 10)) + 1)
    assert len(runs) == 101  # 100 full blocks and a short one, each read as one run
    for run in runs:
        np.testing.assert_array_equal(np.sort(run), np.arange(run.min(), run.max() + 1))
        assert run.min() % 10 == 0


def test_block_order_keeps_each_window_within_few_blocks_but_still_shuffles():
    block, window = 20, 4
    o = EpochOrder(4000, batch_size=64, order="block", block=block, window=window, seed=2)
    seq = o.indices(0)
    span = block * window
    for lo in range(0, seq.size, span):
        assert np.unique(seq[lo : lo + span] // block).size <= window
    # reads stay near-sequential: sorted, a window is a handful of contiguous runs ...
    window_reads = np.sort(seq[:span])
    assert np.count_nonzero(np.diff(window_reads) != 1) < window
    # ... yet the visit order is random, differs per epoch, and blocks land anywhere
    assert np.mean(np.abs(np.diff(seq)) == 1) < 0.2
    assert not np.array_equal(seq, o.indices(1))
    assert np.unique(seq[:span] // block).max() > window


@pytest.mark.parametrize(
    ("record_bytes", "block", "window"),
    [
        (224 * 224 * 3, 55, 32),  # 8 MiB blocks of 150,528-byte records, 256 MiB windows
        (4096 * 4096 * 3, 1, 5),  # a record larger than a block is a block of its own
        (None, 64, 32),  # record size unknown: 64 records a block
    ],
)
def test_block_defaults_follow_record_size(record_bytes, block, window):
    o = EpochOrder(10_000, batch_size=256, order="block", record_bytes=record_bytes)
    assert (o.block, o.window) == (block, window)


@pytest.mark.parametrize("order", ["uniform", "block"])
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_share_each_epoch_disjointly(order, world, drop_last):
    n = 1001
    shares = [
        o.indices(4)
        for o in ranks(
            n, world, batch_size=8, order=order, block=16, window=2, drop_last=drop_last, seed=5
        )
    ]
    sizes = {s.size for s in shares}
    assert len(sizes) == 1  # every rank runs the same number of steps
    both = np.concatenate(shares)
    values, counts = np.unique(both, return_counts=True)
    if drop_last:
        assert counts.max() == 1 and n - values.size < world
    else:
        assert values.size == n and both.size - n < world  # only wrap-around padding repeats


def test_ranks_cover_exactly_once_when_divisible_and_change_per_epoch():
    a, b = ranks(1200, 2, batch_size=16, seed=3)
    np.testing.assert_array_equal(np.sort(np.r_[a.indices(0), b.indices(0)]), np.arange(1200))
    assert not np.array_equal(a.indices(0), a.indices(1))
    assert a.indices(0).size == 600 and len(a) == 38


def shard_orders(sizes, world, batch_size=8, **kw):
    return ranks(int(sum(sizes)), world, batch_size=batch_size, shard_sizes=sizes, **kw)


def test_shard_local_keeps_exactly_once_and_mostly_home_shards():
    sizes = [300, 120, 500, 80, 260, 340, 200, 400]  # deliberately uneven
    orders = shard_orders(sizes, 3, seed=9)
    owners = orders[0].home_ranks()
    assert np.all(np.diff(owners) >= 0)  # each rank's home is a contiguous range of shards
    home_of = np.repeat(owners, sizes)
    for epoch in range(2):
        shares = [o.indices(epoch) for o in orders]
        assert {s.size for s in shares} == {734}
        both = np.concatenate(shares)
        assert np.unique(both).size == sum(sizes) and both.size - sum(sizes) < 3
        for r, share in enumerate(shares):
            assert np.mean(home_of[share] == r) > 0.75
    assert not np.array_equal(orders[0].indices(0), orders[0].indices(1))


def test_shard_local_with_balanced_shards_never_leaves_home():
    sizes = [250] * 8
    for r, o in enumerate(shard_orders(sizes, 4, order="block", block=10, window=2)):
        share = o.indices(1)
        np.testing.assert_array_equal(np.sort(share), np.arange(r * 500, (r + 1) * 500))


def test_shard_local_drop_last_and_padding():
    sizes = [7, 3, 5]
    for drop_last in (False, True):
        shares = [o.indices(0) for o in shard_orders(sizes, 4, drop_last=drop_last, batch_size=2)]
        both = np.concatenate(shares)
        assert {s.size for s in shares} == {3 if drop_last else 4}
        assert np.unique(both).size == (12 if drop_last else 15)


def test_batches_split_the_rank_share_and_resume_at_a_batch():
    o = EpochOrder(50, batch_size=8, seed=1)
    batches = list(o.batches(2))
    assert len(o) == len(batches) == 7 and batches[-1].size == 2
    np.testing.assert_array_equal(np.concatenate(batches), o.indices(2))
    tail = list(o.batches(2, start_batch=5))
    assert len(tail) == 2 and all(np.array_equal(x, y) for x, y in zip(tail, batches[5:]))
    dropped = EpochOrder(50, batch_size=8, drop_last=True)
    assert len(dropped) == 6 and all(b.size == 8 for b in dropped.batches(0))


def test_epochs_advance_by_themselves_and_set_epoch_keeps_a_restored_position():
    o = EpochOrder(20, batch_size=5)
    assert o.begin_pass() == (0, 0)
    o.batches_done = 4  # a whole epoch consumed
    assert o.begin_pass() == (1, 0)
    o.batches_done = 2  # a pass abandoned after 2 batches
    o.set_epoch(1)  # asked for again: from its first batch, as with a DataLoader
    assert o.begin_pass() == (1, 0)
    o.batches_done = 2
    assert o.begin_pass() == (2, 0)  # an abandoned pass is followed by the next epoch
    o.load_state_dict({**o.state_dict(), "epoch": 1, "consumed": [[1, 5, 2]]})
    o.set_epoch(1)  # the restored epoch, under way: keep the position
    assert o.begin_pass() == (1, 2)
    o.set_epoch(5)
    assert o.begin_pass() == (5, 0)
    o.batches_done = 4
    o.set_epoch(5)  # a finished epoch asked for again is replayed from its start
    assert o.begin_pass() == (5, 0)


def test_state_round_trips_and_is_the_same_for_every_rank():
    a, b = ranks(100, 2, batch_size=10, seed=4)
    a.set_epoch(3)
    a.batches_done = 2
    state = a.state_dict()
    assert {"epoch": 3, "batches_done": 2, "seed": 4}.items() <= state.items()
    assert state["consumed"] == [[2, 10, 2]] and "rank" not in state
    b.load_state_dict(state)  # rank 0's checkpoint restores rank 1
    assert (b.epoch, b.batches_done, b.rank) == (3, 2, 1)
    assert b.state_dict() == state  # every rank's state at one step is the same


@pytest.mark.parametrize(
    "change, match",
    [
        ({"n": 99}, "n was 99"),
        ({"version": 99}, "expected version 2"),
        ({"consumed": [[1, 10, 11]]}, "11 steps done > 10 batches"),
        ({"consumed": [[1, 10]]}, "consumed should be"),
        ({"consumed": [[0, 10, 1]]}, "consumed world_size should be an integer >= 1"),
        ({"epoch": -1}, "epoch should be an integer >= 0"),
        ({"order": "block"}, "order was 'block'"),
        ({"pad": False}, "pad was False"),
        ({"repeat": [2.0]}, "repeat was \\[2.0\\]"),
    ],
)
def test_load_refuses_a_state_of_another_loader(change, match):
    o = EpochOrder(100, batch_size=10)
    state = {**o.state_dict(), **change}
    with pytest.raises(InvalidArgumentError, match=match):
        o.load_state_dict(state)
    assert (o.epoch, o.batches_done) == (0, 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"n": 3, "world_size": 4, "rank": 1, "drop_last": True},
            "leaves no batch from 0 records per rank",
        ),
        ({"n": 10, "batch_size": 11, "drop_last": True}, "leaves no batch"),
    ],
)
def test_arguments_that_rule_each_other_out_are_refused(kwargs, match):
    """(each argument alone is checked where the user gives it: test_loader)"""
    args = {"n": 10, "batch_size": 2, **kwargs}
    with pytest.raises(InvalidArgumentError, match=match):
        EpochOrder(args.pop("n"), **args)


def test_the_order_module_needs_no_torch():
    code = "import sys, imgpack.reader.order; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def resume_chain(n, layouts, **kw):
    """Each record's deliveries in epoch 2 of a job read under ``layouts`` in turn, each
    (world_size, batch_size, steps or None: to the end), every rank of a layout restoring
    the state its predecessor's ranks saved (the same on all of them, checked)."""
    counts, state = np.zeros(n, dtype=np.int64), None
    for world, batch, steps in layouts:
        orders = ranks(n, world, batch_size=batch, seed=3, **kw)
        for o in orders:
            if state is None:
                o.set_epoch(2)
            else:
                o.load_state_dict(state)
        passes = [o.begin_pass() for o in orders]
        lists = [list(o.batches(*p)) if p[0] == 2 else [] for o, p in zip(orders, passes)]
        for o, batches in zip(orders, lists):
            for b in batches[:steps]:
                np.add.at(counts, b, 1)
                o.batches_done += 1
            if steps is None or steps > len(batches):
                o.end_pass()  # its loop asked for more: a shorter share's pass ended
        states = [o.state_dict() for o in orders]
        assert all(s == states[0] for s in states)  # an exact epoch's shorter shares too
        state = states[0]
    return counts


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"pad": False},
        {"drop_last": True},
        {"order": "block"},
        {"shard_sizes": [9, 2, 14, 6, 10]},
    ],  # fmt: skip
    ids=["padded", "exact", "drop_last", "block", "shard_local"],
)
def test_any_chain_of_layouts_reads_each_record_once_up_to_padding(kw):
    rng = np.random.default_rng(0)
    n = 41
    for _ in range(12):
        chain = [(int(w), int(b), int(s)) for w, b, s in rng.integers(1, [6, 5, 4], (3, 3))]
        chain.append((int(rng.integers(1, 6)), int(rng.integers(1, 5)), None))
        counts = resume_chain(n, chain, block=4, window=2, **kw)
        if kw.get("drop_last"):
            assert counts.max() == 1 and n - counts.sum() < 5 * 4 * 2  # cut tails only
        elif kw.get("pad", True):
            # each layout repeats fewer records than it has ranks, and only to pad
            assert counts.min() == 1 and counts.sum() - n < sum(w for w, _, _ in chain), chain
        else:
            assert (counts == 1).all(), chain


def test_mixing_takes_each_packs_share_and_rotates_the_fraction():
    sizes = [10, 7, 3, 0]
    for repeat in ([0.3, 1.0, 2.0, 5.0], [0.7, 0.5, 1.34, 1.0], [0.0, 2.5, 0.34, 0.0]):
        o = EpochOrder(20, batch_size=4, seed=5, repeat=repeat, pack_sizes=sizes)
        takes = [round(r * k) for r, k in zip(repeat, sizes)]
        assert o.per_epoch == sum(takes) and len(o) == -(-sum(takes) // 4)
        total = np.zeros(20, dtype=np.int64)
        for epoch in range(9):
            counts = np.bincount(o.indices(epoch), minlength=20)
            total += counts
            for p, (a, b) in enumerate(zip(np.cumsum([0, *sizes]), np.cumsum(sizes))):
                whole = takes[p] // max(sizes[p], 1)
                assert counts[a:b].sum() == takes[p]
                assert set(counts[a:b].tolist()) <= {whole, whole + 1}  # never more in one epoch
                assert a == b or np.ptp(total[a:b]) <= 1  # none again before all of its pack
    assert not np.array_equal(o.indices(0), o.indices(1))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"repeat": [1, 1]}, "repeat has 2 factors, the dataset has 1 packs"),
        ({"repeat": [0.04]}, "takes no record"),
    ],
)
def test_bad_repeats_are_refused(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        EpochOrder(10, batch_size=2, **kwargs)
