"""Parquet files in the Hub's layout as a source: columns, class names, null and bad rows."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest
from conftest import records
from decoded import decode_image
from make_sources import encoded, hf_metadata, samples, write_parquet

from imgpack.errors import MissingExtraError, SourceError
from imgpack.packer.decode import DecodeSettings
from imgpack.packer.pack import pack_folder
from imgpack.packer.sources import parquet as parquet_module
from imgpack.packer.sources.parquet import ParquetSource
from imgpack.packer.sources.source import Part

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SIZE = (16, 12)
NAMES = ["zebra", "ant", "moth"]  # the dataset's own order, not sorted


def pack(src, out, **kw):
    return pack_folder(src, out, size=SIZE, workers=kw.pop("workers", 1), **kw)


def test_class_names_come_from_the_huggingface_metadata_in_its_order(tmp_path):
    first, second = samples(5), samples(3, first=5)
    write_parquet(tmp_path / "d" / "train-00001-of-00002.parquet", second, names=NAMES)
    write_parquet(tmp_path / "d" / "train-00000-of-00002.parquet", first, names=NAMES)
    out = tmp_path / "p.bin"
    pack(str(tmp_path / "d" / "train-*.parquet"), out, workers=2)
    pix, labels, paths, _, index = records(out)
    assert index.classes == tuple(NAMES)
    assert paths == [f"train-00000-of-00002.parquet:{r}" for r in range(5)] + [
        f"train-00001-of-00002.parquet:{r}" for r in range(3)
    ]  # rows numbered within their file, across its row groups of 4
    assert labels.tolist() == [lab for _, lab, _ in first + second]
    settings = DecodeSettings(*SIZE)
    for k, (_, _, data) in enumerate(first + second):
        assert np.array_equal(pix[k], decode_image(data, settings))
    packer = index.raw["packer"]
    assert (packer["image_column"], packer["label_column"]) == ("image", "label")


def test_without_metadata_the_classes_are_numbers_or_the_given_list(tmp_path):
    rows = samples(4)
    path = write_parquet(tmp_path / "x.parquet", rows, metadata={})
    pack(path, tmp_path / "p.bin")
    assert records(tmp_path / "p.bin")[4].classes == ("0", "1", "2")
    listed = tmp_path / "classes.txt"
    listed.write_text("a\nb\nc\nd\n")
    pack(path, tmp_path / "q.bin", classes_from=listed)
    _, labels, _, _, index = records(tmp_path / "q.bin")
    assert index.classes == ("a", "b", "c", "d") and labels.tolist() == [0, 1, 2, 0]


def test_classes_from_maps_the_names_to_the_list(tmp_path):
    path = write_parquet(tmp_path / "val.parquet", samples(3), names=NAMES)
    listed = tmp_path / "train.txt"
    listed.write_text("ant\nmoth\nzebra\n")
    pack(path, tmp_path / "p.bin", classes_from=listed)
    _, labels, _, _, index = records(tmp_path / "p.bin")
    assert index.classes == ("ant", "moth", "zebra") and labels.tolist() == [2, 0, 1]
    listed.write_text("ant\nzebra\n")
    with pytest.raises(SourceError, match=r"val.parquet:2: class 'moth' is not in "
                       r"train.txt \(2 classes\); use --on-error skip"):  # fmt: skip
        pack(path, tmp_path / "q.bin", classes_from=listed)
    summary = pack(path, tmp_path / "q.bin", classes_from=listed, on_error="skip")
    assert summary.skipped == [
        {"path": "val.parquet:2", "reason": "class 'moth' is not in train.txt"}
    ]


def test_null_undecodable_and_unlabelled_rows_are_skipped_with_file_and_row(tmp_path):
    import pyarrow as pa

    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    good = encoded(1)
    images = pa.array(
        [{"bytes": good, "path": "a.jpg"}, None, {"bytes": None, "path": "b.jpg"},
         {"bytes": b"junk", "path": "c.jpg"}, {"bytes": good, "path": "d.jpg"},
         {"bytes": good, "path": None}],
        kind,
    )  # fmt: skip
    labels = pa.array([0, 1, 1, 1, None, 1], pa.int64())
    table = pa.table({"image": images, "label": labels}).replace_schema_metadata(
        hf_metadata(["a", "b"])
    )
    pq.write_table(table, tmp_path / "x.parquet", row_group_size=2)
    out = tmp_path / "p.bin"
    summary = pack(tmp_path / "x.parquet", out, workers=2)
    _, got, paths, _, _ = records(out)
    assert paths == ["x.parquet:0", "x.parquet:5"] and got.tolist() == [0, 1]
    reasons = {s["path"]: s["reason"] for s in summary.skipped}
    assert reasons == {
        "x.parquet:1": "image is null",
        "x.parquet:2": "image bytes are null (the row names 'b.jpg', which is not in the file)",
        "x.parquet:3": "cannot identify image file (no image format Pillow reads matches its "
        "contents)",
        "x.parquet:4": "no label (null)",
    }
    # --on-error fail stops at the first bad row in row order: one found when its image is
    # read (row 1) before one known bad from the listing (row 4), with any worker count...
    for workers in (1, 2):
        with pytest.raises(SourceError, match=r"^x.parquet:1: image is null \(--on-error fail"):
            pack(tmp_path / "x.parquet", tmp_path / "q.bin", on_error="fail", workers=workers)
    # ... and one known from the listing where it comes first (rows 4 and 5: shard 2 of 3)
    with pytest.raises(SourceError, match=r"^x.parquet:4: no label \(null\) \(--on-error fail"):
        pack(tmp_path / "x.parquet", tmp_path / "q.bin", on_error="fail", num_shards=3,
             shard_index=2)  # fmt: skip
    assert not (tmp_path / "q.bin").exists() and not (tmp_path / "q.bin.partial").exists()


def test_the_label_column_is_label_or_named_or_none(tmp_path):
    rows = samples(3)
    path = write_parquet(tmp_path / "x.parquet", rows, names=NAMES)
    table = pq.read_table(path).rename_columns(["image", "fine_label"])
    table = table.append_column("coarse", pa.array([0, 0, 1], pa.int8()))
    pq.write_table(table.replace_schema_metadata(None), path)
    with pytest.raises(SourceError, match=r"x.parquet: label column 'label' is not there; name "
                       r"the label column with --label-column \(integer columns here: fine_label, "
                       r"coarse\), "
                       r"or pack them without labels with --labels none$"):  # fmt: skip
        pack(path, tmp_path / "p.bin")
    pack(path, tmp_path / "p.bin", label_column="coarse")
    assert records(tmp_path / "p.bin")[1].tolist() == [0, 0, 1]
    pack(path, tmp_path / "q.bin", label_column="none")
    _, labels, _, _, index = records(tmp_path / "q.bin")
    assert labels.tolist() == [-1, -1, -1] and index.classes == ()
    with pytest.raises(SourceError, match="label column 'nope' \\(--label-column\\) is not there"):
        pack(path, tmp_path / "r.bin", label_column="nope")
    with pytest.raises(
        SourceError,
        match=r"label column 'image' \(--label-column\) holds struct<bytes: binary, path: string>",
    ):  # the column is there: its type is what is wrong
        pack(path, tmp_path / "r.bin", label_column="image")


def test_the_image_column_is_found_by_its_type(tmp_path):
    rows = samples(2)
    plain = write_parquet(tmp_path / "plain.parquet", rows, names=None, metadata={}, struct=False)
    pack(plain, tmp_path / "p.bin")  # a binary column named anything
    assert records(tmp_path / "p.bin")[4].count == 2
    table = pq.read_table(plain)
    two = table.append_column("mask", table.column("image")).rename_columns(["a", "label", "b"])
    pq.write_table(two, tmp_path / "two.parquet")
    with pytest.raises(SourceError, match=r"two.parquet: 2 image columns \(a, b\): name one with "
                       r"--image-column"):  # fmt: skip
        pack(tmp_path / "two.parquet", tmp_path / "q.bin")
    pack(tmp_path / "two.parquet", tmp_path / "q.bin", image_column="b")
    with pytest.raises(
        SourceError, match=r"no image column 'label' \(--image-column: binary, .*its columns: a \("
    ):
        pack(tmp_path / "two.parquet", tmp_path / "q.bin", image_column="label", force=True)
    none = pa.table({"text": ["x"], "label": [0]})
    pq.write_table(none, tmp_path / "none.parquet")
    with pytest.raises(SourceError, match=r"none.parquet: no image column \(binary, or a struct "
                       r"with a binary 'bytes' field\); its columns: text \(string\), label "
                       r"\(int64\)$"):  # fmt: skip
        pack(tmp_path / "none.parquet", tmp_path / "r.bin")


def test_a_file_that_is_no_parquet_or_disagrees_is_one_line(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"PAR1 but no more")
    with pytest.raises(SourceError, match=r"x.parquet: not a Parquet file \("):
        pack(tmp_path / "x.parquet", tmp_path / "p.bin")
    write_parquet(tmp_path / "d" / "a.parquet", samples(2), names=["x", "y"])
    write_parquet(tmp_path / "d" / "b.parquet", samples(2), names=["y", "x"])
    with pytest.raises(SourceError, match=r"b.parquet: its class names differ from .*a.parquet"):
        pack(tmp_path / "d" / "*.parquet", tmp_path / "q.bin")
    bad = {"huggingface": "{not json"}
    write_parquet(tmp_path / "e.parquet", samples(2), metadata=bad)
    with pytest.raises(
        SourceError, match="e.parquet: its 'huggingface' schema metadata is not JSON$"
    ):
        pack(tmp_path / "e.parquet", tmp_path / "q.bin")
    for k, text in enumerate(("null", "[1, 2]")):  # JSON with no features: found by type
        write_parquet(tmp_path / f"g{k}.parquet", samples(2), metadata={"huggingface": text})
        assert pack(tmp_path / f"g{k}.parquet", tmp_path / "g.bin", force=True).count == 2
    write_parquet(tmp_path / "f.parquet", samples(2), names=["x", "x"])
    with pytest.raises(SourceError, match="f.parquet: the ClassLabel of 'label' has no list"):
        pack(tmp_path / "f.parquet", tmp_path / "q.bin")


def test_every_row_without_a_label_says_how_to_pack_unlabelled(tmp_path):
    rows = [(k, -1, data) for k, _, data in samples(3)]  # the Hub's test splits: label -1
    path = write_parquet(tmp_path / "test.parquet", rows, names=NAMES)
    said = r"test.parquet:0: no sample has a label \(this one: label -1\); pack them without "
    with pytest.raises(SourceError, match=said + "labels with --labels none$"):
        pack(path, tmp_path / "p.bin")
    assert pack(path, tmp_path / "p.bin", label_column="none").count == 3


def test_without_pyarrow_the_error_names_the_extra(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "x.parquet", samples(1))
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import raises ImportError
    with pytest.raises(MissingExtraError) as err:
        pack(path, tmp_path / "p.bin")
    assert str(err.value) == "reading Parquet files needs pyarrow: pip install imgpack[parquet]"


def test_rows_are_read_row_group_by_row_group(tmp_path, monkeypatch):
    """Never a whole file: a decoding process reads each row group it decodes rows of once,
    whole; the parent reads no image. A run's cut of the rows (a shard, a resumed run)
    reads only the row groups that hold them."""
    rows = samples(12)
    path = write_parquet(tmp_path / "x.parquet", rows, names=NAMES, row_group=4)
    source = ParquetSource([str(path)], ["x.parquet"], tmp_path)
    assert source.listing().files[5] == ("x.parquet:5", 2) and source.unit_size == 4
    read = []
    real = pq.ParquetFile.iter_batches

    def spy(self, *a, row_groups, **kw):
        read.extend(row_groups)
        return real(self, *a, row_groups=row_groups, **kw)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    monkeypatch.setattr(pq.ParquetFile, "read", None)  # a whole file: never
    payloads = list(source.feed([1, 6, 7, 11]))
    assert payloads == [Part((0, 0), 1), Part((0, 1), 2), Part((0, 1), 3), Part((0, 2), 3)]
    assert read == []  # the parent reads nothing
    fetch = pickle.loads(pickle.dumps(source))  # as a spawned worker gets it
    assert [fetch(p) for p in payloads] == [rows[k][2] for k in (1, 6, 7, 11)]
    assert read == [0, 1, 2]


def test_a_row_group_too_large_for_one_process_is_read_by_the_parent(tmp_path, monkeypatch):
    rows = samples(12)
    path = write_parquet(tmp_path / "x.parquet", rows, names=NAMES, row_group=6)
    whole = pack(path, tmp_path / "whole.bin", workers=2)
    monkeypatch.setattr(parquet_module, "_UNIT_ROWS", 5)  # every row group is too large
    source = ParquetSource([str(path)], ["x.parquet"], tmp_path)
    assert list(source.feed([1, 6, 7, 11])) == [rows[k][2] for k in (1, 6, 7, 11)]
    assert source.unit_size == 1
    streamed = pack(path, tmp_path / "streamed.bin", workers=2)
    assert streamed.count == whole.count == 12
    assert (tmp_path / "streamed.bin").read_bytes() == (tmp_path / "whole.bin").read_bytes()


def test_a_file_is_pinned_by_its_size_and_footer_not_its_time(tmp_path):
    import os
    import shutil

    rows = samples(8)
    path = write_parquet(tmp_path / "a" / "x.parquet", rows, names=NAMES, row_group=4)
    shutil.copy(path, tmp_path / "x.parquet")
    os.utime(tmp_path / "x.parquet", ns=(10**18, 10**18))

    def identity(where):
        return ParquetSource([str(where)], ["x.parquet"], where.parent).identity()

    (pinned,) = identity(path)["sources"]
    assert identity(tmp_path / "x.parquet") == {"sources": [pinned]}
    assert pinned[:2] == ["x.parquet", path.stat().st_size]
    write_parquet(path, rows, names=NAMES, row_group=2)  # the same rows, cut otherwise
    assert identity(path)["sources"][0][2] != pinned[2]


def test_a_process_keeps_a_row_group_as_arrow_and_copies_out_one_image_at_a_time(
    tmp_path, monkeypatch
):
    """What a decoding process holds: one row group's image column as pyarrow read it,
    through a small buffer, and no second copy of it as Python bytes."""
    import os
    import tracemalloc

    rows = [(f"k{i}", 0, os.urandom(1 << 20)) for i in range(4)]  # 1 MB "images"
    path = write_parquet(tmp_path / "x.parquet", rows, names=NAMES, row_group=4)
    source = ParquetSource([str(path)], ["x.parquet"], tmp_path)
    source.listing()  # reads the labels only
    buffers, real_init = [], pq.ParquetFile.__init__

    def init(self, *a, buffer_size=0, **kw):
        buffers.append(buffer_size)
        real_init(self, *a, buffer_size=buffer_size, **kw)

    monkeypatch.setattr(pq.ParquetFile, "__init__", init)
    payloads = list(source.feed(range(4)))
    fetch = source
    tracemalloc.start()
    try:
        first = fetch(payloads[0])
        held = tracemalloc.get_traced_memory()[0] - len(first)
    finally:
        tracemalloc.stop()
    assert first == rows[0][2] and held < 1 << 20  # not the other 3 MB as bytes
    assert [fetch(p) for p in payloads] == [data for _, _, data in rows]
    assert buffers and min(buffers) > 0
    monkeypatch.setattr(parquet_module, "_UNIT_ROWS", 2)  # read by the parent, in batches
    parent = ParquetSource([str(path)], ["x.parquet"], tmp_path)
    assert list(parent.feed(range(4))) == [data for _, _, data in rows]


@pytest.mark.skipif(sys.platform == "win32", reason="forked workers see the spy")
def test_a_row_group_is_read_once_per_chunk_of_its_rows(tmp_path, monkeypatch):
    """What the parquet module says: once when its rows are one chunk; a run that cuts a row
    group into chunks (here: 4 chunks per process) may read it once per chunk."""
    log = tmp_path / "reads.log"
    real = parquet_module.read_rows

    def spy(path, group, column, batch):
        with open(log, "a") as f:
            f.write(f"{group}\n")
        return real(path, group, column, batch)

    monkeypatch.setattr(parquet_module, "read_rows", spy)
    for per_group, most in [(4, 1), (8, 2)]:
        log.write_text("")
        path = write_parquet(tmp_path / f"x{per_group}.parquet", samples(32), row_group=per_group)
        pack(path, tmp_path / f"p{per_group}.bin", workers=2)  # chunks of 4 rows
        reads = log.read_text().split()
        groups = 32 // per_group
        assert sorted(set(reads)) == [str(g) for g in range(groups)]
        assert all(reads.count(str(g)) <= most for g in range(groups))
