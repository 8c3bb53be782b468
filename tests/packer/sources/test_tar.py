"""WebDataset tar shards as a source: keys, images, labels, bad samples, damaged shards."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import records
from decoded import decode_image
from make_sources import encoded, samples, shard, write_tar

from imgpack.errors import SourceError
from imgpack.packer.decode import DecodeSettings
from imgpack.packer.pack import pack_folder
from imgpack.packer.sources.source import Skip
from imgpack.packer.sources.tar import TarSource

SIZE = (16, 12)


def pack(src, out, **kw):
    return pack_folder(src, out, size=SIZE, workers=kw.pop("workers", 1), **kw)


def test_keys_follow_webdataset(tmp_path):
    image = encoded(1)
    members = [("n0144/10026.jpg", image), ("n0144/10026.cls", b"0"), ("a.seg.png", image),
               ("a.jpg", image), ("a.cls", b"1"), ("dir.v2/x.cls", b"0"), ("dir.v2/x.jpg", image),
               ("README", b"x"), ("a.b/c", b"x")]  # fmt: skip
    path = write_tar(tmp_path / "x.tar", members)
    listing = TarSource([str(path)], ["x.tar"], tmp_path).listing()
    # a key runs up to the FIRST dot of the base name: a.seg.png is sample a's, no image
    assert listing.files == [("x.tar:n0144/10026", 0), ("x.tar:a", 1), ("x.tar:dir.v2/x", 0)]
    assert [name for name, _ in listing.excluded] == ["x.tar:README", "x.tar:a.b/c"]


def test_one_record_per_key_in_tar_order(tmp_path):
    rows = [("zeta", 1, encoded(1)), ("alpha", 0, encoded(2)), ("mid/k", 2, encoded(3))]
    members = []
    for key, label, data in rows:  # tar order, not sorted; extra members are ignored
        members += [(f"{key}.jpg", data), (f"{key}.cls", f" {label}\n".encode())]
        members.append((f"{key}.json", b'{"caption": "x"}'))
    write_tar(tmp_path / "s" / "train-0.tar", members + [("__index__", b"x"), ("notes", b"")])
    out = tmp_path / "p.bin"
    summary = pack(tmp_path / "s" / "train-0.tar", out)
    pix, labels, paths, _, index = records(out)
    assert paths == ["train-0.tar:zeta", "train-0.tar:alpha", "train-0.tar:mid/k"]
    assert labels.tolist() == [1, 0, 2] and index.classes == ("0", "1", "2")
    assert summary.skipped == [] and index.raw["packer"]["source_kind"] == "tar"
    assert index.raw["excluded"] == [
        {"path": "train-0.tar:notes", "reason": "no extension, so no sample's member "
         "(WebDataset names them key.ext)"}
    ] and index.raw["excluded_hidden"] == 1  # fmt: skip
    settings = DecodeSettings(*SIZE)
    for k, (_, _, data) in enumerate(rows):
        assert np.array_equal(pix[k], decode_image(data, settings))


def test_members_in_directory_order_are_grouped_by_key_across_the_shard(tmp_path):
    # plain `tar cf` writes a folder's files in directory order: a key's members apart
    rows = samples(3)
    sorted_shard = shard(tmp_path / "sorted" / "x.tar", rows)
    members = [(f"{key}.cls", str(label).encode()) for key, label, _ in rows]
    members += [(f"{key}.jpg", data) for key, _, data in reversed(rows)]
    write_tar(tmp_path / "scattered" / "x.tar", members)
    for folder in ("sorted", "scattered"):
        summary = pack(tmp_path / folder / "x.tar", tmp_path / f"{folder}.bin")
        assert summary.count == 3 and summary.skipped == []
    a, b = records(tmp_path / "sorted.bin"), records(tmp_path / "scattered.bin")
    assert a[2] == b[2] == ["x.tar:s0000", "x.tar:s0001", "x.tar:s0002"]  # first seen
    assert np.array_equal(a[0], b[0]) and a[1].tolist() == b[1].tolist() == [0, 1, 2]
    assert sorted_shard.exists()


def test_a_key_whose_members_come_twice_is_a_duplicate_listed_once(tmp_path):
    members = [("a.jpg", encoded(1)), ("a.cls", b"0"), ("b.jpg", encoded(2)), ("b.cls", b"1"),
               ("a.jpg", encoded(3)), ("a.cls", b"2")]  # fmt: skip
    path = write_tar(tmp_path / "dupkey.tar", members)
    summary = pack(path, tmp_path / "p.bin")
    _, labels, paths, _, _ = records(tmp_path / "p.bin")
    assert paths == ["dupkey.tar:b"] and labels.tolist() == [1]
    assert summary.skipped == [
        {"path": "dupkey.tar:a", "reason": "a duplicate key: member 'a.jpg' appears twice in "
         "the shard"}
    ]  # fmt: skip


def test_members_that_belong_to_no_sample_are_listed_not_lost(tmp_path):
    import io
    import tarfile

    path = write_tar(tmp_path / "x.tar", [("a.jpg", encoded(1)), ("a.cls", b"0"),
                                          ("README", b"x"), (".DS_Store", b""),
                                          ("__index__", b"")])  # fmt: skip
    with tarfile.open(path, "a") as tar:
        link = tarfile.TarInfo("b.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, "a.jpg"
        tar.addfile(link)
        folder = tarfile.TarInfo("sub")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        big = tarfile.TarInfo("c.cls")
        big.size = (1 << 20) + 1
        tar.addfile(big, io.BytesIO(b" " * big.size))
        tar.addfile(tarfile.TarInfo("c.jpg"), io.BytesIO(b""))
    out = tmp_path / "p.bin"
    summary = pack(path, out)
    _, _, paths, _, index = records(out)
    assert paths == ["x.tar:a"]
    assert index.raw["excluded"] == [
        {"path": "x.tar:README", "reason": "no extension, so no sample's member (WebDataset "
         "names them key.ext)"},
        {"path": "x.tar:b.jpg", "reason": "not a regular file (a symlink)"},
    ]  # fmt: skip
    assert index.raw["excluded_hidden"] == 2  # .DS_Store and WebDataset's __index__
    assert summary.skipped == [
        {"path": "x.tar:c", "reason": "label member 'c.cls' too large (1,048,577 bytes; at "
         "most 1 MB)"}
    ]  # fmt: skip
    lines = "\n".join(summary.lines())
    assert "left out: 1 (no extension), 1 not a regular file; see p.json 'excluded'" in lines


def test_labels_only_in_json_suggest_label_key(tmp_path):
    members = [("a.jpg", encoded(1)), ("a.json", b'{"y": 1}')]
    path = write_tar(tmp_path / "x.tar", members)
    with pytest.raises(SourceError) as err:
        pack(path, tmp_path / "p.bin")
    assert str(err.value) == (
        "x.tar:a: no sample has a label (this one: no label (no .cls or .label member; name its "
        ".json's key with --label-key)); pack them without labels with --labels none"
    )
    pack(path, tmp_path / "p.bin", label_key="y")


def test_the_image_is_the_first_member_with_one_image_extension(tmp_path):
    webp, jpg = encoded(1, fmt="WEBP"), encoded(2)
    members = [("k.json", b"{}"), ("k.seg.png", encoded(3, fmt="PNG")), ("k.webp", webp),
               ("k.jpg", jpg), ("k.cls", b"0")]  # fmt: skip
    path = write_tar(tmp_path / "a.tar", members)
    pack(path, tmp_path / "p.bin")
    pix, *_ = records(tmp_path / "p.bin")
    assert np.array_equal(pix[0], decode_image(webp, DecodeSettings(*SIZE)))


def test_bad_samples_are_skipped_and_listed_with_shard_and_key(tmp_path):
    good = encoded(1)
    members = [
        ("a.jpg", good), ("a.cls", b"1"),
        ("b.cls", b"0"),  # no image
        ("c.jpg", good), ("c.cls", b"cat"),  # a label that does not parse
        ("d.jpg", b"\xff\xd8\xff\xe0 not really a jpeg"), ("d.cls", b"0"),
        ("e.jpg", good),  # no label
        ("f.jpg", good), ("f.jpg", good), ("f.cls", b"0"),  # a member twice
        ("g.png", encoded(2, fmt="PNG")), ("g.cls", b"0"),
    ]  # fmt: skip
    path = write_tar(tmp_path / "x.tar", members)
    out = tmp_path / "p.bin"
    summary = pack(path, out, workers=2)
    _, labels, paths, _, _ = records(out)
    assert paths == ["x.tar:a", "x.tar:g"] and labels.tolist() == [1, 0]
    reasons = {s["path"]: s["reason"] for s in summary.skipped}
    assert list(reasons) == ["x.tar:b", "x.tar:c", "x.tar:d", "x.tar:e", "x.tar:f"]
    assert reasons["x.tar:b"] == "no image member (found .cls)"
    assert reasons["x.tar:c"] == "label 'cat' in c.cls is not an integer"
    assert reasons["x.tar:d"].startswith(("cannot decode image", "truncated image"))
    assert reasons["x.tar:e"] == "no label (no .cls or .label member)"
    assert reasons["x.tar:f"] == "a duplicate key: member 'f.jpg' appears twice in the shard"
    with pytest.raises(SourceError, match=r"^x.tar:b: no image member .*--on-error fail"):
        pack(path, tmp_path / "q.bin", on_error="fail")
    assert not (tmp_path / "q.bin").exists()


def test_label_key_reads_the_json_member(tmp_path):
    rows = [("a", {"y": 2}), ("b", {"y": "two"}), ("c", {"z": 1}), ("d", None)]
    members = []
    for key, meta in rows:
        members += [(f"{key}.jpg", encoded(len(members))), (f"{key}.cls", b"0")]
        if meta is not None:
            members.append((f"{key}.json", json.dumps(meta).encode()))
    path = write_tar(tmp_path / "x.tar", members)
    summary = pack(path, tmp_path / "p.bin", label_key="y")
    _, labels, paths, _, index = records(tmp_path / "p.bin")
    assert paths == ["x.tar:a"] and labels.tolist() == [2] and index.classes == ("0", "1", "2")
    assert [s["reason"] for s in summary.skipped] == [
        "b.json has no integer under key 'y' (--label-key)",
        "c.json has no integer under key 'y' (--label-key)",
        "no .json member to read --label-key 'y' from",
    ]
    assert index.raw["packer"]["label_key"] == "y"


def _cut(path, at: int):
    data = path.read_bytes()
    path.write_bytes(data[:at])


def test_a_truncated_shard_keeps_what_came_before_and_names_the_last_key_kept(tmp_path):
    rows = samples(4)
    path = shard(tmp_path / "t.tar", rows)
    data = path.read_bytes()
    inside = data.index(rows[2][2]) + 100  # inside the third sample's image
    _cut(path, inside)
    out = tmp_path / "p.bin"
    summary = pack([path, shard(tmp_path / "u.tar", samples(2, first=10))], out)
    _, _, paths, _, _ = records(out)
    assert paths == ["t.tar:s0000", "t.tar:s0001", "u.tar:s0010", "u.tar:s0011"]
    (skip,) = summary.skipped
    assert skip["path"] == "t.tar"
    assert skip["reason"].startswith("truncated or damaged tar: it ends inside member 's0002.jpg'")
    assert skip["reason"].endswith("; sample s0002 is dropped with it; the last key kept is s0001")
    with pytest.raises(SourceError, match=r"^t.tar: truncated .*last key kept is s0001 \(--on-"):
        pack(path, tmp_path / "q.bin", on_error="fail")


def test_a_shard_cut_between_members_or_followed_by_junk_is_reported_too(tmp_path):
    rows = samples(2)
    members = [m for key, label, data in rows for m in ((f"{key}.jpg", data), (f"{key}.cls", b"1"))]
    cut = write_tar(tmp_path / "cut.tar", members, end=False)
    junk = write_tar(tmp_path / "junk.tar", members, end=False)
    junk.write_bytes(junk.read_bytes() + b"not a header".ljust(1024, b"!"))
    for path, why in [(cut, "without the end-of-archive blocks"), (junk, "are no tar header")]:
        summary = pack(path, tmp_path / f"{path.stem}.bin")
        assert summary.count == 1  # s0001 may have lost members: it is not trusted
        (skip,) = summary.skipped
        assert why in skip["reason"] and skip["reason"].endswith(
            "; sample s0001 is dropped with it; the last key kept is s0000"
        )


def test_a_damaged_shard_in_directory_order_drops_the_key_of_its_last_member(tmp_path):
    members = [("a.jpg", encoded(1)), ("b.jpg", encoded(2)), ("b.cls", b"1"),
               ("a.cls", b"0")]  # fmt: skip
    path = write_tar(tmp_path / "x.tar", members, end=False)
    summary = pack(path, tmp_path / "p.bin", labels="none")
    assert summary.count == 1 and summary.skipped == [
        {"path": "x.tar", "reason": "truncated or damaged tar: it ends at byte 5120 without "
         "the end-of-archive blocks; sample a is dropped with it; the last key kept is b"}
    ]  # fmt: skip


def test_a_shard_cut_inside_a_member_of_no_sample_is_a_skip_not_a_crash(tmp_path):
    members = [("a.jpg", encoded(1)), ("a.cls", b"0"), ("b.jpg", encoded(2)), ("b.cls", b"1"),
               ("README", b"x" * 5000)]  # fmt: skip
    path = write_tar(tmp_path / "x.tar", members)
    _cut(path, path.read_bytes().index(b"x" * 100) + 1000)
    summary = pack(path, tmp_path / "p.bin")
    (skip,) = summary.skipped
    assert summary.count == 1 and skip["path"] == "x.tar"
    assert skip["reason"].startswith("truncated or damaged tar: it ends inside member 'README'")
    assert skip["reason"].endswith("; sample b is dropped with it; the last key kept is a")


def test_a_file_that_is_no_tar_is_one_line(tmp_path):
    bad = tmp_path / "photo.tar"
    bad.write_bytes(encoded(1))
    with pytest.raises(SourceError, match=r"photo.tar: not a readable tar file \("):
        pack(bad, tmp_path / "p.bin")
    (tmp_path / "empty.tar").write_bytes(b"")
    with pytest.raises(SourceError, match=r"empty.tar: not a readable tar file \(empty file\)"):
        pack(tmp_path / "empty.tar", tmp_path / "p.bin")
    write_tar(tmp_path / "none.tar", [("README", b"x")])
    said = r"no samples in none.tar; left out: none.tar:README \(no extension, so no sample"
    with pytest.raises(SourceError, match=said):
        pack(tmp_path / "none.tar", tmp_path / "p.bin")


def test_without_labels_say_how_to_pack_them_or_pack_unlabelled(tmp_path):
    path = write_tar(tmp_path / "x.tar", [("a.jpg", encoded(1)), ("b.jpg", encoded(2))])
    with pytest.raises(SourceError, match=r"x.tar:a: no sample has a label .*--labels none$"):
        pack(path, tmp_path / "p.bin")
    pack(path, tmp_path / "p.bin", labels="none")
    _, labels, paths, _, index = records(tmp_path / "p.bin")
    assert labels.tolist() == [-1, -1] and index.classes == () and paths == ["x.tar:a", "x.tar:b"]


def test_classes_from_is_the_list_the_numbers_index(tmp_path):
    path = shard(tmp_path / "x.tar", [("a", 2, encoded(1)), ("b", 0, encoded(2))])
    names = tmp_path / "classes.txt"
    names.write_text("cat\ndog\nemu\n")
    pack(path, tmp_path / "p.bin", classes_from=names)
    _, labels, _, _, index = records(tmp_path / "p.bin")
    assert index.classes == ("cat", "dog", "emu") and labels.tolist() == [2, 0]
    names.write_text("cat\ndog\n")
    with pytest.raises(SourceError, match=r"x.tar:a: label 2 is not in classes.txt \(2 classes\)"):
        pack(path, tmp_path / "q.bin", classes_from=names)
    summary = pack(path, tmp_path / "q.bin", classes_from=names, on_error="skip")
    assert summary.count == 1
    assert summary.skipped == [{"path": "x.tar:a", "reason": "label 2 is not in classes.txt"}]


def test_a_shard_that_changed_after_listing_gives_a_skip_not_a_crash(tmp_path):
    path = tmp_path / "x.tar"
    path.write_bytes(b"0123456789")
    fetch = TarSource([str(path)], ["x.tar"], tmp_path)
    assert fetch((0, 2, 3)) == b"234"
    assert fetch((0, 8, 5)) == Skip("the shard is shorter than when it was listed (changed since?)")
    fetch.close()
    assert fetch((0, 0, 1)) == b"0"  # reopened
    fetch.close()
    gone = TarSource([str(tmp_path / "gone.tar")], ["gone.tar"], tmp_path)
    assert gone((0, 0, 1)).reason.startswith("cannot read")


def test_shards_are_listed_on_many_cores_into_the_same_listing(tmp_path):
    from imgpack.packer.sources.select import open_source

    paths = [shard(tmp_path / f"s-{k}.tar", samples(3, first=3 * k)) for k in range(5)]
    alone = open_source(paths, workers=1).listing()
    many = open_source(paths, workers=3).listing()
    assert many == alone and len(many.files) == 15 and many.files[4] == ("s-1.tar:s0004", 1)
    (tmp_path / "s-3.tar").write_bytes(b"junk")
    with pytest.raises(SourceError, match=r"s-3.tar: not a readable tar file"):
        open_source(paths, workers=3).listing()


def test_info_and_the_summary_count_samples_not_files(tmp_path):
    from imgpack.packer.verify import info_lines, pack_info

    path = shard(tmp_path / "x.tar", samples(6))
    summary = pack(path, tmp_path / "p.bin", num_shards=2, shard_index=1)
    assert "; 3 samples in " in summary.lines()[0]
    text = "\n".join(info_lines(pack_info(tmp_path / "p.bin")))
    assert "shard 1 of 2: source samples 3..6 of 6" in text
