"""--channels 1: Pillow's convert("L") of the RGB record, one byte per pixel, all the way down."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import photo_like, records, write_image
from PIL import Image

from imgpack.errors import FormatError
from imgpack.packer.cli import main
from imgpack.packer.merge import merge_packs
from imgpack.packer.pack import pack_folder
from imgpack.packer.verify import info_lines, pack_info, verify_pack


@pytest.fixture
def mixed(tmp_path):
    """RGB JPEG, RGBA PNG with transparency, grayscale, palette and 16-bit PNGs."""
    src = tmp_path / "src"
    write_image(src / "a" / "rgb.jpg", 40, 30, seed=1)
    rgba = np.dstack(
        [photo_like(30, 40, seed=2), np.tile(np.arange(30, dtype=np.uint8) * 8, (40, 1))]
    )
    Image.fromarray(rgba, "RGBA").save(src / "a" / "alpha.png")
    (src / "b").mkdir()
    Image.fromarray(photo_like(33, 33, seed=3)[..., 0]).save(src / "b" / "gray.png")
    Image.fromarray(photo_like(20, 50, seed=4)).convert("P").save(src / "b" / "pal.png")
    wide = photo_like(25, 25, seed=5)[..., 1].astype(np.uint16) * 257
    Image.fromarray(wide).save(src / "b" / "deep.png")
    return src


@pytest.mark.parametrize("resize", ["center-crop", "pad", "stretch"])
def test_one_channel_records_are_l_of_the_rgb_records(tmp_path, mixed, resize):
    rgb, gray = tmp_path / "rgb.bin", tmp_path / "gray.bin"
    pack_folder(mixed, rgb, size=(12, 10), resize=resize, workers=1)
    pack_folder(mixed, gray, size=(12, 10), resize=resize, workers=2, channels=1)
    pix3, lab3, paths3, _, _ = records(rgb)
    pix1, lab1, paths1, _, index = records(gray)
    assert (paths1, lab1.tolist()) == (paths3, lab3.tolist()) and len(paths1) == 5
    assert index.shape == (10, 12, 1) and index.record_bytes == 120
    for k in range(len(paths1)):
        want = np.asarray(Image.fromarray(pix3[k]).convert("L"))  # ITU-R 601-2 luma
        np.testing.assert_array_equal(pix1[k, ..., 0], want, err_msg=paths1[k])
    stats = index.raw["stats"]
    assert stats["sum"] == [int(pix1.sum())] and len(stats["mean"]) == len(stats["std"]) == 1
    assert stats["sum_sq"] == [int((pix1.astype(np.int64) ** 2).sum())]
    assert index.raw["packer"]["channels"] == 1
    assert gray.stat().st_size < rgb.stat().st_size


def test_info_verify_and_merge_handle_one_channel(tmp_path, mixed):
    gray, rgb = tmp_path / "gray.bin", tmp_path / "rgb.bin"
    pack_folder(mixed, gray, size=(12, 10), workers=1, channels=1, num_shards=2, shard_index=0)
    info = pack_info(gray)
    assert info["channels"] == 1 and info["shape"] == [10, 12, 1]
    text = "\n".join(info_lines(info))
    assert "10x12x1" in text and "channels: 1 (grayscale)" in text and "pack id" in text
    assert "--channels 1 (imgpack" in text
    assert verify_pack(gray).ok
    with open(gray, "r+b") as f:  # one flipped pixel byte is found in a 1-channel pack too
        f.seek(4096 + 120 + 5)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    assert verify_pack(gray).bad_count == 1
    pack_folder(mixed, rgb, size=(12, 10), workers=1, num_shards=2, shard_index=1)
    with pytest.raises(FormatError, match=r"rgb\.bin: records have 3 channels, in .*gray"):
        merge_packs(tmp_path / "m.json", [gray, rgb])
    pack_folder(mixed, rgb, size=(12, 10), workers=1, num_shards=2, shard_index=1, channels=1,
                force=True)  # fmt: skip
    manifest, _ = merge_packs(tmp_path / "m.json", [gray, rgb], force=True)
    assert manifest["shape"] == [10, 12, 1] and len(manifest["stats"]["sum"]) == 1


def test_cli_channels_and_crop_ratio(tmp_path, mixed):
    out = tmp_path / "g.bin"
    run = CliRunner().invoke(
        main,
        [str(mixed), str(out), "--size", "8", "--channels", "1", "--crop-ratio", "0.875", "-q"],
    )
    assert run.exit_code == 0, run.output
    index = records(out)[4]
    assert index.channels == 1 and index.raw["packer"]["crop_ratio"] == 0.875
    bad = CliRunner().invoke(main, [str(mixed), str(tmp_path / "x.bin"), "--channels", "2"])
    assert bad.exit_code == 2
    bad = CliRunner().invoke(main, [str(mixed), str(tmp_path / "x.bin"), "--crop-ratio", "1.5"])
    assert bad.exit_code == 2 and "(0, 1]" in bad.output
    bad = CliRunner().invoke(
        main, [str(mixed), str(tmp_path / "x.bin"), "--resize", "pad", "--crop-ratio", "0.5"]
    )
    assert bad.exit_code != 0 and "needs --resize center-crop" in bad.output


def test_verify_finds_impossible_geometry(tmp_path, mixed):
    out = tmp_path / "p.bin"
    pack_folder(mixed, out, size=(12, 10), resize="pad", workers=1)
    assert verify_pack(out).ok
    index = records(out)[4]
    f = index.fields["content_box"]
    with open(out, "r+b") as fh:  # record 2's content box now runs past the record
        fh.seek(f.offset + 2 * 16 + 8)
        fh.write(np.array([99.0], "<f4").tobytes())
    report = verify_pack(out)
    assert not report.ok and report.bad_count == 0
    assert "p.bin: record 2: content box lies outside the record (1 records)" in report.problems


@pytest.mark.parametrize("size", [(1, 1), (7, 5), (300, 300)])
def test_one_channel_digests_agree(size):
    from imgpack.packer.writer import digest_stored

    img = Image.fromarray(photo_like(*size, seed=7)).convert("L")
    pixels = np.asarray(img)
    got = digest_stored(img.tobytes(), "raw", *size, 1, img)
    assert got == digest_stored(pixels, "raw", *size, 1)
    assert got[1] == (int(pixels.sum()),) and got[2] == (int((pixels.astype(np.int64) ** 2).sum()),)
