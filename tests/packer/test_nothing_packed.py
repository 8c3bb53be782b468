"""A folder where no image decodes is an error, not an empty pack published with exit 0."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import write_image

from imgpack.errors import SourceError
from imgpack.format.index import read_index
from imgpack.packer.cli import main
from imgpack.packer.journal import journal_path
from imgpack.packer.pack import pack_folder
from imgpack.packer.writer import partial_path

runner = CliRunner()


def run(*args):
    return runner.invoke(main, [str(a) for a in args], prog_name="pack-images")


def broken_folder(root, n=5):
    """``n`` files that look like images by name and are not: garbage, a cut JPEG, text."""
    whole = write_image(root / "tmp.jpg", 32, 24).read_bytes()
    (root / "tmp.jpg").unlink()
    for i in range(n):
        path = root / "a" / f"{i + 1}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes([b"not an image", whole[:40], b""][i % 3])
    return root


def only_error_line(result) -> str:
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pack-images: error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("workers", [1, 2])  # in-process and real worker processes
def test_every_image_broken_fails_and_publishes_nothing(tmp_path, workers):
    src = broken_folder(tmp_path / "src")
    out = tmp_path / "out" / "p.bin"
    out.parent.mkdir()
    line = only_error_line(run(src, out, "--size", "8x8", "--workers", workers, "--quiet"))
    assert "no image could be packed: 5 skipped, e.g. a/1.jpg (" in line, line
    assert "cannot identify image file" in line, line
    assert list(out.parent.iterdir()) == []  # no .bin/.json, no partial, no journal


def test_the_python_api_raises_a_specific_error_and_cleans_up(tmp_path):
    src = broken_folder(tmp_path / "src", n=3)
    out = tmp_path / "p.bin"
    with pytest.raises(SourceError, match=r"3 skipped, e\.g\. a/1\.jpg") as err:
        pack_folder(src, out, size=(8, 8), workers=1, progress=False)
    assert isinstance(err.value, ValueError)  # the input is wrong, as a bad source folder is
    for p in (out, out.with_suffix(".json"), partial_path(out), journal_path(out)):
        assert not p.exists(), p


def test_one_good_image_keeps_the_pack_and_lists_the_skips(tmp_path):
    src = broken_folder(tmp_path / "src", n=4)
    write_image(src / "a" / "9.jpg", 32, 24)
    out = tmp_path / "p.bin"
    result = run(src, out, "--size", "8x8", "--workers", 2)
    assert result.exit_code == 0, result.output
    assert "packed 1 image" in result.stderr
    index = json.loads(out.with_suffix(".json").read_text())
    assert [s["path"] for s in index["skipped"]] == [f"a/{i}.jpg" for i in range(1, 5)]
    assert read_index(out).count == 1


def test_a_labels_file_whose_files_are_all_missing_or_broken_fails_the_same_way(tmp_path):
    src = broken_folder(tmp_path / "src", n=2)
    out = tmp_path / "out" / "p.bin"
    out.parent.mkdir()
    missing = tmp_path / "missing.csv"
    missing.write_text("path,label\nb/1.jpg,cat\nb/2.jpg,dog\n")
    line = only_error_line(run(src, out, "--size", "8x8", "--labels", missing))
    assert "none of the 2 files missing.csv lists is there" in line, line
    assert list(out.parent.iterdir()) == []
    mixed = tmp_path / "mixed.csv"  # one missing, two there but broken
    mixed.write_text("path,label\nb/1.jpg,cat\na/1.jpg,dog\na/2.jpg,cat\n")
    line = only_error_line(run(src, out, "--size", "8x8", "--labels", mixed, "--workers", 2))
    assert "no image could be packed: 3 skipped, e.g. " in line, line
    assert list(out.parent.iterdir()) == []
