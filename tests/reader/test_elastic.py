"""Elastic resume as a training job meets it: a loader state saved on W ranks restores on W'
ranks, at another batch size, in another loader mode; every record of the epoch is delivered
exactly once over the whole run (pad=False), or at least once with only the padding repeated
(pad=True), and the epochs after it are those of a run started on W' ranks.

Ranks are simulated with ``DistributedOptions(rank=, world_size=)`` over real loaders; each
record's label is its number in the dataset, so a batch's labels say which records it holds.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from conftest import synthetic_records

from imgpack.errors import InvalidArgumentError
from imgpack.packer.writer import PackWriter
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.options import DistributedOptions, OrderOptions

N = 30  # records in the dataset below: 12 + 10 + 8


def write_packs(folder, sizes, h=4, w=3):
    """Packs of distinct records whose labels number them across all the packs."""
    total = sum(sizes)
    classes = [f"c{i:03d}" for i in range(total)]
    pixels = synthetic_records(total, h, w)
    paths, start = [], 0
    for k, count in enumerate(sizes):
        path = folder / f"p{k}.bin"
        with PackWriter(path, height=h, width=w, classes=classes) as out:
            for i in range(start, start + count):
                out.append(pixels[i], i, f"{classes[i]}/{i}.png")
            out.finish(packer={"size": [w, h], "resize": "stretch", "filter": "bilinear"})
        paths.append(path)
        start += count
    return paths


@pytest.fixture
def ds(tmp_path):
    return PackedImageDataset(write_packs(tmp_path, [12, 10, 8]))


def ranks(ds, world, batch, shard_local=False, **kw):
    """One loader per rank, as each of ``world`` processes would make it."""
    return [
        make_loader(
            ds,
            batch,
            seed=7,
            distributed=DistributedOptions(rank=r, world_size=world, shard_local=shard_local),
            **kw,
        )  # fmt: skip
        for r in range(world)
    ]


def run(loaders, counts, steps=None, state=None):
    """Every rank restores ``state`` (if any) and takes ``steps`` batches (None: to the end
    of its epoch), counting each record delivered; returns the state of rank 0, after
    checking that every rank's is the same."""
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
    passes = [iter(loader) for loader in loaders]
    taken = 0
    while steps is None or taken < steps:
        batches = [next(p, None) for p in passes]
        if all(b is None for b in batches):
            break
        for b in batches:
            if b is not None:
                counts.update(b[1].tolist())
        taken += 1
    for p in passes:
        p.close()
    states = [loader.state_dict() for loader in loaders]
    assert all(s == states[0] for s in states)
    for loader in loaders:
        loader.close()
    return states[0]


def epoch_of(loaders):
    """Each rank's records, in order, over one whole pass."""
    return [[i for _, labels in loader for i in labels.tolist()] for loader in loaders]


def at_epoch(loaders, epoch):
    for loader in loaders:
        loader.set_epoch(epoch)
    return loaders


@pytest.mark.parametrize(
    "before, after, steps",
    [((4, 2), (2, 3), 2), ((2, 3), (3, 2), 3), ((3, 2), (1, 5), 2), ((4, 1), (4, 3), 3)],
    ids=["4to2", "2to3", "3to1", "batch1to3"],
)
@pytest.mark.parametrize("pad", [False, True], ids=["exact", "padded"])
def test_a_state_restores_on_other_ranks_with_every_record_accounted_for(
    ds, before, after, steps, pad
):
    counts = Counter()
    state = run(ranks(ds, *before, pad=pad), counts, steps)
    assert (state["epoch"], state["consumed"]) == (0, [[*before, steps]])
    assert sum(counts.values()) == before[0] * before[1] * steps  # no padding read yet
    later = ranks(ds, *after, pad=pad)
    assert run(later, counts, state=state)["epoch"] == 1
    rest = N - before[0] * before[1] * steps
    padding = -(-rest // after[0]) * after[0] - rest if pad else 0
    assert sorted(counts) == list(range(N))
    assert sum(counts.values()) == N + padding  # repeats: only those the padding needs
    if not pad:
        assert set(counts.values()) == {1}
    # the next epoch: that of a run started on the new ranks
    assert epoch_of(later) == epoch_of(at_epoch(ranks(ds, *after, pad=pad), 1))


@pytest.mark.parametrize(
    "mode_before, mode_after",
    [
        ({"num_workers": 2}, {}),
        ({}, {"num_workers": 0}),
        ({}, {"device": "cpu", "resident": True}),
        ({"device": "cpu", "resident": True}, {"num_workers": 1}),
    ],
    ids=["workers-to-inprocess", "inprocess-to-workers0", "to-resident", "resident-to-workers"],
)
def test_the_rest_of_the_epoch_is_delivered_once_in_any_loader_mode(ds, mode_before, mode_after):
    counts = Counter()
    state = run(ranks(ds, 2, 4, pad=False, **mode_before), counts, 2)
    run(ranks(ds, 3, 2, pad=False, **mode_after), counts, state=state)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}


@pytest.mark.parametrize("resident", [False, True], ids=["streamed", "resident"])
@pytest.mark.parametrize(
    "before, after", [((3, 2), (2, 3)), ((2, 3), (3, 2))], ids=["3to2", "2to3"]
)
def test_shard_local_ranks_resumed_on_other_ranks_read_the_rest_once(ds, before, after, resident):
    """Three packs of 12, 10 and 8 records: the records left are dealt out to the new ranks'
    homes, some ranks taking others' surplus (a resident rank then holds those too)."""
    kw = {"device": "cpu", "resident": True} if resident else {}
    counts = Counter()
    state = run(ranks(ds, *before, shard_local=True, **kw), counts, 2)
    assert sum(counts.values()) == 12 and max(counts.values()) == 1
    later = ranks(ds, *after, shard_local=True, **kw)
    run(later, counts, state=state)
    rest, world = N - 12, after[0]
    assert sorted(counts) == list(range(N))
    assert sum(counts.values()) == N + (-(-rest // world) * world - rest)
    fresh = at_epoch(ranks(ds, *after, shard_local=True), 1)
    assert epoch_of(later) == epoch_of(fresh)


def test_a_restore_on_the_same_ranks_continues_the_same_batches(ds):
    """The layout unchanged, the rest of the epoch is batch for batch an uninterrupted run's."""
    whole = epoch_of(ranks(ds, 2, 3))
    counts = Counter()
    state = run(ranks(ds, 2, 3), counts, 2)
    restored = ranks(ds, 2, 3)
    for loader in restored:
        loader.load_state_dict(state)
    assert epoch_of(restored) == [share[6:] for share in whole]


def test_a_state_of_imgpack_0_2_restores_too(ds):
    """Version 1 states (imgpack 0.2) named their one layout; they restore on any ranks."""
    counts = Counter()
    new = run(ranks(ds, 2, 4, pad=False), counts, 2)
    old = {k: v for k, v in new.items() if k not in ("consumed", "repeat")}
    old.update(version=1, rank=0, world_size=2, batch_size=4, batches_done=2)
    run(ranks(ds, 3, 3, pad=False), counts, state=old)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}
    same = ranks(ds, 2, 4, pad=False)  # on its own ranks: the batches 0.2 would have read
    for loader in same:
        loader.load_state_dict(old)
    assert epoch_of(same) == [share[8:] for share in epoch_of(ranks(ds, 2, 4, pad=False))]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"order": OrderOptions("block")}, "order was 'uniform', this loader has 'block'"),
        ({"shuffle": False}, "shuffle was True"),
        ({"distributed": DistributedOptions(0, 2, shard_local=True)}, "shard_sizes was None"),
        ({"order": OrderOptions(repeat=[1, 1, 2])}, r"repeat was None, this loader has \[1.0"),
        ({"drop_last": True}, "drop_last was False"),
    ],
)
def test_a_change_that_cannot_be_honoured_is_refused_in_one_line(ds, change, match):
    counts = Counter()
    state = run(ranks(ds, 2, 4), counts, 1)
    kw = {"seed": 7, "distributed": DistributedOptions(rank=0, world_size=3), **change}
    other = make_loader(ds, 2, **kw)
    with pytest.raises(InvalidArgumentError, match=match) as err:
        other.load_state_dict(state)
    assert "\n" not in str(err.value)
    assert (other.epoch, other.batches_done) == (0, 0)


def test_the_states_batches_done_and_len_stay_a_whole_epochs(ds):
    """After a restore on other ranks, len() stays that of a whole epoch and the consumed
    part counts as batches done, so progress reads as it would have."""
    counts = Counter()
    state = run(ranks(ds, 4, 2), counts, 2)  # 16 of 30 consumed
    loader = ranks(ds, 2, 2)[1]
    loader.load_state_dict(state)
    assert len(loader) == 8 and loader.batches_done == 4  # 7 records each left: 4 batches
    left = [b[1].tolist() for b in loader]
    assert len(left) == 4 and loader.state_dict()["epoch"] == 1
    assert np.isin(sum(left, []), list(counts)).sum() == 0


def test_an_exact_epochs_shorter_ranks_save_the_jobs_step_until_their_pass_ends(ds):
    """pad=False, 30 records on 4 ranks of batch 7: shares of 7, 8, 7, 8 records, so ranks 0
    and 2 read one batch, ranks 1 and 3 two. After step 1 every rank's state (rank 0's, the
    one a job usually saves) is the job's: restored on 2 ranks, each record once."""
    counts = Counter()
    loaders = ranks(ds, 4, 7, pad=False)
    assert [len(loader) for loader in loaders] == [1, 2, 1, 2]
    state = run(loaders, counts, 1)  # checks that every rank's state is the same
    assert (state["epoch"], state["consumed"]) == (0, [[4, 7, 1]])
    run(ranks(ds, 2, 3, pad=False), counts, state=state)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}
    short = ranks(ds, 4, 7, pad=False)[0]
    assert len(list(short)) == 1 and short.state_dict()["epoch"] == 1  # its pass has ended


def test_a_rank_left_nothing_by_a_restore_reads_nothing_more_of_that_epoch(ds):
    """28 of 30 records read on 4 ranks; on 3 ranks rank 0 has none of the 2 left. The usual
    loop, ``set_epoch`` included, neither replays the epoch there nor skips the next one."""
    counts = Counter()
    state = run(ranks(ds, 4, 7, pad=False), counts, 1)
    later = ranks(ds, 3, 1, pad=False)
    seen = [[] for _ in later]
    for r, loader in enumerate(later):
        loader.load_state_dict(state)
        for epoch in range(loader.epoch, 2):
            loader.set_epoch(epoch)
            seen[r].append([i for _, labels in loader for i in labels.tolist()])
    assert [len(s[0]) for s in seen] == [0, 1, 1]
    counts.update(i for s in seen for i in s[0])
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}
    assert [s[1] for s in seen] == epoch_of(at_epoch(ranks(ds, 3, 1, pad=False), 1))


def test_a_state_with_more_steps_than_its_epoch_holds_is_refused(ds):
    (loader,) = ranks(ds, 1, 4, shuffle=False)
    state = loader.state_dict()
    state["consumed"] = [[2, 4, 100]]  # 800 positions of a 30-record epoch
    with pytest.raises(InvalidArgumentError, match=r"consumed \[2, 4, 100\] takes more steps"):
        loader.load_state_dict(state)
    assert [len(labels) for _, labels in loader][:1] == [4]  # untouched: epoch 0 from the start
