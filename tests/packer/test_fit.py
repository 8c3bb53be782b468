"""``--resize fit`` and ``--codec yuv420`` the way a stranger uses them: the command on a
real folder, the pack read back with the format module alone, reruns, resume, info,
verify and merge."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import interrupt_after, record_images, write_image
from PIL import Image

from imgpack.format.codec import rgb_to_yuv420, yuv420_to_rgb
from imgpack.format.index import read_index
from imgpack.packer.cli import main

# (name, width, height): landscape, portrait, square, a strip, one already small
SHAPES = [
    ("cat/wide.jpg", 96, 64),
    ("cat/tall.png", 40, 90),
    ("cat/square.jpg", 50, 50),
    ("dog/strip.png", 120, 20),
    ("dog/small.jpg", 20, 14),
    ("dog/odd.png", 63, 45),
]
FIT = ["--resize", "fit", "--size", "32"]


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return result


@pytest.fixture
def src(tmp_path):
    folder = tmp_path / "src"
    for k, (name, w, h) in enumerate(SHAPES):
        write_image(
            folder / name, w, h, seed=k, **({"quality": 95} if name.endswith(".jpg") else {})
        )
    return folder


def expected_size(w: int, h: int, side: int = 32) -> tuple[int, int]:
    if max(w, h) <= side:
        return w, h
    return (side, max(1, round(h * side / w))) if w >= h else (max(1, round(w * side / h)), side)


def test_fit_yuv420_pack_reads_back_as_pillows_resize(src, tmp_path):
    out = tmp_path / "out.bin"
    result = run(src, out, *FIT, "--codec", "yuv420", "--workers", "2", "--quiet")
    assert result.exit_code == 0, result.output
    index = read_index(out)
    assert (index.raw["format_version"], index.codec, index.shape) == (3, "yuv420", (32, 32, 3))
    assert not index.uniform and index.record_bytes is None
    offsets, paths = index.read_section("path_offsets"), index.read_section("paths")
    names = [index.source_path(i, offsets, paths) for i in range(index.count)]
    assert names == sorted(n for n, _, _ in SHAPES)  # by class, then path
    data = out.read_bytes()
    pixels = 0
    for i, name in enumerate(names):
        _, w, h = next(s for s in SHAPES if s[0] == name)
        want = expected_size(w, h)
        assert tuple(index.record_sizes[i]) == want, name
        a, b = (index.data_offset + int(x) for x in index.record_offsets[i : i + 2])
        assert b - a == want[0] * want[1] + 2 * -(-want[0] // 2) * -(-want[1] // 2)
        got = yuv420_to_rgb(np.frombuffer(data[a:b], np.uint8), *want)
        source = Image.open(src / name).convert("RGB")
        ref = np.asarray(source.resize(want, Image.BILINEAR) if want != (w, h) else source)
        assert np.abs(got.astype(int) - ref).mean() < 6, name  # chroma at half resolution
        # exactly the documented codec, but for JPEG's draft decode (its small error)
        coded = yuv420_to_rgb(rgb_to_yuv420(ref), *want)
        assert np.abs(got.astype(int) - coded).mean() < (1.5 if name.endswith(".jpg") else 0.01)
        pixels += want[0] * want[1]
    assert index.raw["stats"]["pixels"] == pixels
    sums = np.sum([img.reshape(-1, 3).sum(0) for img in record_images(out)], axis=0)
    assert index.raw["stats"]["sum"] == sums.tolist()  # of what a reader gets back
    assert index.raw["packer"]["codec"] == "yuv420" and index.raw["packer"]["resize"] == "fit"


def test_the_same_command_twice_has_nothing_to_do(src, tmp_path):
    out = tmp_path / "out.bin"
    args = (src, out, *FIT, "--codec", "yuv420", "--workers", "1")
    assert run(*args).exit_code == 0
    before = out.read_bytes(), out.with_suffix(".json").read_bytes()
    again = run(*args)
    assert again.exit_code == 0 and "nothing to do" in again.stderr
    assert (out.read_bytes(), out.with_suffix(".json").read_bytes()) == before
    other = run(src, out, *FIT, "--workers", "1")  # raw now: another pack, refused
    assert other.exit_code == 1 and "already exists" in other.stderr


def test_resume_after_an_interruption_gives_identical_bytes(tmp_path, monkeypatch):
    """Records of many sizes (fit): a run stopped after 19 of them continues to the bytes an
    uninterrupted run writes (Ctrl-C on the command itself: tests/packer/test_resume.py)."""
    src = tmp_path / "src"
    for i in range(40):
        write_image(src / f"c{i % 2}" / f"{i:02d}.jpg", 30 + i % 40, 60 - i % 50, seed=i)
    opts = [*FIT, "--codec", "yuv420", "--workers", "2", "--quiet"]
    fresh = tmp_path / "fresh" / "p.bin"
    fresh.parent.mkdir()
    assert run(src, fresh, *opts).exit_code == 0
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    with monkeypatch.context() as mp:
        interrupt_after(mp, 20)
        stopped = run(src, out, *opts)
    assert stopped.exit_code == 130 and "interrupted with 19 records kept" in stopped.stderr
    result = run(src, out, *opts[:-1], "--resume")
    assert result.exit_code == 0 and "resuming: 19 of 40 images" in result.stderr
    assert out.read_bytes() == fresh.read_bytes()
    assert out.with_suffix(".json").read_bytes() == fresh.with_suffix(".json").read_bytes()


def test_info_and_verify_speak_of_sizes_and_codec(src, tmp_path):
    out = tmp_path / "out.bin"
    assert run(src, out, *FIT, "--codec", "yuv420", "--workers", "1", "--quiet").exit_code == 0
    info = run("info", out)
    assert info.exit_code == 0
    first = info.stdout.splitlines()[0]
    assert "6 records up to 32x32x3 (heights 5..32, widths 14..32)" in first
    assert "codec yuv420" in first and "format version 3" in first
    assert "--size 32 --resize fit" in info.stdout and "--codec yuv420" in info.stdout
    as_json = json.loads(run("info", out, "--json").stdout)
    assert as_json["codec"] == "yuv420" and as_json["record_bytes"] is None
    assert as_json["record_heights"] == [5, 32] and as_json["record_widths"] == [14, 32]
    assert run("verify", out).exit_code == 0
    index = read_index(out)
    third = index.data_offset + int(index.record_offsets[2])  # a record at no k * H*W*C
    with open(out, "r+b") as f:
        f.seek(third + 5)
        byte = f.read(1)
        f.seek(third + 5)
        f.write(bytes([byte[0] ^ 0xFF]))
    bad = run("verify", out)
    assert bad.exit_code == 1
    assert "record 2 (cat/wide.jpg): CRC-32 is" in bad.stdout
    assert bad.stderr.strip() == "pack-images: error: out.bin: 1 of 6 records damaged"


def test_merge_keeps_one_codec_and_one_bound(src, tmp_path):
    def pack(name, *extra):
        out = tmp_path / name
        shard = ["--num-shards", "2", "--shard-index", name[-5]]
        assert run(src, out, *FIT, *shard, "--workers", "1", "--quiet", *extra).exit_code == 0
        return out

    yuv0, yuv1 = pack("y0.bin", "--codec", "yuv420"), pack("y1.bin", "--codec", "yuv420")
    ok = run("merge", tmp_path / "m.manifest.json", yuv0, yuv1)
    assert ok.exit_code == 0, ok.output
    manifest = json.loads((tmp_path / "m.manifest.json").read_text())
    assert manifest["codec"] == "yuv420" and manifest["count"] == 6
    assert manifest["stats"]["pixels"] == sum(
        read_index(p).raw["stats"]["pixels"] for p in (yuv0, yuv1)
    )
    raw1 = pack("r1.bin")
    mixed = run("merge", tmp_path / "x.manifest.json", yuv0, raw1)
    assert mixed.exit_code == 1 and mixed.stderr.count("\n") == 1
    assert "r1.bin: records are stored raw, in " in mixed.stderr and "y0.bin yuv420" in mixed.stderr
    big = tmp_path / "b1.bin"
    shard = ["--num-shards", "2", "--shard-index", "1"]
    run(src, big, "--resize", "fit", "--size", "48", *shard, "--codec", "yuv420", "--quiet")
    bounds = run("merge", tmp_path / "z.manifest.json", yuv0, big)
    assert bounds.exit_code == 1 and bounds.stderr.count("\n") == 1
    assert "b1.bin: records are up to 48x48, in " in bounds.stderr
