"""Each public error, raised by something a user really does, caught the way a user catches it.

The classes are few and grouped by what the user does about them; within a group the
message tells failures apart, so every test here also checks the message.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_image

import imgpack
from imgpack import errors
from imgpack.errors import (
    ClassMismatchError,
    FormatError,
    ImgpackError,
    InvalidArgumentError,
    LoaderError,
    MissingExtraError,
    OutputExistsError,
    PackChangedError,
    PackError,
    SourceError,
)
from imgpack.packer.cli import main
from imgpack.packer.pack import pack_folder
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader


def test_the_surface_is_small_and_every_name_resolves():
    assert len(imgpack.__all__) <= 20 and len(set(imgpack.__all__)) == len(imgpack.__all__)
    assert len(errors.__all__) <= 12 and set(errors.__all__) <= set(imgpack.__all__)
    for name in imgpack.__all__:
        assert getattr(imgpack, name) is not None, name
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), ImgpackError), name
    code = (
        "import sys, imgpack\n"
        "for name in imgpack.__all__:\n"
        "    if name in imgpack.errors.__all__ or name == '__version__':\n"
        "        getattr(imgpack, name)\n"
        "sys.exit('torch' in sys.modules or 'PIL' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr or "import imgpack imported torch or Pillow"


# --- a file on disk ------------------------------------------------------------------------


def test_a_damaged_pack_is_a_format_error_that_value_error_code_catches(make_pack):
    path, _, _ = make_pack(count=4)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1)
    try:
        PackedImageDataset(path)
    except ValueError as exc:  # generic code that already catches bad input
        assert isinstance(exc, FormatError) and not isinstance(exc, PackChangedError)
        assert str(exc).startswith("pack.bin: ") and "(truncated?)" in str(exc)
    else:
        pytest.fail("a truncated pack was opened")


def test_a_pack_replaced_under_an_open_dataset_is_pack_changed_and_reopening_fixes_it(
    make_pack,
):
    def publish(count: int) -> Path:  # a pipeline (re)publishes live/pack.bin and its index
        made, _, _ = make_pack(count=count)
        live = made.parent / "live"
        live.mkdir(exist_ok=True)
        for built in (made, made.with_suffix(".json")):
            os.replace(built, live / built.name)
        return live / made.name

    path = publish(4)
    ds = PackedImageDataset(path)  # the index is read; nothing is mapped yet
    publish(6)
    with pytest.raises(PackChangedError, match=r"^pack\.bin: the pack changed on disk") as err:
        ds[0]
    assert isinstance(err.value, FormatError)
    assert len(PackedImageDataset(path)) == 6  # what the pipeline does: open it again


def test_packs_numbering_classes_differently_raise_class_mismatch(make_pack):
    train, _, _ = make_pack(classes=("cat", "dog", "fox"), name="train")
    val, _, _ = make_pack(classes=("cat", "fox", "dog"), name="val")
    with pytest.raises(ClassMismatchError, match="label 1 is 'fox' here, 'dog' there") as err:
        PackedImageDataset(val, classes_from=train)
    assert isinstance(err.value, ValueError)
    assert len(PackedImageDataset(val, classes_from=["cat", "fox", "dog"])) == 10


# --- the call ----------------------------------------------------------------------------


def test_bad_loader_settings_a_foreign_state_or_a_missing_class_list_are_invalid_arguments(
    make_pack, tmp_path
):
    path, _, _ = make_pack(count=8)
    ds = PackedImageDataset(path)
    with pytest.raises(InvalidArgumentError, match="order should be one of .* found 'random'"):
        make_loader(ds, 4, order="random")
    state = make_loader(ds, 2, seed=0).state_dict()
    with pytest.raises(InvalidArgumentError, match="loader state: order was .* has 'block'$"):
        make_loader(ds, 4, seed=0, order="block").load_state_dict(state)
    with pytest.raises(InvalidArgumentError, match="nope.txt: class list not found") as err:
        PackedImageDataset(path, classes_from=tmp_path / "nope.txt")
    assert isinstance(err.value, ValueError) and not isinstance(err.value, LoaderError)


def test_a_loader_that_cannot_deliver_raises_loader_error(make_pack):
    path, _, _ = make_pack(count=16)
    loader = make_loader(PackedImageDataset(path), 4, shuffle=False)
    first, second = iter(loader), iter(loader)
    next(first)
    next(second)  # a new pass: the first one is over
    with pytest.raises(LoaderError, match="a new pass over it began") as err:
        next(first)
    assert not isinstance(err.value, ValueError)
    loader.close()


def test_plotting_without_matplotlib_raises_missing_extra(monkeypatch):
    from imgpack.diagnose.tune import pyplot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    with pytest.raises(MissingExtraError, match=r"pip install imgpack\[plot\]"):
        pyplot()


# --- packing -----------------------------------------------------------------------------

runner = CliRunner()


def _cli_error_line(*args) -> str:
    result = runner.invoke(main, [str(a) for a in args], prog_name="pack-images")
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pack-images: error: "), result.stderr
    return lines[0]


@pytest.fixture
def src(tmp_path):
    for name in ("cat/1.jpg", "dog/1.jpg"):
        write_image(tmp_path / "src" / name, 16, 12)
    return tmp_path / "src"


def test_an_existing_output_is_output_exists_on_the_cli_and_in_python(src, tmp_path):
    out = tmp_path / "p.bin"
    out.write_bytes(b"someone else's file")
    line = _cli_error_line(src, out, "--size", "8")
    assert line == f"pack-images: error: {out}: already exists; use --force to overwrite it"
    with pytest.raises(OutputExistsError, match="already exists; use --force") as err:
        pack_folder(src, out, size=(8, 8), workers=1, progress=False)
    assert isinstance(err.value, PackError)  # nothing was published
    assert out.read_bytes() == b"someone else's file"
    pack_folder(src, out, size=(8, 8), workers=1, progress=False, force=True)  # what to do


def test_bad_input_to_the_packer_is_a_source_error_and_nothing_is_written(src, tmp_path):
    out = tmp_path / "p.bin"
    with pytest.raises(SourceError, match="source folder") as err:
        pack_folder(tmp_path / "missing", out, size=(8, 8), workers=1, progress=False)
    assert isinstance(err.value, (PackError, ValueError))
    (src / "dog" / "2.jpg").write_bytes(b"not an image")
    line = _cli_error_line(src, out, "--size", "8", "--workers", "1", "--on-error", "fail")
    assert line.endswith("dog/2.jpg: cannot identify image file (no image format Pillow reads "
                         "matches its contents) (--on-error fail: nothing written)")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_packing_that_cannot_go_on_as_asked_is_a_pack_error(src, tmp_path):
    out = tmp_path / "p.bin"
    with pytest.raises(PackError, match="cannot resume p.bin: nothing to resume") as err:
        pack_folder(src, out, size=(8, 8), workers=1, progress=False, resume=True)
    assert not isinstance(err.value, (SourceError, OutputExistsError, ValueError))
    line = _cli_error_line(src, tmp_path / "nowhere" / "p.bin", "--size", "8")
    assert line.endswith("nowhere: output folder does not exist")
