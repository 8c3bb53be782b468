"""pack-images: the command shapes, every error path and its exit code, and the real script."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import psutil
import pytest
from click.testing import CliRunner
from conftest import interrupt_after, write_image
from test_format import write_v1, write_v2

from imgpack import __version__
from imgpack.console import reporting
from imgpack.format.index import read_index
from imgpack.format.layout import HEADER_BYTES
from imgpack.packer import pack as pack_module
from imgpack.packer.cli import main

runner = CliRunner()


def run(*args):
    return runner.invoke(main, [str(a) for a in args], prog_name="pack-images")


def one_error_line(result, *fragments):
    """Exit 1 with exactly one 'pack-images: error: ...' line on stderr and no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pack-images: error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def src(image_folder):
    return image_folder(per_class=3)


def test_pack_info_verify(src, tmp_path):
    out = tmp_path / "p.bin"
    result = run(src, out, "--size", "12x10", "--workers", "2")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "packed 6 images into p.bin" in result.stderr and "images/s" in result.stderr
    assert read_index(out).shape == (10, 12, 3)  # WIDTHxHEIGHT
    info = run("info", out)
    assert info.exit_code == 0 and "p.bin: 6 records of 10x12x3 uint8" in info.stdout
    as_json = json.loads(run("info", out.with_suffix(".json"), "--json").stdout)
    assert as_json["count"] == 6 and as_json["classes"][1] == {
        "label": 1,
        "name": "dog",
        "count": 3,
    }
    verify = run("verify", out)
    assert (
        verify.exit_code == 0 and verify.stdout == "p.bin: OK, 6 records, every checksum matches\n"
    )
    assert run("verify", out, "--quiet").stdout == ""


def test_every_way_to_call_pack(src, tmp_path):
    for k, args in enumerate(
        [
            ["pack", src, "{out}"],
            ["--size", "8", src, "{out}"],
            [src, "{out}", "--quiet", "--labels", "none", "--resize", "stretch"],
            ["pack", "--filter", "lanczos", src, "{out}", "--on-error", "fail"],
        ]
    ):
        out = tmp_path / f"p{k}.bin"
        result = run(*[str(out) if a == "{out}" else a for a in args])
        assert result.exit_code == 0, (args, result.output)
        assert out.exists()
    assert run(src, tmp_path / "q.bin", "--quiet").stderr == ""


def test_options_reach_pack_folder(src, tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(pack_module, "pack_folder", lambda *a, **kw: seen.update(kw, args=a))
    run(src, tmp_path / "p.bin", "--size", "320x240", "--resize", "pad", "--filter", "box",
        "--workers", "3", "--labels", "none", "--on-error", "fail", "--force", "--resume",
        "--num-shards", "4", "--shard-index", "3", "--shard-by", "interleaved",
        "--channels", "1", "--quiet")  # fmt: skip
    assert seen == {
        "args": (src, tmp_path / "p.bin"), "size": (320, 240), "resize": "pad", "filter": "box",
        "workers": 3, "labels": "none", "on_error": "fail", "force": True, "resume": True,
        "progress": False, "num_shards": 4, "shard_index": 3, "shard_by": "interleaved",
        "classes_from": None, "notify": seen["notify"],
        "channels": 1, "crop_ratio": 1.0, "codec": "raw", "quality": None,
        "image_column": None, "label_column": None, "label_key": None, "published": None,
    }  # fmt: skip
    run(src, tmp_path / "p.bin")
    assert seen["workers"] is None and seen["size"] == (224, 224) and seen["progress"] is None
    assert seen["resume"] is None and seen["on_error"] is None and seen["labels"] == "folders"
    assert seen["shard_by"] == "contiguous"
    assert (seen["channels"], seen["crop_ratio"]) == (3, 1.0)
    run(src, tmp_path / "p.bin", "--resize", "fit", "--size", "96", "--codec", "yuv420")
    assert (seen["resize"], seen["size"], seen["codec"]) == ("fit", (96, 96), "yuv420")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--resize", "fit", "--size", "32x24"], "--resize fit takes one --size S (the longer "
         "side), not '32x24'"),
        (["--resize", "fit", "--size", "32x32"], "not '32x32'"),
        (["--codec", "yuv420", "--channels", "1"], "--codec yuv420 stores 3 channels (colour); "
         "it cannot be used with --channels 1"),
        (["--size", "0"], "size '0': each side must be 1..65535 pixels"),
        (["--size", "abc"], "size 'abc': expected N or WIDTHxHEIGHT, e.g. 224 or 320x240"),
        (["--size", "10x"], "size '10x': expected N or WIDTHxHEIGHT"),
        (["--size", "70000"], "size '70000': each side must be 1..65535 pixels"),
    ],
)  # fmt: skip
def test_size_fit_and_yuv420_misuse_is_one_line_exit_2(src, tmp_path, args, fragment):
    result = run(src, tmp_path / "p.bin", *args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("pack-images: error: ") and result.stderr.count("\n") == 1
    assert fragment in result.stderr
    assert not (tmp_path / "p.bin").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--resize", "squash"],
        ["--filter", "cubic"],
        ["--workers", "0"],
        ["--labels", "files"],
        ["--on-error", "ignore"],
        ["--num-shards", "2", "--shard-index", "2"],
        ["--num-shards", "0"],
        ["--shard-index", "-1"],
        ["--num-shards", "2", "--shard-by", "striped"],
        ["--shard-by", "Interleaved"],
        ["--bogus"],
    ],
)
def test_usage_errors_exit_2_and_write_nothing(src, tmp_path, args):
    out = tmp_path / "p.bin"
    result = run(src, out, *args)
    assert result.exit_code == 2, result.output
    assert "Usage: pack-images" in result.stderr and "Traceback" not in result.output
    assert not out.exists()


def test_missing_arguments_are_usage_errors(src):
    result = run(src)
    assert result.exit_code == 2 and "Missing argument 'OUT.bin'" in result.stderr
    assert run("info").exit_code == 2


def test_failures_exit_1_with_one_line(src, tmp_path, monkeypatch):
    out = tmp_path / "p.bin"
    one_error_line(run(tmp_path / "nope", out), "nope: source folder does not exist")
    one_error_line(run(src, tmp_path / "no" / "p.bin"), "output folder does not exist")
    assert run(src, out, "--quiet").exit_code == 0
    assert "already complete" in run(src, out).stderr  # the same command again: nothing to do
    one_error_line(run(src, out, "--size", "9"), "p.bin: already exists; use --force")
    assert run(src, out, "--force", "--quiet").exit_code == 0
    (src / "dog" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    one_error_line(run(src, tmp_path / "f.bin", "--on-error", "fail"), "dog/bad.png: ")
    assert not (tmp_path / "f.bin").exists() and not (tmp_path / "f.json").exists()
    one_error_line(run("info", tmp_path / "none.bin"), "none.json: index not found")
    one_error_line(run("verify", tmp_path / "none.json"), "none.json: index not found")
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1, 1, 0))
    line = one_error_line(run(src, tmp_path / "s.bin"), "MB but only 0 B is free")
    assert re.search(r"the pack of 7 images needs \d+\.\d MB but only 0 B is free$", line)


@pytest.mark.parametrize("version", [1, 2])
def test_info_and_verify_of_a_pre_release_pack_say_to_repack(tmp_path, version):
    path = (write_v1 if version == 1 else write_v2)(tmp_path)
    want = (
        f"pack.json: format version {version} was a pre-release format; repack it with pack-images"
    )
    for command in ("info", "verify"):
        line = one_error_line(run(command, path))
        assert line == f"pack-images: error: {want}"


def test_skipped_files_are_summarised(src, tmp_path):
    (src / "dog" / "bad.png").write_bytes(b"nope")
    result = run(src, tmp_path / "p.bin")
    assert result.exit_code == 0
    assert "skipped 1" in result.stderr
    assert "skipped: dog/bad.png (cannot identify image file" in result.stderr
    assert "see p.json 'skipped'" in result.stderr


def test_verify_exits_1_on_damage_and_names_the_record(src, tmp_path):
    out = tmp_path / "p.bin"
    run(src, out, "--size", "4", "--quiet")
    with open(out, "r+b") as f:
        f.seek(HEADER_BYTES + 4 * 48 + 5)  # record 4
        f.write(b"\x00\x01")
    result = run("verify", out)
    assert "record 4 (dog/001.jpg): CRC-32 is" in result.stdout
    one_error_line(result, "p.bin: 1 of 6 records damaged")
    with open(out, "r+b") as f:
        f.truncate(out.stat().st_size - 1)
    result = run("verify", out)
    one_error_line(result, "p.bin: file has", "(truncated?)")
    # the summary is all there is to say: said once, on stderr, as info says it
    assert result.stdout == "" and result.output.count("(truncated?)") == 1


def test_debug_shows_the_exception(tmp_path):
    result = run(tmp_path / "nope", tmp_path / "p.bin", "--debug")
    assert result.exit_code == 1 and type(result.exception).__name__ == "SourceError"


def test_unexpected_errors_are_one_line_too(src, tmp_path, monkeypatch):
    def boom(*a, **kw):
        raise RuntimeError("something\nmultiline")

    monkeypatch.setattr(pack_module, "pack_folder", boom)
    one_error_line(run(src, tmp_path / "p.bin"), "RuntimeError: something multiline")


def test_ctrl_c_exits_130_and_says_how_many_records_are_kept(src, tmp_path, monkeypatch):
    out = tmp_path / "p.bin"
    with monkeypatch.context() as mp:
        interrupt_after(mp, 5)  # 4 records written, then Ctrl-C
        result = run(src, out, "--size", "8", "--workers", "1", "--quiet")
    assert result.exit_code == 130
    assert result.stderr == (
        "pack-images: interrupted with 4 records kept; rerun the same command to continue\n"
    )
    again = run(src, out, "--size", "8", "--workers", "1")
    assert again.exit_code == 0 and "resuming: 4 of 6 images already packed" in again.stderr


def test_ctrl_c_once_the_pack_is_complete_counts_its_records(src, tmp_path, monkeypatch):
    from imgpack.packer.verify import PackSummary

    def lines(self, **kw):  # Ctrl-C as the summary is printed: the pack is published
        raise KeyboardInterrupt

    monkeypatch.setattr(PackSummary, "lines", lines)
    out = tmp_path / "p.bin"
    result = run(src, out, "--size", "12x10", "--workers", "1")
    assert result.exit_code == 130
    assert result.stderr == (
        "pack-images: interrupted with 6 records kept; rerun the same command to continue\n"
    )
    assert sorted(p.name for p in tmp_path.glob("p.*")) == ["p.bin", "p.json"]
    monkeypatch.undo()
    again = run(src, out, "--size", "12x10", "--workers", "1")
    assert again.exit_code == 0 and "p.bin is already complete (6 images" in again.stderr


def test_ctrl_c_while_listing_says_no_record_is_kept(src, tmp_path, monkeypatch):
    from imgpack.packer.sources.folder import FolderSource

    def listing(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(FolderSource, "listing", listing)
    result = run(src, tmp_path / "p.bin")
    assert result.exit_code == 130 and list(tmp_path.glob("p.*")) == []
    assert result.stderr == (
        "pack-images: interrupted with 0 records kept; rerun the same command to continue\n"
    )


def test_help_and_version(src):
    result = run("--help")
    assert result.exit_code == 0
    assert "pack-images SRC... OUT.bin [options]" in result.stdout
    assert all(name in result.stdout for name in ("info", "pack", "verify"))
    assert "--num-shards" in run("pack", "--help").stdout
    assert "--json" in run("info", "-h").stdout
    assert run("--version").stdout == f"pack-images, version {__version__}\n"


def test_a_new_subcommand_is_one_registration(src, tmp_path):
    group = copy.copy(main)
    group.commands = dict(main.commands)

    @click.command("hello")
    @click.option("--debug", is_flag=True)
    def hello(debug):
        with reporting(debug):
            raise ValueError("x.json: nothing to merge")

    group.add_command(hello)
    result = runner.invoke(group, ["hello"], prog_name="pack-images")
    one_error_line(result, "x.json: nothing to merge")
    result = runner.invoke(group, [str(src), str(tmp_path / "p.bin"), "--quiet"])
    assert result.exit_code == 0  # the default still packs


def test_the_installed_console_script(src, tmp_path):
    exe = shutil.which("pack-images")
    if exe is None:
        pytest.skip("pack-images is not installed (pip install -e .)")
    out = tmp_path / "p.bin"

    def sh(*args):
        return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=120)

    done = sh(src, out, "--size", "8", "--workers", "2")
    assert done.returncode == 0 and done.stdout == "" and "packed 6 images" in done.stderr
    assert sh("info", out).returncode == 0 and sh("verify", out).returncode == 0
    debug = sh(src, out, "--size", "9", "--debug")  # the one-line error: in-process tests
    assert (
        debug.returncode == 1
        and "Traceback" in debug.stderr
        and "OutputExistsError" in debug.stderr
    )
    usage = sh(src, out, "--resize", "squash")
    assert usage.returncode == 2 and "Invalid value for '--resize'" in usage.stderr


def test_shard_by_on_the_command_line(src, tmp_path):
    out = tmp_path / "s1.bin"
    result = run(src, out, "--num-shards", "2", "--shard-index", "1", "--shard-by", "interleaved")
    assert result.exit_code == 0, result.output
    shard = read_index(out).raw["shard"]
    assert shard["by"] == "interleaved" and shard["source_stride"] == [1, 2]
    assert "shard 1 of 2: source files 1, 3, 5, ... of 6" in run("info", out).stdout
    bad = run(src, tmp_path / "x.bin", "--num-shards", "2", "--shard-by", "striped")
    assert bad.exit_code == 2 and "'striped' is not one of 'contiguous', 'interleaved'" in (
        bad.stderr
    )
    assert "--shard-by [contiguous|interleaved]" in run("pack", "--help").stdout


def test_a_source_folder_named_like_a_subcommand(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("info", "verify", "pack"):
        for i in range(2):
            write_image(tmp_path / name / "c" / f"{i}.png", 12, 10, seed=i)
    short = run("info", "out.bin")
    assert short.exit_code == 2 and short.stdout == ""
    assert short.stderr == (
        "pack-images: error: 'info' is a subcommand and also a folder here; to pack the folder "
        "run: pack-images pack info out.bin (or: pack-images ./info out.bin)\n"
    )
    assert not (tmp_path / "out.bin").exists()
    assert run("pack", "info", "out.bin", "--size", "4").exit_code == 0
    assert run("./info", "dot.bin", "--size", "4").exit_code == 0
    assert read_index("out.bin").count == read_index("dot.bin").count == 2
    shown = run("info", "out.bin")  # now an existing pack: the subcommand is meant
    assert shown.exit_code == 0 and "out.bin: 2 records" in shown.stdout
    odd = run("verify", "v.bin", "--size", "4")  # verify takes no --size: a pack was meant
    assert odd.exit_code == 2 and "pack-images pack verify v.bin --size 4" in odd.stderr
    assert run("pack", "p.bin").exit_code == 2  # 'pack' folder, one argument: ambiguous too
    assert "pack-images pack pack p.bin" in run("pack", "p.bin").stderr
    assert run("pack", "pack", "p.bin", "--size", "4").exit_code == 0
    (tmp_path / "info").rename(tmp_path / "elsewhere")  # no such folder: info as always
    one_error_line(run("info", "none.bin"), "none.json: index not found")


def test_the_summary_says_what_was_left_out(src, tmp_path):
    (src / "cat" / "notes.txt").write_text("x")
    (src / "dog" / ".DS_Store").write_bytes(b"\0")
    (src / "empty").mkdir()
    result = run(src, tmp_path / "p.bin", "--size", "4")
    assert result.exit_code == 0
    lines = result.stderr.splitlines()
    assert "left out: 1 .txt; see p.json 'excluded'" in lines
    assert "left out: 1 hidden or system file (.*, Thumbs.db, ...)" in lines
    assert "classes with no images (their labels are kept): empty" in lines
    assert (
        "left out when packing: 1 files or folders (see p.json 'excluded')"
        in run("info", tmp_path / "p.bin").stdout
    )


def _non_utf8(parent, raw: bytes):
    """parent/raw as a str path (surrogate escapes), or skip where the file system refuses."""
    path = os.path.join(os.fsencode(parent), raw)
    try:
        os.makedirs(path)
        os.rmdir(path)
    except OSError:
        pytest.skip("this file system refuses non-UTF-8 names")
    return os.fsdecode(path)


def test_a_non_utf8_class_folder_fails_at_once_with_one_line(src, tmp_path):
    folder = _non_utf8(src, b"caf\xe9")
    write_image(Path(folder) / "0.png", 16, 12)
    out = tmp_path / "p.bin"
    one_error_line(run(src, out, "--size", "8", "--workers", "1"), "caf\\xe9", "valid UTF-8")
    assert not out.exists() and not (tmp_path / "p.bin.partial").exists()


def test_a_non_utf8_source_folder_or_labels_file_name_still_packs(src, tmp_path):
    odd = _non_utf8(tmp_path, b"src\xff")
    shutil.copytree(src, odd)
    listing = Path(_non_utf8(tmp_path, b"c\xfe.txt"))
    listing.write_text("cat\ndog\n", encoding="utf-8")
    out = tmp_path / "p.bin"
    result = run(odd, out, "--size", "8", "--workers", "1", "--classes-from", listing)
    assert result.exit_code == 0, result.output
    index = json.loads((tmp_path / "p.json").read_text(encoding="utf-8"))
    assert index["packer"]["source"] == "src\\xff"
    assert index["packer"]["classes_from"] == "c\\xfe.txt"
    assert run(odd, out, "--size", "8", "--workers", "1", "--classes-from", listing).exit_code == 0


def test_a_non_utf8_output_name_is_refused_before_anything_is_written(src, tmp_path):
    out = Path(_non_utf8(tmp_path, b"p\xff.bin"))
    one_error_line(run(src, out, "--size", "8"), "p\\xff.bin", "valid UTF-8")
    assert os.listdir(tmp_path) == [src.name]


def test_info_on_a_merged_manifest_says_it_is_one_and_what_to_do(src, tmp_path):
    shards = [tmp_path / f"s{i}.bin" for i in range(2)]
    for i, shard in enumerate(shards):
        args = ("--size", "8", "--workers", "1", "--num-shards", "2", "--shard-index", i)
        assert run(src, shard, *args).exit_code == 0
    manifest = tmp_path / "all.manifest.json"
    assert run("merge", manifest, *shards).exit_code == 0
    for command in ("info", "verify"):
        one_error_line(run(command, manifest), "all.manifest.json: is a manifest", "each shard")


def test_a_missing_manifest_is_not_found_by_every_subcommand(tmp_path):
    """A name ending in .manifest.json that is not there is missing, not a manifest."""
    missing = tmp_path / "train.manifest.json"
    for args in (["info"], ["verify"], ["tune"], ["merge", tmp_path / "all.manifest.json"]):
        result = run(*args, missing)
        line = one_error_line(result, "train.manifest.json: ")
        # tune opens it as a dataset does, which knows the name for a manifest's
        assert line.endswith(("index not found (a pack is NAME.bin plus NAME.json)",
                              "manifest not found"))  # fmt: skip
        assert "is a manifest" not in result.output


def test_ctrl_c_at_any_moment_is_an_interrupt_in_one_line(image_folder, tmp_path):
    """From the command's first line (the interpreter's own start-up aside, which dies by
    the signal) to the last record: status 130 and one line, never click's "Aborted!"."""
    exe = shutil.which("pack-images") or shutil.which(
        "pack-images", path=Path(sys.executable).parent
    )
    if exe is None:
        pytest.skip("pack-images is not installed (pip install -e .)")
    src = image_folder(classes=("a", "b"), per_class=100, width=320, height=240)

    def stop(k, delay):  # one run, stopped ``delay`` s after its own code began (None: at once)
        args = [exe, str(src), str(tmp_path / f"p{k}.bin"), "--size", "200", "--workers", "1"]
        proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        while delay is not None and proc.poll() is None and not importing_pillow(proc.pid):
            time.sleep(0.002)  # the command's own code runs: it imports Pillow
        time.sleep(delay or 0.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        return delay, proc.returncode, err

    with ThreadPoolExecutor(4) as pool:  # the four runs at once: each waits on its own
        runs = list(pool.map(stop, range(4), (None, 0.0, 0.1, 0.4)))
    stopped = 0
    for delay, returncode, err in runs:
        assert "Aborted!" not in err
        if returncode == 0 or (delay is None and returncode == -signal.SIGINT):
            continue  # finished first, or stopped while Python itself started
        stopped += 1
        assert returncode == 130, (delay, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pack-images: interrupted"), (delay, err)
    assert stopped >= 3


def importing_pillow(pid: int) -> bool:
    try:
        return any("_imaging" in m.path for m in psutil.Process(pid).memory_maps())
    except psutil.Error:
        return False


@pytest.mark.parametrize(
    "args",
    [
        ("info", "s3://bucket/train.bin"),
        ("verify", "file:///data/train.bin"),
        ("merge", "s3://bucket/all.manifest.json", "a.bin"),
        ("merge", "all.manifest.json", "gs://bucket/a.bin", "b.bin"),
    ],
)
def test_info_verify_merge_refuse_a_url_by_name(args):
    """These read local packs: a URL is a bad argument named as given, not the missing
    local file a Path makes of it ('s3:/bucket/train.json: index not found')."""
    result = run(*args)
    url = next(a for a in args if "://" in a)
    assert result.exit_code == 2, result.output
    assert f"{url}: a URL; '{args[0]}' reads local packs" in result.stderr
    assert "Traceback" not in result.output
