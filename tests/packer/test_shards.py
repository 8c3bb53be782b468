"""--shard-by interleaved: every N-th file per shard, every class in each; the default kept."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from conftest import interrupt_after, records, write_image

from imgpack.errors import PackError
from imgpack.packer import discover
from imgpack.packer.journal import journal_path
from imgpack.packer.pack import pack_folder
from imgpack.packer.writer import partial_path
from imgpack.shards import shard_slice

SIZE = (12, 10)
N = 4


@pytest.fixture
def src(tmp_path):
    """Three classes of 5, 6 and 10 files (one of them broken): 21 files, every class >= N."""
    root = tmp_path / "src"
    seed = 0
    for cls, n in (("ant", 5), ("bee", 6), ("cow", 9)):
        for i in range(n):
            write_image(root / cls / f"{i:02d}.jpg", 30, 24, seed=seed)
            seed += 1
    (root / "cow" / "04b.jpg").write_bytes(b"not a jpeg")  # a skip inside one shard
    return root


def pack(src, out, **kw):
    out.parent.mkdir(parents=True, exist_ok=True)
    return pack_folder(src, out, size=SIZE, progress=False, **{"workers": 1, **kw})


def test_interleaved_shards_hold_every_nth_file_and_together_the_whole_pack(src, tmp_path):
    whole = tmp_path / "whole.bin"
    pack(src, whole)
    wpix, wlab, wpaths, wcrc, wix = records(whole)
    by_path = {p: k for k, p in enumerate(wpaths)}
    listing = [rel for rel, _ in discover.discover(src).files]
    assert len(listing) == 21
    crcs, skipped, sums = [], [], np.zeros((2, 3), dtype=object)
    for i in range(N):
        out = tmp_path / "shards" / f"s{i}.bin"
        pack(src, out, workers=2, num_shards=N, shard_index=i, shard_by="interleaved")
        pix, lab, paths, crc, ix = records(out)
        assert ix.raw["shard"] == {"index": i, "count": N, "source_files": 21,
                                   "by": "interleaved", "source_stride": [i, N]}  # fmt: skip
        assert ix.classes == wix.classes
        skips = [s["path"] for s in ix.raw["skipped"]]
        assert paths == [p for p in listing[i::N] if p not in skips]  # files i, i+N, ...
        for k, p in enumerate(paths):  # the very record the whole pack holds for that file
            np.testing.assert_array_equal(pix[k], wpix[by_path[p]], err_msg=p)
            assert lab[k] == wlab[by_path[p]]
        assert set(lab) == {0, 1, 2}, f"shard {i} lacks a class"
        crcs += crc.tolist()
        skipped += skips
        sums += np.array([ix.raw["stats"]["sum"], ix.raw["stats"]["sum_sq"]], dtype=object)
    assert Counter(crcs) == Counter(wcrc.tolist())  # the union, as a multiset, is the whole pack
    assert sorted(skipped) == [s["path"] for s in wix.raw["skipped"]] == ["cow/04b.jpg"]
    assert sums.tolist() == [wix.raw["stats"]["sum"], wix.raw["stats"]["sum_sq"]]


def test_contiguous_shards_of_this_folder_miss_classes(src, tmp_path):
    """Why interleaving exists: the default cut gives a shard only the classes of its run."""
    out = tmp_path / "c0.bin"
    pack(src, out, num_shards=N, shard_index=0)
    _, lab, _, _, ix = records(out)
    assert set(lab) == {0}
    # no "by": contiguous packs are written exactly as before --shard-by existed
    assert ix.raw["shard"] == {"index": 0, "count": N, "source_files": 21, "source_range": [0, 5]}


@pytest.mark.parametrize("workers", [2, 3])
def test_interleaved_shard_is_byte_identical_whatever_the_workers(src, tmp_path, workers):
    outs = []
    for w in (1, workers):
        out = tmp_path / f"w{w}" / "s1.bin"
        pack(src, out, workers=w, num_shards=N, shard_index=1, shard_by="interleaved")
        outs.append(out)
    for suffix in (".bin", ".json"):
        assert outs[0].with_suffix(suffix).read_bytes() == outs[1].with_suffix(suffix).read_bytes()


def test_one_interleaved_shard_is_the_default_pack(src, tmp_path):
    a, b = tmp_path / "a" / "p.bin", tmp_path / "b" / "p.bin"
    pack(src, a)
    pack(src, b, shard_by="interleaved")  # one shard of one: the whole listing either way
    for suffix in (".bin", ".json"):
        assert a.with_suffix(suffix).read_bytes() == b.with_suffix(suffix).read_bytes()


def test_shard_slices_partition_the_list():
    for total in (0, 1, 7, 100):
        for n in (1, 2, 3, 8):
            for by in ("contiguous", "interleaved"):
                taken = [k for i in range(n) for k in range(total)[shard_slice(total, n, i, by)]]
                assert sorted(taken) == list(range(total)), (total, n, by)
            assert [shard_slice(total, n, i).step for i in range(n)] == [None] * n  # contiguous
    assert list(range(10)[shard_slice(10, 4, 1, "interleaved")]) == [1, 5, 9]


def test_an_unknown_scheme_is_refused_before_anything_is_written(src, tmp_path):
    out = tmp_path / "p.bin"
    with pytest.raises(ValueError, match="shard_by must be one of contiguous, interleaved"):
        pack(src, out, num_shards=2, shard_by="striped")
    assert list(tmp_path.iterdir()) == [src]


def stopped_run(src, out, monkeypatch, n, **kw):
    """Start a pack and stop it (as Ctrl-C would) after ``n`` records."""
    restore = interrupt_after(monkeypatch, n + 1)
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, **kw)
    restore()


def test_resume_refuses_another_shard_by_and_loses_nothing(src, tmp_path, monkeypatch):
    out = tmp_path / "run" / "s0.bin"
    cut = {"num_shards": 2, "shard_index": 0}  # 11 files either way: only the scheme differs
    stopped_run(src, out, monkeypatch, 4, shard_by="interleaved", **cut)
    before = (partial_path(out).read_bytes(), journal_path(out).read_bytes())
    with pytest.raises(
        PackError, match=r'settings differ: --shard-by "interleaved" then, "contiguous" now'
    ):
        pack(src, out, resume=True, **cut)
    assert (partial_path(out).read_bytes(), journal_path(out).read_bytes()) == before
    summary = pack(src, out, resume=True, workers=2, shard_by="interleaved", **cut)
    assert summary.resumed == 4
    fresh = tmp_path / "fresh" / "s0.bin"
    pack(src, fresh, shard_by="interleaved", **cut)
    for suffix in (".bin", ".json"):
        assert out.with_suffix(suffix).read_bytes() == fresh.with_suffix(suffix).read_bytes()
