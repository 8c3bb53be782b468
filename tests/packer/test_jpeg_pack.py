"""--codec jpeg the way a stranger uses it: the command on a folder of JPEG, PNG and GIF files,
then the pack read with json, numpy and Pillow alone, as docs/format.md tells them to."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import photo_like
from PIL import Image, ImageOps, JpegImagePlugin

from imgpack.packer.cli import main

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def run(*args):
    return runner.invoke(main, [str(a) for a in args], prog_name="pack-images")


def save(path: Path, img: Image.Image, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **kw)
    return path


def rgb(w: int, h: int, seed: int) -> Image.Image:
    return Image.fromarray(photo_like(w, h, seed))


@pytest.fixture
def src(tmp_path) -> Path:
    """JPEGs that must be resized, one that fits as it is, progressive, EXIF-rotated and
    grayscale ones; PNG, GIF and a PNG with alpha; one file that is no image."""
    s = tmp_path / "src"
    save(s / "a" / "big.jpg", rgb(96, 64, 1), quality=95)
    save(s / "a" / "fits.jpg", rgb(40, 30, 2), quality=92)  # baseline, within 40: kept
    save(s / "a" / "prog.jpg", rgb(40, 30, 3), quality=92, progressive=True)
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated: 30 wide, 40 high
    save(s / "a" / "rot.jpg", rgb(40, 30, 4), quality=92, exif=exif.tobytes())
    save(s / "a" / "gray.jpg", rgb(30, 40, 5).convert("L"), quality=92)
    save(s / "a" / "gray2.jpg", rgb(40, 30, 6).convert("L"), quality=92)
    save(s / "b" / "p.png", rgb(50, 36, 7))
    save(s / "b" / "anim.gif", rgb(32, 32, 8).quantize(256, dither=Image.Dither.NONE))
    alpha = rgb(20, 20, 9).convert("RGBA")
    alpha.putalpha(128)
    save(s / "b" / "alpha.png", alpha)
    (s / "b" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    return s


def read_like_a_stranger(folder: Path, monkeypatch) -> dict:
    """docs/format.md's "Reading a pack without imgpack", run as written in ``folder``."""
    text = (ROOT / "docs" / "format.md").read_text(encoding="utf-8")
    section = text.split("## Reading a pack without imgpack", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(folder)
    scope: dict = {}
    exec(compile(code, "format.md", "exec"), scope)
    return scope


def reference(path: Path, size: tuple[int, int], channels: int = 3) -> np.ndarray:
    """What the record should show, from Pillow alone: rotated, on white, resized."""
    img = ImageOps.exif_transpose(Image.open(path)).convert("RGBA")
    flat = Image.new("RGBA", img.size, (255, 255, 255, 255))
    img = Image.alpha_composite(flat, img).convert("RGB")
    img = img.resize(size, Image.Resampling.BILINEAR)
    return np.asarray(img.convert("L") if channels == 1 else img)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def test_a_fit_pack_reads_back_with_json_numpy_and_pillow(src, tmp_path, monkeypatch):
    out = tmp_path / "out" / "train.bin"
    out.parent.mkdir()
    result = run(src, out, "--codec", "jpeg", "--resize", "fit", "--size", "40", "--workers", "2")
    assert result.exit_code == 0, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("packed 9 images into train.bin") and "skipped 1" in lines[0]
    assert "jpeg: 8 records encoded at quality 90, 4:2:0; 1 stored as they came (" in result.stderr

    s = read_like_a_stranger(out.parent, monkeypatch)
    idx = s["idx"]
    assert idx["codec"] == "jpeg" and idx["jpeg"]["stored_as_is"] == 1
    assert idx["jpeg"]["quality"] == 90 and idx["skipped"][0]["path"] == "b/broken.jpg"
    assert s["offsets"][-1] == idx["sections"]["pixels"]["nbytes"]
    assert s["first"].shape == (int(s["rh"][0]), int(s["rw"][0]), 3)
    data = (out.parent / "train.bin").read_bytes()
    po = idx["sections"]["path_offsets"]
    path_offsets = np.frombuffer(data, "<u8", idx["count"] + 1, po["offset"])
    paths = data[idx["sections"]["paths"]["offset"] :]
    for i in range(idx["count"]):
        rel = paths[path_offsets[i] : path_offsets[i + 1]].decode()
        stream = bytes(s["record"](i))
        img = Image.open(io.BytesIO(stream))
        assert (img.format, img.mode) == ("JPEG", "RGB")
        source = src / rel
        shown = ImageOps.exif_transpose(Image.open(source)).size
        scale = min(1.0, 40 / max(shown))
        want = (max(1, round(shown[0] * scale)), max(1, round(shown[1] * scale)))
        assert img.size == want == (int(s["rw"][i]), int(s["rh"][i])), rel
        assert s["labels"][i] == idx["classes"].index(rel.split("/")[0])
        if rel == "a/fits.jpg":
            assert stream == source.read_bytes()  # stored as it came, byte for byte
        else:
            assert stream != source.read_bytes()
            assert "progressive" not in img.info  # every encoded record is baseline
        assert psnr(np.asarray(img), reference(source, want)) > 30, rel


@pytest.mark.parametrize("channels", ["3", "1"])
@pytest.mark.parametrize("resize", ["center-crop", "stretch", "pad", "fit"])
def test_every_resize_mode_and_channel_count(src, tmp_path, resize, channels):
    out = tmp_path / "p.bin"
    size = "40" if resize == "fit" else "40x30"
    result = run(src, out, "--codec", "jpeg", "--quality", "85", "--resize", resize,
                 "--size", size, "--channels", channels, "--workers", "1")  # fmt: skip
    assert result.exit_code == 0, result.output
    idx = json.loads(out.with_suffix(".json").read_text())
    c = int(channels)
    # kept: baseline, the pack's components, no rotation, and the record is the whole source
    kept = {("3", False): 1, ("3", True): 1, ("1", False): 1, ("1", True): 2}[
        channels, resize == "fit"
    ]
    assert idx["jpeg"] == {
        "quality": 85,
        "subsampling": "4:2:0" if c == 3 else "4:0:0",
        "stored_as_is": kept,
    }
    assert idx["packer"]["quality"] == 85 and idx["shape"] == [30 if resize != "fit" else 40, 40, c]
    data = out.read_bytes()
    f = idx["fields"]
    sizes = np.frombuffer(data, "<u4", 2 * idx["count"], f["record_size"]["offset"]).reshape(-1, 2)
    lengths = np.frombuffer(data, "<u4", idx["count"], f["record_length"]["offset"])
    at = idx["data_offset"] + np.concatenate([[0], np.cumsum(lengths.astype(np.int64))])
    for i in range(idx["count"]):
        img = Image.open(io.BytesIO(data[at[i] : at[i + 1]]))
        assert img.mode == ("RGB" if c == 3 else "L") and img.size == tuple(sizes[i])
        if resize != "fit":
            assert img.size == (40, 30)
    assert run("verify", out).exit_code == 0


def test_bad_quality_options_are_one_line_refusals_that_write_nothing(src, tmp_path):
    out = tmp_path / "out" / "p.bin"
    out.parent.mkdir()
    raw = run(src, out, "--quality", "80")
    assert raw.exit_code == 2
    assert (
        raw.stderr.strip() == "pack-images: error: --quality is for --codec jpeg, not --codec raw"
    )
    for bad in ("0", "101", "high"):
        result = run(src, out, "--codec", "jpeg", "--quality", bad)
        assert result.exit_code == 2 and "--quality" in result.stderr, result.stderr
    # libjpeg writes sides of at most 65500 pixels: refused before anything is decoded
    for resize, size in (("fit", "65535"), ("stretch", "65501x2")):
        result = run(src, out, "--codec", "jpeg", "--resize", resize, "--size", size)
        assert result.exit_code == 2, result.stderr
        assert result.stderr.strip() == (
            f"pack-images: error: --codec jpeg stores sides of at most 65500 pixels, "
            f"not --size {size}"
        )
    assert list(out.parent.iterdir()) == []


def test_info_says_the_subsampling_is_of_the_encoded_records_only(tmp_path):
    s = tmp_path / "src"
    save(s / "a" / "own.jpg", rgb(40, 30, 1), quality=95, subsampling=0)  # 4:4:4, fits: kept
    save(s / "a" / "big.jpg", rgb(96, 64, 2), quality=95)  # resized: encoded
    out = tmp_path / "p.bin"
    assert run(s, out, "--codec", "jpeg", "--resize", "fit", "--size", "40").exit_code == 0
    own = (s / "a" / "own.jpg").read_bytes()
    assert own in out.read_bytes()  # its record is the source's own 4:4:4 stream
    assert JpegImagePlugin.get_sampling(Image.open(io.BytesIO(own))) == 0
    shown = run("info", out)
    assert shown.exit_code == 0
    assert (
        "jpeg: 1 record encoded at quality 90, 4:2:0; 1 stored as they came "
        "(the source's own JPEG, with its own quality and subsampling)\n"
    ) in shown.stdout
    small = tmp_path / "small.bin"  # every source resized
    assert run(s, small, "--codec", "jpeg", "--size", "16", "--quiet").exit_code == 0
    assert "jpeg: 2 records encoded at quality 90, 4:2:0; 0 stored as" in run("info", small).stdout
    (s / "a" / "big.jpg").unlink()
    whole = tmp_path / "whole.bin"  # every source kept
    assert run(s, whole, "--codec", "jpeg", "--resize", "fit", "--size", "40").exit_code == 0
    assert "jpeg: 0 records encoded at quality 90, 4:2:0; 1 stored as" in run("info", whole).stdout


def test_a_second_run_finds_the_pack_complete_and_another_quality_is_refused(src, tmp_path):
    out = tmp_path / "p.bin"
    first = run(src, out, "--codec", "jpeg", "--size", "32", "--quiet")
    assert first.exit_code == 0, first.output
    before = out.read_bytes()
    again = run(src, out, "--codec", "jpeg", "--size", "32")
    assert again.exit_code == 0 and "already complete" in again.stderr
    other = run(src, out, "--codec", "jpeg", "--size", "32", "--quality", "70")
    assert other.exit_code == 1 and len(other.stderr.strip().splitlines()) == 1
    assert "already exists; use --force" in other.stderr
    assert out.read_bytes() == before


def _corrupt_record(out: Path, k: int, fix_crc: bool) -> str:
    """Damage record ``k``'s stream in place; with ``fix_crc`` its CRC is made to match, so
    only decoding finds it. Returns its source path."""
    import zlib

    idx = json.loads(out.with_suffix(".json").read_text())
    data = bytearray(out.read_bytes())
    lengths = np.frombuffer(
        bytes(data), "<u4", idx["count"], idx["fields"]["record_length"]["offset"]
    )
    a = idx["data_offset"] + int(lengths[:k].sum())
    b = a + int(lengths[k])
    if fix_crc:  # a stream cut after its headers, padded to its length: no scan, no EOI
        cut = bytes(data[a:b]).index(b"\xff\xda")
        data[a + cut : b] = bytes(b - a - cut)
        crc = zlib.crc32(bytes(data[a:b])).to_bytes(4, "little")
        at = idx["sections"]["checksums"]["offset"] + 4 * k
        data[at : at + 4] = crc
    else:
        data[(a + b) // 2] ^= 0x55
    out.write_bytes(bytes(data))
    po = idx["sections"]["path_offsets"]["offset"]
    offs = np.frombuffer(bytes(data), "<u8", idx["count"] + 1, po)
    base = idx["sections"]["paths"]["offset"]
    return bytes(data[base + offs[k] : base + offs[k + 1]]).decode()


@pytest.mark.parametrize("fix_crc", [False, True], ids=["bit-rot", "stored-damaged"])
def test_verify_names_a_damaged_record_by_index_and_path(src, tmp_path, fix_crc):
    out = tmp_path / "p.bin"
    assert run(src, out, "--codec", "jpeg", "--size", "32", "--quiet").exit_code == 0
    assert run("verify", out).stdout.endswith("every checksum matches, every record decodes\n")
    rel = _corrupt_record(out, 3, fix_crc)
    result = run("verify", out)
    assert result.exit_code == 1
    what = "JPEG stream does not decode: damaged JPEG record (" if fix_crc else "CRC-32 is"
    assert result.stdout.startswith(f"record 3 ({rel}): {what}"), result.stdout
    assert result.stderr.strip() == "pack-images: error: p.bin: 1 of 9 records damaged"


def test_merge_takes_shards_of_one_quality_only(src, tmp_path):
    shards = []
    for i, quality in enumerate(("90", "90", "75")):
        out = tmp_path / f"s{i}.bin"
        args = ["--num-shards", "2", "--shard-index", str(i % 2), "--quality", quality]
        result = run(src, out, "--codec", "jpeg", "--size", "32", "--quiet", *args)
        assert result.exit_code == 0, result.output
        shards.append(out)
    merged = run("merge", tmp_path / "m.manifest.json", shards[0], shards[1])
    assert merged.exit_code == 0, merged.output
    mixed = run("merge", tmp_path / "x.manifest.json", shards[0], shards[2])
    assert mixed.exit_code == 1
    assert "s2.bin: records are JPEG at quality 75, in " in mixed.stderr
    assert "(merge packs of one --quality)" in mixed.stderr
    assert len(mixed.stderr.strip().splitlines()) == 1


# pack-images with every file's decode (or keep) slowed down, so that it can be killed mid-way
DRIVER = """
import sys, time
from imgpack.packer import parallel
real = parallel.decode_sample
def slow(*args):
    time.sleep(0.03)
    return real(*args)
parallel.decode_sample = slow
from imgpack.packer.cli import main
main(sys.argv[1:], prog_name="pack-images")
"""


def test_a_killed_jpeg_pack_resumes_byte_identical(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from imgpack.packer.journal import journal_path
    from imgpack.packer.pack import pack_folder

    src = tmp_path / "src"
    for k in range(60):  # even: 40x30 baseline JPEGs kept as they are; odd: encoded
        w, h = (40, 30) if k % 2 == 0 else (64, 48)
        save(src / "ab"[k % 3 == 0] / f"{k:02d}.jpg", rgb(w, h, k), quality=90)
    fresh = tmp_path / "fresh" / "p.bin"
    fresh.parent.mkdir()
    pack_folder(src, fresh, size=(40, 40), resize="fit", codec="jpeg", workers=2, progress=False)
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    args = [sys.executable, str(driver), str(src), str(out), "--codec", "jpeg", "--resize",
            "fit", "--size", "40", "--workers", "2", "--quiet"]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    journal = journal_path(out)
    deadline = time.monotonic() + 60
    while proc.poll() is None and (not journal.exists() or journal.read_bytes().count(b"\n") < 21):
        assert time.monotonic() < deadline, "pack-images never got going"
        time.sleep(0.01)
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    lines = [json.loads(x) for x in journal.read_text().splitlines()[1:]]
    assert all(e["len"] >= 2 for e in lines) and sum(e.get("as_is", False) for e in lines) >= 5
    again = subprocess.run(args[:-1], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "pack-images: resuming: " in again.stderr
    assert "jpeg: 30 records encoded at quality 90, 4:2:0; 30 stored as they came" in again.stderr
    assert out.read_bytes() == fresh.read_bytes()
    assert out.with_suffix(".json").read_bytes() == fresh.with_suffix(".json").read_bytes()


def _pillow_outcome(data: bytes, channels: int):
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return np.asarray(img).reshape(img.height, img.width, channels)
    except OSError:
        return "refused"


@pytest.mark.parametrize(
    "mode, kw, damage",
    [
        ("RGB", {"quality": 90}, None),
        ("RGB", {"quality": 75, "progressive": True}, None),
        ("L", {"quality": 90}, None),
        ("RGB", {"quality": 90}, "extraneous"),  # libjpeg warns; Pillow decodes anyway
        ("RGB", {"quality": 90}, "truncated"),
    ],
)
def test_a_record_decodes_to_pillows_pixels_or_is_refused_as_the_reader_refuses_it(
    mode, kw, damage
):
    """decode_jpeg (verify, and the sums of every jpeg record) gives what Pillow gives, pixel
    for pixel; a stream libjpeg warns about is refused, as the reader's strict decode
    refuses it, though Pillow would decode it."""
    from imgpack.packer.jpeg import decode_jpeg

    img = rgb(61, 47, 3).convert(mode)
    data = io.BytesIO()
    img.save(data, "JPEG", **kw)
    data = data.getvalue()
    if damage == "extraneous":
        sos = data.index(b"\xff\xda")
        data = data[:sos] + b"\x00\x00" + data[sos:]
    elif damage == "truncated":
        data = data[: len(data) // 2]
    channels = len(mode)
    want = "refused" if damage else _pillow_outcome(data, channels)
    try:
        got = decode_jpeg(memoryview(data), 61, 47, channels)
    except ValueError:
        got = "refused"
    if isinstance(want, str):
        assert got == want
    else:
        assert got.shape == (47, 61, channels) and np.array_equal(got, want)
