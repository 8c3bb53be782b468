"""pack_info() and verify_pack(): what a pack holds, and exactly which records rotted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from imgpack.errors import FormatError
from imgpack.format.index import read_index
from imgpack.packer.pack import pack_folder
from imgpack.packer.verify import info_lines, pack_info, verify_pack


@pytest.fixture
def packed(image_folder, tmp_path):
    src = image_folder(classes=("ant", "bee", "cow"), per_class=4)
    (src / "bee" / "zz.jpg").write_bytes(b"junk")
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(10, 8), workers=1)
    return out


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def test_pack_info_says_what_the_pack_holds(packed):
    info = pack_info(packed.with_suffix(".json"))
    assert info["count"] == 12 and info["shape"] == [8, 10, 3] and info["record_bytes"] == 240
    assert info["classes"] == [
        {"label": 0, "name": "ant", "count": 4},
        {"label": 1, "name": "bee", "count": 4},
        {"label": 2, "name": "cow", "count": 4},
    ]
    assert info["skipped"] == 1 and info["unlabelled"] == 0
    assert info["bytes"] == packed.stat().st_size
    assert info["packer"]["size"] == [10, 8] and info["shard"]["count"] == 1
    assert len(info["stats"]["mean"]) == 3
    json.dumps(info)  # machine-readable as it is
    text = "\n".join(info_lines(info))
    assert "p.bin: 12 records of 8x10x3 uint8 (HWC)" in text
    assert "classes: 3 (ant 4, bee 4, cow 4)" in text
    assert "skipped when packing: 1 files (see p.json 'skipped')" in text
    assert "--size 10x8 --resize center-crop" in text


def test_info_of_a_shard_and_of_an_unlabelled_pack(image_folder, tmp_path):
    src = image_folder(per_class=3)
    out = tmp_path / "s.bin"
    pack_folder(src, out, size=(4, 4), workers=1, labels="none", num_shards=2, shard_index=1)
    info = pack_info(out)
    assert info["classes"] == [] and info["unlabelled"] == 3
    text = "\n".join(info_lines(info))
    assert "shard 1 of 2: source files 3..6 of 6" in text and "unlabelled records: 3" in text


def test_info_of_a_broken_pack_raises_a_format_error(packed):
    with open(packed, "r+b") as f:
        f.truncate(packed.stat().st_size - 1)
    with pytest.raises(FormatError, match="truncated"):
        pack_info(packed)


def test_verify_passes_an_intact_pack(packed):
    report = verify_pack(packed)
    assert report.ok and report.count == 12
    assert report.lines() == ["p.bin: OK, 12 records, every checksum matches"]


def test_verify_finds_exactly_the_damaged_record(packed):
    index = read_index(packed)
    flip(packed, index.data_offset + 6 * 240 + 123)  # record 6: bee/002.jpg
    flip(packed, index.data_offset + 11 * 240)  # record 11: the last one
    report = verify_pack(packed)
    assert not report.ok and report.bad_count == 2 and report.count == 12
    assert [(b["record"], b["path"]) for b in report.bad_records] == [
        (6, "bee/002.jpg"),
        (11, "cow/003.jpg"),
    ]
    assert "record 6 (bee/002.jpg): CRC-32 is" in report.lines()[0]
    assert report.summary() == "p.bin: 2 of 12 records damaged"


def test_verify_reports_an_index_that_fails_validation(packed):
    raw = json.loads(packed.with_suffix(".json").read_text())
    raw["count"] = 13
    packed.with_suffix(".json").write_text(json.dumps(raw))
    report = verify_pack(packed)
    assert not report.ok and report.bad_count == 0
    assert len(report.problems) == 1 and "p.json" in report.problems[0]


def path_section(packed):
    index = read_index(packed)
    return index, index.sections["path_offsets"], index.sections["paths"]


def test_verify_checks_path_offsets_and_utf8(packed):
    index, offs, paths = path_section(packed)
    table = np.fromfile(packed, dtype="<u8", count=index.count + 1, offset=offs.offset)
    bad = table.copy()
    bad[3] = bad[4]  # record 3 gets an empty path (first and last offsets stay valid)
    with open(packed, "r+b") as f:
        f.seek(offs.offset)
        f.write(bad.tobytes())
    report = verify_pack(packed)
    assert report.problems == ["p.bin: path of record 3 is empty or not UTF-8"]
    with open(packed, "r+b") as f:  # restore, then break the text instead
        f.seek(offs.offset)
        f.write(table.tobytes())
        f.seek(paths.offset + int(table[5]))
        f.write(b"\xff")
    report = verify_pack(packed)
    assert report.problems == ["p.bin: path of record 5 is empty or not UTF-8"]
    assert report.bad_count == 0


def test_verify_finds_a_path_cut_inside_a_character(image_folder, tmp_path):
    src = image_folder(per_class=1)
    (src / "cat" / "000.jpg").rename(src / "cat" / "é.jpg")
    out = tmp_path / "u.bin"
    pack_folder(src, out, size=(4, 4), workers=1)
    index, offs, _ = path_section(out)
    table = np.fromfile(out, dtype="<u8", count=index.count + 1, offset=offs.offset)
    table[1] = len("cat/") + 1  # inside the two bytes of "é": record 0 ends in half of it
    with open(out, "r+b") as f:
        f.seek(offs.offset)
        f.write(table.tobytes())
    report = verify_pack(out)
    assert report.problems == ["u.bin: path of record 0 is empty or not UTF-8"]


def test_verify_checks_the_skipped_list(packed):
    raw = json.loads(packed.with_suffix(".json").read_text())
    raw["skipped"] = [{"path": "a.jpg"}]
    packed.with_suffix(".json").write_text(json.dumps(raw))
    report = verify_pack(packed)
    assert report.problems == ["p.json: skipped[0] should be {path, reason} strings"]


def test_verify_shows_progress_only_when_asked(packed, capsys):
    verify_pack(packed, progress=True)
    assert "12/12" in capsys.readouterr().err
    verify_pack(packed)
    assert capsys.readouterr().err == ""


def test_info_names_the_labels_file_and_class_list_it_was_packed_with(image_folder, tmp_path):
    """'packed with' reads as the command that made the pack: no '--labels file'."""
    src = image_folder(per_class=2)
    (tmp_path / "labels.csv").write_text("path,label\ncat/000.jpg,cat\ndog/001.jpg,dog\n")
    (tmp_path / "classes.txt").write_text("dog\ncat\n")
    out = tmp_path / "p.bin"
    labels, classes = tmp_path / "labels.csv", tmp_path / "classes.txt"
    pack_folder(src, out, size=(8, 8), workers=1, labels=labels, classes_from=classes)
    line = next(x for x in info_lines(pack_info(out)) if x.startswith("packed with: "))
    assert "--labels labels.csv --classes-from classes.txt " in line
