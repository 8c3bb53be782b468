"""Mixing packs by weight, ``OrderOptions(repeat=[...])``: each epoch takes round(r * n) of a
pack's n records, a fraction rotating so that no record comes back before its whole pack has
come, all packs shuffled together; with resume, ranks, elastic resume and every loader mode.

Each record's label is its number in the dataset (``write_packs``), so labels say which
records a batch holds.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from test_elastic import run, write_packs

from imgpack.errors import InvalidArgumentError
from imgpack.format.index import read_index
from imgpack.format.write import write_json_atomic
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.options import DistributedOptions, OrderOptions
from imgpack.shards import build_manifest

BIG, SMALL = 12, 8  # "ImageNet" and "a synthetic pack": records 0..11 and 12..19


@pytest.fixture
def ds(tmp_path):
    return PackedImageDataset(write_packs(tmp_path, [BIG, SMALL]))


def epochs(loader, count):
    """The records of ``count`` whole passes, one list per epoch."""
    return [[i for _, labels in loader for i in labels.tolist()] for _ in range(count)]


def test_a_pack_at_a_quarter_takes_a_new_quarter_each_epoch(ds):
    loader = make_loader(ds, 4, seed=1, order=OrderOptions(repeat=[1.0, 0.25]))
    assert len(loader) == 4  # 12 + 2 records a epoch
    seen = epochs(loader, 8)
    small = [sorted(i for i in e if i >= BIG) for e in seen]
    for e in seen:
        assert sorted(i for i in e if i < BIG) == list(range(BIG))  # the big pack, whole
    assert all(len(s) == 2 for s in small)
    # four epochs take every record of the small pack once, then the rotation starts again
    assert sorted(sum(small[:4], [])) == list(range(BIG, BIG + SMALL))
    assert sorted(sum(small[4:], [])) == list(range(BIG, BIG + SMALL))
    assert small[:4] != small[4:]  # ... in another order
    # shuffled together: the small pack's records are not kept at one end of the epoch
    places = [k for e in seen for k, i in enumerate(e) if i >= BIG]
    assert 0 < np.mean(places) < 13 and min(places) < 6 < max(places)


def test_factors_above_one_repeat_every_record_and_rotate_the_fraction(ds):
    loader = make_loader(ds, 5, seed=2, order=OrderOptions(repeat=[0.5, 2.25]))
    assert len(loader) == 5  # 6 + 18 records
    total = Counter()
    for e, records in enumerate(epochs(loader, 4)):
        counts = Counter(records)
        assert sum(counts[i] for i in range(BIG)) == 6 and max(counts[i] for i in range(BIG)) == 1
        assert {counts[i] for i in range(BIG, BIG + SMALL)} == {2, 3}  # 2 each, 2 a third time
        total.update(records)
        if e % 2 == 1:  # every two epochs, the big pack's half has come round once
            assert {total[i] for i in range(BIG)} == {(e + 1) // 2}
    assert {total[i] for i in range(BIG, BIG + SMALL)} == {9}  # 2.25 x 4 epochs


def test_a_mix_resumes_and_moves_across_ranks_with_each_record_once(ds):
    mix = OrderOptions(repeat=[1.0, 0.25])
    whole = Counter(epochs(make_loader(ds, 2, seed=7, order=mix), 1)[0])
    counts = Counter()
    ranks = [
        make_loader(
            ds,
            2,
            seed=7,
            order=mix,
            pad=False,
            num_workers=n,
            distributed=DistributedOptions(rank=r, world_size=2),
        )  # fmt: skip
        for r, n in enumerate((0, 2))
    ]
    state = run(ranks, counts, 2)
    three = [
        make_loader(
            ds,
            1,
            seed=7,
            order=mix,
            pad=False,
            distributed=DistributedOptions(rank=r, world_size=3),
        )  # fmt: skip
        for r in range(3)
    ]
    run(three, counts, state=state)
    assert counts == whole and len(whole) == 14


def test_a_mix_in_block_order_and_shard_local(ds):
    mix = OrderOptions("block", block=3, window=2, repeat=[0.5, 1.5])
    records = epochs(make_loader(ds, 4, seed=3, order=mix), 1)[0]
    counts = Counter(records)
    assert sum(counts[i] for i in range(BIG)) == 6 and sum(counts.values()) == 18
    local = DistributedOptions(rank=0, world_size=2, shard_local=True)
    one = make_loader(ds, 3, seed=3, order=OrderOptions(repeat=[0.5, 1.5]), distributed=local)
    two = make_loader(ds, 3, seed=3, order=OrderOptions(repeat=[0.5, 1.5]),
                      distributed=DistributedOptions(1, 2, shard_local=True))  # fmt: skip
    both = Counter(epochs(one, 1)[0] + epochs(two, 1)[0])
    assert sum(both.values()) == 18 and sum(both[i] for i in range(BIG)) == 6


def test_a_merged_manifest_mixes_its_packs(tmp_path):
    paths = write_packs(tmp_path, [BIG, SMALL])
    manifest = tmp_path / "train.manifest.json"
    write_json_atomic(manifest, build_manifest(manifest, [read_index(p) for p in paths]))
    ds = PackedImageDataset(manifest)
    loader = make_loader(ds, 4, seed=1, order=OrderOptions(repeat=[0.5, 1.0]))
    (records,) = epochs(loader, 1)
    assert len(loader) == 4 and sorted(records)[6:] == list(range(BIG, BIG + SMALL))


@pytest.mark.parametrize(
    "repeat, match",
    [
        ([1.0], "repeat has 1 factors, the dataset has 2 packs"),
        ([1.0, -0.5], "repeat should be a list of factors >= 0"),
        ([1.0, float("nan")], "repeat should be a list of factors >= 0"),
        ("1,2", "repeat should be a list of factors >= 0"),
        ([0.01, 0.0], r"takes no record of any pack"),
    ],
)
def test_a_wrong_repeat_is_one_line(ds, repeat, match):
    with pytest.raises(InvalidArgumentError, match=match) as err:
        make_loader(ds, 4, order=OrderOptions(repeat=repeat))
    assert "\n" not in str(err.value)


def test_a_record_taken_twice_comes_back_a_pass_later_not_beside_itself(ds):
    """repeat=2 reads the pack twice, pass after pass: not each record twice in a row, which
    put both copies in one batch in file order (shuffle=False) or in one block."""
    plain = make_loader(ds, 4, shuffle=False, order=OrderOptions(repeat=[2.0, 0.5]))
    records = [i for _, labels in plain for i in labels.tolist()]
    rest = records[2 * BIG :]  # the small pack's half, in file order
    assert records[: 2 * BIG] == [*range(BIG), *range(BIG)]
    assert len(rest) == SMALL // 2 and rest == sorted(rest) and min(rest) >= BIG
    mix = OrderOptions("block", block=3, window=1, repeat=[2.0, 0.75])  # 10 blocks of 3
    for _, labels in make_loader(ds, 3, seed=1, order=mix):  # a batch: one block
        assert len(set(labels.tolist())) == 3


def test_a_factor_too_large_to_order_is_one_line(ds):
    with pytest.raises(InvalidArgumentError, match=r"asks .* records an epoch"):
        make_loader(ds, 4, order=OrderOptions(repeat=[1e300, 1]))
