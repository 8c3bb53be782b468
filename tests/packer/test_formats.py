"""Every format Pillow decodes is packed (first frame of animations); nothing else vanishes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import records, write_image
from PIL import Image, features

from imgpack.packer.decode import image_extensions, readable_formats
from imgpack.packer.pack import pack_folder

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def animated(path, colours, **save):
    frames = [Image.new("RGB", (12, 10), c) for c in colours]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=40, **save)
    assert Image.open(path).n_frames == len(colours)
    return path


def test_the_formats_are_pillows_less_the_risky_ones():
    formats = readable_formats()
    assert {"JPEG", "PNG", "GIF", "BMP", "TIFF", "PPM"} <= set(formats)
    assert "EPS" not in formats and "MPEG" not in formats and "HDF5" not in formats
    exts = image_extensions()
    assert {".gif", ".apng", ".jfif", ".tga", ".ico", ".psd", ".qoi"} <= exts
    assert not {".eps", ".ps", ".mpg", ".h5", ".txt"} & exts
    assert all(e == e.lower() and e.startswith(".") for e in exts)


def test_a_folder_of_only_gifs_packs_first_frames(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    animated(src / "a" / "anim.gif", [RED, BLUE, GREEN])
    Image.new("P", (9, 9), 3).save(src / "a" / "STILL.GIF")
    animated(src / "b" / "blue.gif", [BLUE, RED])
    summary = pack_folder(src, tmp_path / "p.bin", size=(4, 4), workers=1)
    assert summary.count == 3 and not summary.skipped
    pix, labels, paths, _, _ = records(tmp_path / "p.bin")
    assert paths == ["a/STILL.GIF", "a/anim.gif", "b/blue.gif"] and labels.tolist() == [0, 0, 1]
    assert np.abs(pix[1].astype(int) - RED).max() <= 1  # the first frame, not the last
    assert np.abs(pix[2].astype(int) - BLUE).max() <= 1


def test_apng_and_animated_webp_give_their_first_frame(tmp_path):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    animated(src / "a.png", [GREEN, RED])
    animated(src / "b.apng", [BLUE, GREEN], format="PNG")
    expect = [GREEN, BLUE]
    if features.check("webp"):
        animated(src / "c.webp", [RED, BLUE], lossless=True)
        expect.append(RED)
    pack_folder(src.parent, tmp_path / "p.bin", size=(4, 4), workers=1)
    pix, _, paths, _, _ = records(tmp_path / "p.bin")
    assert len(paths) == len(expect)
    for record, colour in zip(pix, expect):
        assert np.abs(record.astype(int) - colour).max() <= 2


def test_nothing_vanishes_mixed_folder(tmp_path):
    src = tmp_path / "src"
    for i in range(3):
        write_image(src / "cat" / f"{i}.jpg", seed=i)
    write_image(src / "cat" / "x.tga", seed=5)
    (src / "dog").mkdir()
    animated(src / "dog" / "a.gif", [RED, GREEN])
    if features.check("webp"):
        write_image(src / "dog" / "w.webp", seed=7)
    for name in ("cat/notes.txt", "cat/more.txt", "dog/labels.txt", "dog/scan.psdx"):
        (src / name).write_text("not an image")
    for name in ("cat/.DS_Store", "dog/Thumbs.db", "dog/._a.gif", "desktop.ini"):
        (src / name).write_bytes(b"\0\0")
    (src / "README.md").write_text("about this data")
    out = tmp_path / "p.bin"
    summary = pack_folder(src, out, size=(8, 8), workers=2)
    images = 6 if features.check("webp") else 5
    assert summary.count == images and not summary.skipped
    index = json.loads(out.with_suffix(".json").read_text())
    assert index["excluded"] == [
        {"path": "README.md", "reason": ".md is not an image format Pillow reads"},
        {"path": "cat/more.txt", "reason": ".txt is not an image format Pillow reads"},
        {"path": "cat/notes.txt", "reason": ".txt is not an image format Pillow reads"},
        {"path": "dog/labels.txt", "reason": ".txt is not an image format Pillow reads"},
        {"path": "dog/scan.psdx", "reason": ".psdx is not an image format Pillow reads"},
    ]
    assert index["excluded_hidden"] == 4
    lines = summary.lines()
    assert "left out: 3 .txt, 1 .md, 1 .psdx; see p.json 'excluded'" in lines
    assert "left out: 4 hidden or system files (.*, Thumbs.db, ...)" in lines


@pytest.mark.parametrize("ext, save", [(".bmp", {}), (".tiff", {}), (".ppm", {}), (".ico", {}),
                                       (".tga", {}), (".pcx", {}), (".qoi", {})])  # fmt: skip
def test_each_pillow_written_format_packs(tmp_path, ext, save):
    write_image(tmp_path / "src" / "c" / f"img{ext}", 32, 32, **save)
    summary = pack_folder(tmp_path / "src", tmp_path / "p.bin", size=(8, 8), workers=1)
    assert summary.count == 1 and not summary.skipped


def test_an_mpo_from_a_3d_camera_packs_its_first_picture(tmp_path):
    """Pillow opens .mpo through its JPEG plugin; it is an image, not a file left out."""
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    first, second = Image.new("RGB", (12, 10), RED), Image.new("RGB", (12, 10), BLUE)
    first.save(src / "L.MPO", save_all=True, append_images=[second])
    assert Image.open(src / "L.MPO").format == "MPO"
    summary = pack_folder(tmp_path / "src", tmp_path / "p.bin", size=(4, 4), workers=1)
    assert summary.count == 1 and summary.excluded == []
    pixels, _, paths, _, _ = records(tmp_path / "p.bin")
    assert paths == ["a/L.MPO"]
    assert np.abs(pixels[0].astype(int) - RED).max() <= 2
