"""--classes-from: a validation pack numbered exactly like its training pack."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import records, write_image

from imgpack.classlist import class_digest
from imgpack.errors import InvalidArgumentError, SourceError
from imgpack.packer.cli import main
from imgpack.packer.pack import pack_folder


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="pack-images")


@pytest.fixture
def train_and_val(tmp_path):
    """train has cat/dog/eel; val lacks dog and has an extra owl folder."""
    for split, classes in (("train", ("cat", "dog", "eel")), ("val", ("cat", "eel", "owl"))):
        for c in classes:
            for i in range(2):
                write_image(tmp_path / split / c / f"{i}.png", 16, 12, seed=i)
    train = tmp_path / "train.bin"
    pack_folder(tmp_path / "train", train, size=(8, 8), workers=1)
    return tmp_path / "train", tmp_path / "val", train


def test_val_keeps_train_numbering_and_reports_the_empty_class(train_and_val, tmp_path):
    _, val, train = train_and_val
    (val / "owl" / "0.png").unlink()
    (val / "owl" / "1.png").unlink()
    (val / "owl").rmdir()
    summary = pack_folder(val, tmp_path / "val.bin", size=(8, 8), workers=1, classes_from=train)
    _, labels, paths, _, index = records(tmp_path / "val.bin")
    assert list(index.classes) == ["cat", "dog", "eel"]
    assert labels.tolist() == [0, 0, 2, 2] and paths[2] == "eel/0.png"
    assert summary.empty_classes == ["dog"]
    assert "classes with no images (their labels are kept): dog" in summary.lines()
    assert index.raw["packer"]["classes_from"] == "train.bin"


def test_a_folder_outside_the_list_is_an_error_or_skipped_when_asked(train_and_val, tmp_path):
    _, val, train = train_and_val
    out = tmp_path / "val.bin"
    with pytest.raises(SourceError, match=r"class folder 'owl' is not in train.bin \(3 classes\)"):
        pack_folder(val, out, size=(8, 8), workers=1, classes_from=train)
    assert not out.exists()
    summary = pack_folder(val, out, size=(8, 8), workers=1, classes_from=train, on_error="skip")
    assert summary.count == 4
    assert summary.excluded == [
        {"path": "owl/", "reason": "class folder not in the class list (train.bin)"}
    ]
    left = "left out: 1 class folder not in the class list; see val.json 'excluded'"
    assert left in summary.lines()


def test_a_text_class_list_and_its_errors(train_and_val, tmp_path):
    train_src, _, _ = train_and_val
    names = tmp_path / "classes.txt"
    names.write_text("eel\ndog\ncat\nyak\n")
    out = tmp_path / "p.bin"
    pack_folder(train_src, out, size=(8, 8), workers=1, classes_from=names)
    _, labels, paths, _, index = records(out)
    assert list(index.classes) == ["eel", "dog", "cat", "yak"]
    assert [p.split("/")[0] for p in paths] == ["eel"] * 2 + ["dog"] * 2 + ["cat"] * 2
    assert labels.tolist() == [0, 0, 1, 1, 2, 2]
    with pytest.raises(InvalidArgumentError, match="class list not found"):
        pack_folder(train_src, tmp_path / "q.bin", classes_from=tmp_path / "nope.txt")


def test_cli_classes_from_and_the_info_digest(train_and_val, tmp_path):
    _, val, train = train_and_val
    out = tmp_path / "val.bin"
    bad = run(val, out, "--classes-from", train)
    assert bad.exit_code == 1 and bad.stderr.count("\n") == 1
    assert "pack-images: error: " in bad.stderr and "'owl' is not in train.bin" in bad.stderr
    assert "--on-error skip" in bad.stderr
    done = run(val, out, "--classes-from", train.with_suffix(".json"), "--on-error", "skip")
    assert done.exit_code == 0, done.output
    assert "1 class folder not in the class list" in done.stderr
    assert "classes with no images" in done.stderr
    digest = class_digest(["cat", "dog", "eel"])
    for pack in (train, out):
        info = run("info", pack)
        assert f"class list digest: {digest}" in info.stdout
    assert json.loads(run("info", out, "--json").stdout)["classes_digest"] == digest
    usage = run(val, tmp_path / "x.bin", "--labels", "none", "--classes-from", train)
    assert usage.exit_code == 1 and usage.stderr == (
        "pack-images: error: --classes-from numbers labels; a pack without labels (--labels "
        "none or --label-column none) takes none\n"
    )


def test_a_text_list_from_an_editor_matches_the_folders(train_and_val, tmp_path):
    """Notepad's BOM, CRLF and a stray trailing space do not turn 'cat' into another class."""
    _, val, _ = train_and_val
    listing = tmp_path / "classes.txt"
    listing.write_bytes("\ufeffcat \r\ndog\r\n eel\r\nowl\t\r\n".encode())
    result = run(
        val, tmp_path / "val.bin", "--size", "8", "--workers", "1", "--classes-from", listing
    )
    assert result.exit_code == 0, result.output
    _, labels, _, _, index = records(tmp_path / "val.bin")
    assert list(index.classes) == ["cat", "dog", "eel", "owl"]
    assert labels.tolist() == [0, 0, 2, 2, 3, 3]


def test_classes_from_an_unlabelled_pack_says_it_has_none(train_and_val, tmp_path):
    train, val, _ = train_and_val
    bare = tmp_path / "bare.bin"
    assert run(train, bare, "--size", "8", "--workers", "1", "--labels", "none").exit_code == 0
    for extra in ((), ("--on-error", "skip"), ("--labels", tmp_path / "l.csv")):
        (tmp_path / "l.csv").write_text("path,label\ncat/0.png,0\n")
        result = run(val, tmp_path / "val.bin", "--size", "8", "--classes-from", bare, *extra)
        assert result.exit_code == 1, result.output
        lines = result.stderr.strip().splitlines()
        assert (
            len(lines) == 1 and "bare.bin: holds no classes (packed with --labels none)" in lines[0]
        )
