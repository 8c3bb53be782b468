"""Manifests and shard checks: exact combined stats, relative paths, changed shards, refusals."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import synthetic_records

from imgpack.errors import FormatError
from imgpack.format.index import read_index
from imgpack.format.layout import pack_paths
from imgpack.format.write import write_json_atomic
from imgpack.packer.writer import PackWriter
from imgpack.shards import (
    MANIFEST_FORMAT,
    build_manifest,
    check_shards,
    combine_stats,
    is_manifest,
    open_shards,
    read_manifest,
)

PACKER = {"size": [6, 8], "resize": "stretch", "filter": "bilinear", "source": "src"}
CLASSES = ["a", "b", "c"]


def write_pack(path: Path, pixels, labels, *, classes=CLASSES, packer=PACKER, shard=None) -> Path:
    """A pack of exactly these records (any shape), optionally with the packer's shard field
    (``shard``: (index, count, source files) of a contiguous cut, or the whole field as a dict)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = pixels.shape[1:3]
    with PackWriter(path, height=h, width=w, classes=list(classes)) as wr:
        for i, (px, lab) in enumerate(zip(pixels, labels)):
            wr.append(px, int(lab), f"{classes[lab]}/{path.stem}-{i}.png")
        extra = None
        if isinstance(shard, dict):  # the field exactly as given
            extra = {"shard": shard}
        elif shard is not None:
            i, n, total = shard
            extra = {"shard": {"index": i, "count": n, "source_files": total,
                               "source_range": [i * total // n, (i + 1) * total // n]}}  # fmt: skip
        wr.finish(packer=dict(packer), extra=extra)
    return path


@pytest.fixture
def union():
    """12 records, 8x6, labels 0..2: the whole that shards are cut from."""
    return synthetic_records(12, 8, 6), np.arange(12) % 3


def shards_of(folder: Path, union, n=3, names="s{}.bin", **kw) -> list[Path]:
    px, lab = union
    out = []
    for i in range(n):
        a, b = i * len(px) // n, (i + 1) * len(px) // n
        out.append(write_pack(folder / names.format(i), px[a:b], lab[a:b], shard=(i, n, 12), **kw))
    return out


def read_all(paths):
    return [read_index(p) for p in paths]


def write_manifest(out: Path, paths, **kw) -> Path:
    indexes = read_all(paths)
    check_shards(indexes)
    write_json_atomic(out, build_manifest(out, indexes, **kw))
    return out


# --- stats ------------------------------------------------------------------------------


def test_combined_stats_equal_a_single_pack_of_the_union(tmp_path, union):
    whole = read_index(write_pack(tmp_path / "whole.bin", *union))
    parts = read_all(shards_of(tmp_path / "shards", union))
    combined = combine_stats(parts)
    for key in ("pixels", "sum", "sum_sq"):
        assert combined[key] == whole.raw["stats"][key]  # exact integers
    np.testing.assert_allclose(combined["mean"], whole.mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(combined["std"], whole.std, rtol=0, atol=1e-12)
    # and both are the true population statistics of the pixels on the 0..1 scale
    x = union[0].reshape(-1, 3).astype(np.float64) / 255
    np.testing.assert_allclose(combined["mean"], x.mean(axis=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(combined["std"], x.std(axis=0), rtol=0, atol=1e-12)


# --- manifest files -----------------------------------------------------------------------


def test_manifest_round_trip_with_shards_in_other_folders(tmp_path, union):
    paths = shards_of(tmp_path / "data" / "shards" / "part", union)
    out = tmp_path / "manifests" / "all.manifest.json"
    out.parent.mkdir()
    write_manifest(out, paths)
    raw = json.loads(out.read_text())
    assert raw["format"] == MANIFEST_FORMAT and raw["format_version"] == 1
    assert [s["path"] for s in raw["shards"]] == [f"../data/shards/part/s{i}.bin" for i in range(3)]
    assert [s["count"] for s in raw["shards"]] == [4, 4, 4] and raw["count"] == 12
    assert raw["shards"][1]["shard"]["index"] == 1
    assert raw["classes"] == CLASSES and raw["shape"] == [8, 6, 3] and raw["partial"] is False
    indexes = open_shards(out)
    assert [ix.data_path.resolve() for ix in indexes] == [p.resolve() for p in paths]
    assert [ix.count for ix in indexes] == [4, 4, 4]
    # the whole tree moves together
    shutil.move(tmp_path / "data", tmp_path / "manifests" / "data")
    (tmp_path / "elsewhere").mkdir()
    moved = tmp_path / "elsewhere" / out.name
    shutil.move(out, moved)
    with pytest.raises(
        FormatError, match=r"shard \.\./data/shards/part/s0\.bin: .*s0\.json: index not found"
    ):
        open_shards(moved)


def test_is_manifest_by_name_or_content(tmp_path, union):
    paths = shards_of(tmp_path, union)
    plain = write_manifest(tmp_path / "train.json", paths)
    assert is_manifest(plain) and is_manifest(tmp_path / "x.manifest.json")
    assert not is_manifest(paths[0].with_suffix(".json")) and not is_manifest(paths[0])
    assert not is_manifest(tmp_path / "absent.json")


def edit(path: Path, change) -> Path:
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda r: r["shards"][1].update(path="/s1.bin"), FormatError, r"shard 1 path is '/s1"),
        (lambda r: r["shards"][0].update(path=""), FormatError, r"shard 0 path is '', expected"),
        (lambda r: r["shards"][2].pop("count"), FormatError, r"shard 2 count is missing, expected"),
        (lambda r: r.update(count=13), FormatError, r"count is 13, its shards make 12 \(edited"),
        (lambda r: r.update(shards=[]), FormatError, r"shards is \[\], expected a non-empty list"),
        (lambda r: r.update(format="imgpack"), FormatError, r"format is 'imgpack'"),
        (lambda r: r.update(format_version=2), FormatError, r"upgrade imgpack"),
        (lambda r: r.update(shape=[8, 6]), FormatError, r"shape is \[8, 6\], its shards make"),
        (lambda r: r.update(codec="jpeg"), FormatError, r"codec is 'jpeg', its shards make 'raw'"),
        (lambda r: r.update(partial="no"), FormatError, r"partial is 'no', expected true or false"),
        (lambda r: r.pop("stats"), FormatError, r"^m\.manifest\.json: stats is missing, .{,70}$"),
        (lambda r: r["stats"].pop("sum_sq"), FormatError, r"stats sum_sq is missing, its shards"),
        # a shard entry deleted by hand: the manifest is out of date, not the shards it names
        (lambda r: r["shards"].pop(1), FormatError,
         r"^m\.manifest\.json: shards 1 of 3 of source 'src' missing \(edited\? merge again\)$"),
    ],
)  # fmt: skip
def test_malformed_manifests_are_refused(tmp_path, union, change, error, match):
    out = write_manifest(tmp_path / "m.manifest.json", shards_of(tmp_path, union))
    with pytest.raises(error, match=match):
        open_shards(edit(out, change))


def test_not_json_or_missing(tmp_path):
    bad = tmp_path / "m.manifest.json"
    bad.write_text("{not json")
    with pytest.raises(FormatError, match=r"m\.manifest\.json: invalid JSON at line 1"):
        read_manifest(bad)
    with pytest.raises(FormatError, match="manifest not found"):
        read_manifest(tmp_path / "absent.manifest.json")


def test_a_shard_changed_since_merge_is_noticed(tmp_path, union):
    paths = shards_of(tmp_path, union)
    out = write_manifest(tmp_path / "m.manifest.json", paths)
    # same count and size, other pixels: only the checksums tell
    px, lab = union
    for p in pack_paths(paths[1]):
        p.unlink()
    write_pack(paths[1], px[4:8][::-1].copy(), lab[4:8][::-1], shard=(1, 3, 12))
    with pytest.raises(
        FormatError,
        match=r"shard s1\.bin checksums_crc32 is \d+, the shard has \d+ now.*merge again",
    ):
        open_shards(out)


def test_edited_stats_or_classes_are_noticed(tmp_path, union):
    out = write_manifest(tmp_path / "m.manifest.json", shards_of(tmp_path, union))
    edit(out, lambda r: r["stats"]["sum"].__setitem__(0, 1))
    with pytest.raises(FormatError, match=r"stats sum is \[1, [^{]*its shards make \[\d"):
        open_shards(out)  # the figure edited, not both stats objects whole
    out = write_manifest(out, shards_of(tmp_path, union))
    edit(out, lambda r: r["stats"].update(mean=[0.5, 0.5, 0.5]))
    with pytest.raises(FormatError, match=r"stats mean is \[0\.5, 0\.5, 0\.5\], its shards make"):
        open_shards(out)
    out = write_manifest(out, shards_of(tmp_path, union))
    edit(out, lambda r: r.update(classes=["a", "b", "z"]))
    with pytest.raises(FormatError, match=r"classes is \['a', 'b', 'z'\], its shards make"):
        open_shards(out)


# --- which shards belong together ----------------------------------------------------------


def test_disagreeing_shards_are_refused_with_the_shard_named(tmp_path, union):
    px, lab = union
    good = write_pack(tmp_path / "good.bin", px[:6], lab[:6])
    cases = [
        (write_pack(tmp_path / "big.bin", synthetic_records(3, 9, 6), [0, 1, 2]),
         r"big\.bin: records are 9x6, in .*good\.bin they are 8x6"),
        (write_pack(tmp_path / "cls.bin", px[6:], lab[6:], classes=["a", "x", "c"]),
         r"cls\.bin: class 1 is 'x', in .*good\.bin it is 'b'"),
        (write_pack(tmp_path / "four.bin", px[6:], lab[6:], classes=[*CLASSES, "d"]),
         r"four\.bin: has 4 classes, .*good\.bin has 3"),
        (write_pack(tmp_path / "filt.bin", px[6:], lab[6:], packer={**PACKER, "filter": "lanczos"}),
         r"filt\.bin: packer filter is 'lanczos', in .*good\.bin it is 'bilinear'"),
        (write_pack(tmp_path / "size.bin", px[6:], lab[6:], packer={**PACKER, "size": [8, 6]}),
         r"size\.bin: packer size is \[8, 6\]"),
    ]  # fmt: skip
    for bad, match in cases:
        with pytest.raises(FormatError, match=match):
            check_shards(read_all([good, bad]))
    # a later format version (none exists yet): shards of two versions are not one dataset
    other = dataclasses.replace(read_index(good), raw={**read_index(good).raw,
                                                            "format_version": 4})  # fmt: skip
    with pytest.raises(FormatError, match=r"format_version 4, .*good\.bin has 3"):
        check_shards([read_index(good), other], ["good.bin", "other.bin"])
    with pytest.raises(FormatError, match="no packs given"):
        check_shards([])


def test_a_shard_twice_is_refused(tmp_path, union):
    paths = shards_of(tmp_path / "x", union)
    with pytest.raises(
        FormatError, match=r"s1\.bin: holds the same records as .*s1\.bin \(a shard given twice"
    ):
        check_shards(read_all([*paths, paths[1]]))
    os.symlink(tmp_path / "x", tmp_path / "link")
    link = tmp_path / "link" / "s0.bin"
    with pytest.raises(FormatError, match=r"link/s0\.bin: holds the same records as .*x/s0\.bin"):
        check_shards(read_all([*paths, link]))
    copy = tmp_path / "copy" / "s2.bin"
    copy.parent.mkdir()
    for p in pack_paths(paths[2]):
        shutil.copy(p, copy.parent / p.name)
    with pytest.raises(FormatError, match=r"copy/s2\.bin: holds the same records as"):
        check_shards(read_all([*paths, copy]))


def test_the_same_slice_packed_twice_or_overlapping_shardings_are_refused(tmp_path, union):
    px, lab = union
    paths = shards_of(tmp_path, union)
    again = write_pack(tmp_path / "again.bin", px[4:8][::-1].copy(), lab[4:8], shard=(1, 3, 12))
    with pytest.raises(
        FormatError,
        match=r"again\.bin: holds files 4\.\.8 of source 'src', overlapping files 4\.\.8 in "
        r".*s1\.bin \(merge each shard once",
    ):
        check_shards(read_all([*paths, again]))
    half = write_pack(tmp_path / "half.bin", px[6:], lab[6:], shard=(1, 2, 12))
    with pytest.raises(
        FormatError,
        match=r"half\.bin: holds files 6\.\.12 .* overlapping files 4\.\.8 in .*s1\.bin",
    ):
        check_shards(read_all([*paths[:2], half]))


def test_missing_shards_refused_unless_partial(tmp_path, union):
    paths = shards_of(tmp_path, union)
    with pytest.raises(FormatError, match=r"shards 1 of 3 of source 'src' missing \(pass"):
        check_shards(read_all([paths[0], paths[2]]))
    warnings = check_shards(read_all([paths[2], paths[0]]), allow_partial=True)
    assert warnings == ["partial dataset: shards 1 of 3 of source 'src' missing"]
    assert check_shards(read_all(paths)) == []
    # packs without a shard field (other writers) are only checked for sameness
    px, lab = union
    plain = [write_pack(tmp_path / f"p{i}.bin", px[i::2], lab[i::2], shard=None) for i in (0, 1)]
    assert check_shards(read_all(plain)) == []


def test_checksums_crc32_follows_the_records(tmp_path, union):
    px, lab = union
    a = read_index(write_pack(tmp_path / "a.bin", px[:4], lab[:4]))
    b = read_index(write_pack(tmp_path / "b.bin", px[:4], lab[:4]))
    c = read_index(write_pack(tmp_path / "c.bin", px[1:5], lab[:4]))
    entries = build_manifest(tmp_path / "m.manifest.json", [a, b, c])["shards"]
    crcs = [entry["checksums_crc32"] for entry in entries]
    assert crcs[0] == crcs[1] != crcs[2]


def interleaved(i, n=3, total=12, **more):
    return {
        "index": i,
        "count": n,
        "source_files": total,
        "by": "interleaved",
        "source_stride": [i, n],
        **more,
    }


def test_interleaved_shard_fields(tmp_path, union):
    px, lab = union
    paths = [
        write_pack(tmp_path / f"i{i}.bin", px[i::3], lab[i::3], shard=interleaved(i))
        for i in range(3)
    ]
    assert check_shards(read_all(paths)) == []
    assert check_shards(read_all(paths[:2]), allow_partial=True) == [
        "partial dataset: shards 2 of 3 of source 'src' missing"
    ]
    again = write_pack(tmp_path / "again.bin", px[:2], lab[:2], shard=interleaved(1))
    with pytest.raises(
        FormatError,
        match=r"again\.bin: holds shard 1 of 3 --shard-by interleaved of source 'src', "
        r"overlapping shard 1 of 3 --shard-by interleaved in .*i1\.bin",
    ):
        check_shards(read_all([*paths, again]))
    cut = write_pack(tmp_path / "c.bin", px[8:], lab[8:], shard=(2, 3, 12))  # contiguous
    with pytest.raises(
        FormatError,
        match=r"c\.bin: holds files 8\.\.12 of source 'src', cut another way than shard 1 of 3 "
        r"--shard-by interleaved in .*i1\.bin",
    ):
        check_shards(read_all([*paths[:2], cut]))
    # "by" written out for a contiguous cut means what a missing one means
    explicit = dict(read_all([cut])[0].raw["shard"], by="contiguous")
    cuts = [
        write_pack(
            tmp_path / f"e{i}.bin",
            px[4 * i : 4 * i + 4],
            lab[4 * i : 4 * i + 4],
            shard=dict(explicit, index=i, source_range=[4 * i, 4 * i + 4]),
        )
        for i in range(2)
    ]
    assert check_shards(read_all([*cuts, cut])) == []
    odd = write_pack(tmp_path / "odd.bin", px[:2], lab[:2], shard=interleaved(0, by="striped"))
    with pytest.raises(FormatError, match=r"odd\.bin: shard\.by is 'striped', expected one of"):
        check_shards(read_all([odd]))
