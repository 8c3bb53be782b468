"""Packing from a labels file: only listed files, missing ones reported, target vectors stored."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import records, write_image

from imgpack.errors import SourceError
from imgpack.format.index import read_index
from imgpack.packer.cli import main
from imgpack.packer.pack import pack_folder


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="pack-images")


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "imgs"
    for i in range(6):
        write_image(root / ("a" if i % 2 else "b") / f"{i}.jpg", 20, 16, seed=i)
    (root / "unlisted.png").write_bytes(b"never looked at")
    return root


def test_only_listed_files_in_row_order_with_targets(src, tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text(
        "path,label,targets\n"
        "b/4.jpg,dog,1 0 0.5\n"
        "a/1.jpg,cat,0;1;0\n"
        "a/9.jpg,cat,1 1 1\n"  # listed, not there: skipped and reported
        "b/0.jpg,dog,0 0 2.25\n"
    )
    out = tmp_path / "p.bin"
    summary = pack_folder(src, out, size=(8, 8), workers=2, labels=labels)
    _, lab, paths, _, index = records(out)
    assert paths == ["b/4.jpg", "a/1.jpg", "b/0.jpg"] and lab.tolist() == [1, 0, 1]
    assert list(index.classes) == ["cat", "dog"]
    assert index.target_vectors().tolist() == [[1, 0, 0.5], [0, 1, 0], [0, 0, 2.25]]
    assert summary.skipped == [
        {"path": "a/9.jpg", "reason": "listed in labels.csv line 4, not found"}
    ]
    assert (
        index.raw["packer"]["labels"] == "file"
        and index.raw["packer"]["labels_file"] == "labels.csv"
    )
    assert index.raw["excluded"] == []  # SRC is not walked: only the list counts


def test_jsonl_labels_with_a_class_list_and_shards(src, tmp_path):
    labels = tmp_path / "l.jsonl"
    rows = [f'{{"path": "{c}/{i}.jpg", "label": {i % 3}, "targets": [{i}]}}' for i, c in
            zip(range(6), "babababa")]  # fmt: skip
    labels.write_text("\n".join(rows) + "\n")
    names = tmp_path / "classes.txt"
    names.write_text("x\ny\nz\n")
    out = tmp_path / "s1.bin"
    pack_folder(src, out, size=(8, 8), workers=1, labels=labels, classes_from=names,
                num_shards=2, shard_index=1, shard_by="interleaved")  # fmt: skip
    _, lab, paths, _, index = records(out)
    assert paths == ["a/1.jpg", "a/3.jpg", "a/5.jpg"] and lab.tolist() == [1, 0, 2]
    assert list(index.classes) == ["x", "y", "z"]
    assert index.target_vectors().ravel().tolist() == [1, 3, 5]


def test_shards_list_each_missing_file_once_and_an_empty_slice_merges(src, tmp_path):
    """8 shards of 5 listed files (2 not there): each missing file is skipped by the shard
    that holds it, the 3 empty slices are valid empty packs, and `merge` takes all 8."""
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label\nb/0.jpg,dog\ngone1.jpg,cat\na/1.jpg,cat\nb/2.jpg,dog\n"
                      "gone2.jpg,dog\n")  # fmt: skip
    shards = []
    for k in range(8):
        out = tmp_path / f"s{k}.bin"
        done = run(src, out, "--size", "8", "--labels", labels, "--num-shards", 8,
                   "--shard-index", k, "--quiet")  # fmt: skip
        assert done.exit_code == 0, done.output
        shards.append(out)
    merged = run("merge", tmp_path / "all.manifest.json", *shards)
    assert merged.exit_code == 0, merged.output
    skipped = [s["path"] for out in shards for s in read_index(out).raw["skipped"]]
    assert sorted(skipped) == ["gone1.jpg", "gone2.jpg"]
    assert sum(read_index(out).count for out in shards) == 3
    assert json.loads((tmp_path / "all.manifest.json").read_text())["count"] == 3


def test_bad_rows_stop_before_anything_is_written(src, tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label,targets\nb/0.jpg,dog,1 2\na/1.jpg,cat,3\n")
    out = tmp_path / "p.bin"
    with pytest.raises(
        SourceError, match=r"labels.csv: line 3: 1 target values, line 2 has 2 \(same K per row\)"
    ):
        pack_folder(src, out, size=(8, 8), workers=1, labels=labels)
    labels.write_text("path,label\nb/0.jpg,dog\na/7.jpg,cat\n")
    with pytest.raises(SourceError, match=r"a/7.jpg: listed in labels.csv line 3, not found"):
        pack_folder(src, out, size=(8, 8), workers=1, labels=labels, on_error="fail")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs", "labels.csv"]


def test_cli_labels_file_messages_and_exit_codes(src, tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label\nb/0.jpg,dog\nb/2.jpg,\n")
    out = tmp_path / "p.bin"
    bad = run(src, out, "--labels", labels)
    assert bad.exit_code == 1 and bad.stderr == (
        "pack-images: error: labels.csv: line 3: label is '', expected a class name or an integer\n"
    )
    labels.write_text("path,label\nb/0.jpg,dog\nb/2.jpg,cat\nzz.jpg,cat\n")
    done = run(src, out, "--labels", labels, "--size", "8")
    assert done.exit_code == 0, done.output
    assert (
        "packed 2 images" in done.stderr
        and "skipped: zz.jpg (listed in labels.csv line 4" in done.stderr
    )
    unknown = run(src, tmp_path / "q.bin", "--labels", "labels.txt")
    assert unknown.exit_code == 2 and "expected folders, none, or a labels file" in unknown.stderr
    missing = run(src, tmp_path / "q.bin", "--labels", tmp_path / "nope.jsonl")
    assert (
        missing.exit_code == 1
        and "nope.jsonl: cannot read the labels file (No such" in missing.stderr
    )


def test_reader_yields_target_vectors(src, tmp_path):
    torch = pytest.importorskip("torch")
    from imgpack import PackedImageDataset

    labels = tmp_path / "labels.csv"
    labels.write_text("path,label,targets\nb/0.jpg,0,0.5 1\na/1.jpg,1,-1 3\n")
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(8, 8), workers=1, labels=labels)
    ds = PackedImageDataset(out)
    np.testing.assert_array_equal(ds.target_vectors, np.array([[0.5, 1], [-1, 3]], np.float32))
    assert ds[1][1] == 1 and torch.is_tensor(ds[1][0]) and ds.classes == ["0", "1"]
    assert read_index(out).target_vectors().dtype == np.float32


def test_targets_come_from_one_place(src, tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label,targets\nb/0.jpg,dog,1\n")
    with pytest.raises(ValueError, match="labels.csv has a targets column: pass no targets="):
        pack_folder(src, tmp_path / "p.bin", labels=labels, targets={"b/0.jpg": [1.0]})
    labels.write_text("path,label\nb/0.jpg,dog\na/1.jpg,cat\n")
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(4, 4), workers=1, labels=labels,
                targets={"b/0.jpg": [1.0, 2.0], "a/1.jpg": [3.0, 4.0]})  # fmt: skip
    assert read_index(out).target_vectors().tolist() == [[1, 2], [3, 4]]
