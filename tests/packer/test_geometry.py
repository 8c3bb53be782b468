"""Every record's geometry (source size, source box, content box), --crop-ratio and targets."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import photo_like, record_images, records
from PIL import Image, ImageOps
from test_resume import interrupt_after

from imgpack.errors import PackError, SourceError
from imgpack.format.index import read_index
from imgpack.packer import decode as settings
from imgpack.packer.cli import main
from imgpack.packer.decode import fit_size
from imgpack.packer.pack import pack_folder

W, H = 16, 12  # record size (width, height)


def exif_jpeg(path, arr, orientation: int):
    path.parent.mkdir(parents=True, exist_ok=True)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(arr).save(path, exif=exif, quality=95)
    return path


def records_paths(out):
    index = read_index(out)
    offsets, paths = index.read_section("path_offsets"), index.read_section("paths")
    return [index.source_path(i, offsets, paths) for i in range(index.count)]


def read_geometry(out):
    """(source sizes, source boxes, content boxes, paths, pixels) of a finished pack."""
    pix, _, paths, _, index = records(out)
    sizes, sboxes, cboxes = index.geometry()
    return sizes, sboxes, cboxes, paths, pix


def expected_boxes(mode, sw, sh, crop_ratio=1.0):
    """What the packer must record for a (sw x sh) oriented source, by the documented rules."""
    if mode == "center-crop" and crop_ratio != 1.0:  # torchvision: Resize, then CenterCrop
        if W * sh >= H * sw:
            rw, rh = int(W / crop_ratio), int(int(W / crop_ratio) * sh / sw)
        else:
            rw, rh = int(int(H / crop_ratio) * sw / sh), int(H / crop_ratio)
        left, top = int(round((rw - W) / 2.0)), int(round((rh - H) / 2.0))
        fx, fy = sw / rw, sh / rh
        return (left * fx, top * fy, (left + W) * fx, (top + H) * fy), (0, 0, W, H)
    if mode == "center-crop":
        scale = max(W / sw, H / sh)
        cw, ch = W / scale, H / scale
        return ((sw - cw) / 2, (sh - ch) / 2, (sw + cw) / 2, (sh + ch) / 2), (0, 0, W, H)
    if mode == "stretch":
        return (0, 0, sw, sh), (0, 0, W, H)
    scale = min(W / sw, H / sh)
    pw, ph = min(W, max(1, round(sw * scale))), min(H, max(1, round(sh * scale)))
    left, top = (W - pw) // 2, (H - ph) // 2
    return (0, 0, sw, sh), (left, top, left + pw, top + ph)


FIXED = [m for m in settings.RESIZE_MODES if m != "fit"]  # every record W x H


@pytest.mark.parametrize(("mode", "ratio"), [*((m, 1.0) for m in FIXED), ("center-crop", 0.875)])
def test_geometry_round_trips_for_every_mode_and_orientation(tmp_path, mode, ratio):
    src = tmp_path / "src"
    stored = photo_like(60, 34, seed=3)  # not square: every rotation shows
    for o in range(1, 9):
        exif_jpeg(src / f"o{o}.jpg", stored, o)
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(W, H), resize=mode, labels="none", workers=1, crop_ratio=ratio)
    sizes, sboxes, cboxes, paths, pix = read_geometry(out)
    assert paths == [f"o{o}.jpg" for o in range(1, 9)]
    for k, rel in enumerate(paths):
        oriented = ImageOps.exif_transpose(Image.open(src / rel)).convert("RGB")
        assert tuple(sizes[k]) == oriented.size
        sbox, cbox = expected_boxes(mode, *oriented.size, crop_ratio=ratio)
        np.testing.assert_allclose(sboxes[k], sbox, atol=1e-4)
        assert tuple(cboxes[k]) == cbox
        # the record's content is the source box of the oriented image, resampled
        cl, ct, cr, cb = (int(v) for v in cbox)
        ref = np.asarray(oriented.resize((cr - cl, cb - ct), Image.BILINEAR, box=tuple(sbox)))
        got = pix[k, ct:cb, cl:cr].astype(int)
        diff = np.abs(got - ref).mean()
        assert diff < 3, rel
        assert np.abs(got - ref[:, ::-1]).mean() > 3 * max(diff, 1)  # a mirror would show
        if mode == "pad":  # the letterbox outside the content box is the pad fill
            mask = np.ones((H, W), bool)
            mask[ct:cb, cl:cr] = False
            assert not pix[k][mask].any()


@pytest.mark.parametrize("codec", ["raw", "yuv420"])
def test_fit_geometry_round_trips_in_every_orientation(tmp_path, codec):
    """fit: the record is the whole oriented source at its own size, longer side S."""
    src = tmp_path / "src"
    stored = photo_like(60, 34, seed=3)
    for o in range(1, 9):
        exif_jpeg(src / f"o{o}.jpg", stored, o)
    exif_jpeg(src / "small.jpg", photo_like(9, 5, seed=1), 1)  # below S: kept as is
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(W, W), resize="fit", labels="none", workers=1, codec=codec)
    index = read_index(out)
    sizes, sboxes, cboxes = index.geometry()
    images = record_images(out)
    paths = records_paths(out)
    assert paths == [*(f"o{o}.jpg" for o in range(1, 9)), "small.jpg"]
    for k, rel in enumerate(paths):
        oriented = ImageOps.exif_transpose(Image.open(src / rel)).convert("RGB")
        sw, sh = oriented.size
        want = (sw, sh) if max(sw, sh) <= W else fit_size(sw, sh, W)
        assert tuple(index.record_sizes[k]) == want == images[k].shape[1::-1]
        assert tuple(sizes[k]) == (sw, sh) and tuple(sboxes[k]) == (0, 0, sw, sh)
        assert tuple(cboxes[k]) == (0, 0, *want)
        ref = np.asarray(oriented.resize(want, Image.BILINEAR))
        assert np.abs(images[k].astype(int) - ref).mean() < (3 if codec == "raw" else 6), rel
    assert (index.shape, index.codec) == ((W, W, 3), codec)


def test_geometry_is_at_full_resolution_when_draft_decodes_smaller(tmp_path):
    src = tmp_path / "src"
    exif_jpeg(src / "big.jpg", photo_like(800, 600, seed=1), 6)  # rotated: 600 wide, 800 tall
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(32, 32), labels="none", workers=1)
    sizes, sboxes, cboxes, _, _ = read_geometry(out)
    assert sizes.tolist() == [[600, 800]]
    assert sboxes.tolist() == [[0, 100, 600, 700]] and cboxes.tolist() == [[0, 0, 32, 32]]


def test_png_exif_orientation_is_in_the_geometry(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    exif = Image.Exif()
    exif[0x0112] = 8
    Image.fromarray(photo_like(40, 30, seed=5)).save(src / "r.png", exif=exif)
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(W, H), resize="stretch", labels="none", workers=1)
    sizes, sboxes, _, _, pix = read_geometry(out)
    assert sizes.tolist() == [[30, 40]] and sboxes.tolist() == [[0, 0, 30, 40]]
    oriented = ImageOps.exif_transpose(Image.open(src / "r.png")).convert("RGB")
    ref = np.asarray(oriented.resize((W, H), Image.BILINEAR))
    assert np.abs(pix[0].astype(int) - ref).mean() < 1


def test_crop_ratio_is_resize_then_center_crop(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    Image.fromarray(photo_like(64, 48, seed=2)).save(src / "a.png")
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(32, 32), crop_ratio=0.875, labels="none", workers=1)
    sizes, sboxes, _, _, pix = read_geometry(out)
    # torchvision: Resize(int(32 / 0.875) = 36) gives 48x36, CenterCrop(32) starts at (8, 2);
    # in source pixels (x 64/48, y 48/36) that is the box below
    np.testing.assert_allclose(sboxes[0], [32 / 3, 8 / 3, 32 / 3 + 128 / 3, 8 / 3 + 128 / 3])
    img = Image.open(src / "a.png").convert("RGB")
    tv = np.asarray(img.resize((48, 36), Image.BILINEAR).crop((8, 2, 40, 34)))
    diff = np.abs(pix[0].astype(int) - tv)  # Pillow's 8-bit pass between the two axes: +-2
    assert diff.max() <= 2 and diff.mean() < 0.3
    index = json.loads(out.with_suffix(".json").read_text())
    assert index["packer"]["crop_ratio"] == 0.875


def test_crop_ratio_one_is_todays_pack(tmp_path, image_folder):
    src = image_folder(per_class=2)
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    pack_folder(src, a, size=(W, H), workers=1)
    pack_folder(src, b, size=(W, H), workers=1, crop_ratio=1.0)
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.01, 2, "0.9", True, float("nan")])
def test_crop_ratio_outside_0_1_is_refused(bad):
    with pytest.raises(ValueError, match="crop_ratio must be a number in \\(0, 1\\]"):
        settings.DecodeSettings(8, 8, crop_ratio=bad)


def test_crop_ratio_needs_center_crop():
    with pytest.raises(ValueError, match="crop_ratio 0.875 needs --resize center-crop, not pad"):
        settings.DecodeSettings(8, 8, resize="pad", crop_ratio=0.875)


def _targets(src):
    rels = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.jpg"))
    return {rel: [float(k), -0.5 * k, 1.0] for k, rel in enumerate(rels)}


def test_targets_are_stored_per_record_in_pack_order(tmp_path, image_folder):
    src = image_folder(per_class=3)
    (src / "dog" / "broken.jpg").write_bytes(b"nope")  # skipped: its target is not stored
    targets = _targets(src)
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(W, H), workers=2, targets=targets)
    _, _, paths, _, index = records(out)
    got = index.target_vectors()
    assert got.shape == (6, 3) and got.dtype == np.float32
    assert got.tolist() == [targets[p] for p in paths]
    assert index.fields["targets"].shape == (3,)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda t: t.pop("cat/001.jpg"), r"cat/001\.jpg: no target vector given"),
        (lambda t: t.__setitem__("dog/000.jpg", [1.0]), r"dog/000\.jpg: target vector has 1 val"),
        (lambda t: t.__setitem__("cat/002.jpg", ["a", 1, 2]), r"cat/002\.jpg: target vector \["),
        (lambda t: t.__setitem__("cat/000.jpg", []), r"cat/000\.jpg: target vector has 0 values"),
        (lambda t: t.__setitem__("dog/001.jpg", [1, float("nan"), 0]), r"dog/001\.jpg: .* not fin"),
        (lambda t: t.__setitem__("dog/002.jpg", [1, 1e39, 0]), r"dog/002\.jpg: .* not finite as"),
    ],
)
def test_bad_targets_are_refused_before_packing(tmp_path, image_folder, edit, match):
    src = image_folder(per_class=3)
    targets = _targets(src)
    edit(targets)
    with pytest.raises(SourceError, match=match):
        pack_folder(src, tmp_path / "p.bin", size=(W, H), workers=1, targets=targets)
    assert not list(tmp_path.glob("p.*"))


def test_v2_pack_is_byte_identical_at_any_worker_count(tmp_path, image_folder):
    src = image_folder(per_class=5, width=50, height=31)
    kw = dict(size=(W, H), resize="pad", channels=1, targets=_targets(src))
    one, three = tmp_path / "1" / "p.bin", tmp_path / "3" / "p.bin"
    one.parent.mkdir()
    three.parent.mkdir()
    pack_folder(src, one, workers=1, **kw)
    pack_folder(src, three, workers=3, **kw)
    assert one.read_bytes() == three.read_bytes()
    assert one.with_suffix(".json").read_bytes() == three.with_suffix(".json").read_bytes()


def test_resume_keeps_geometry_channels_and_targets_byte_identical(
    tmp_path, image_folder, monkeypatch
):
    src = image_folder(per_class=6, width=50, height=31)
    targets = _targets(src)
    kw = dict(size=(W, H), resize="pad", channels=1, targets=targets)
    fresh = tmp_path / "fresh" / "p.bin"
    fresh.parent.mkdir()
    pack_folder(src, fresh, workers=2, **kw)
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    restore = interrupt_after(monkeypatch, 7)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(src, out, workers=1, **kw)
    restore()
    other = {**targets, "cat/000.jpg": [9.0, 9.0, 9.0]}
    with pytest.raises(PackError, match="settings differ: the target vectors"):
        pack_folder(src, out, workers=1, resume=True, **{**kw, "targets": other})
    with pytest.raises(PackError, match="settings differ: --channels 1 then, 3 now"):
        pack_folder(src, out, workers=1, resume=True, **{**kw, "channels": 3})
    summary = pack_folder(src, out, workers=2, resume=True, **kw)
    assert summary.resumed == 6
    assert out.read_bytes() == fresh.read_bytes()
    assert out.with_suffix(".json").read_bytes() == fresh.with_suffix(".json").read_bytes()


@pytest.mark.parametrize("bad", [[2**40, 5], [0, 5], [True, 5], ["8", 5]])
def test_a_journal_line_with_impossible_geometry_is_redone(
    tmp_path, image_folder, monkeypatch, bad
):
    from imgpack.packer.journal import journal_path

    src = image_folder(per_class=4)
    fresh = tmp_path / "fresh" / "p.bin"
    fresh.parent.mkdir()
    pack_folder(src, fresh, size=(W, H), workers=1)
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    restore = interrupt_after(monkeypatch, 6)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(src, out, size=(W, H), workers=1)
    restore()
    lines = journal_path(out).read_text().splitlines(keepends=True)
    entry = json.loads(lines[3])  # the header, then records 0, 1, 2: record 2's geometry
    entry["geo"][:2] = bad
    lines[3] = json.dumps(entry) + "\n"
    journal_path(out).write_text("".join(lines))
    summary = pack_folder(src, out, size=(W, H), workers=1, resume=True)
    assert summary.resumed == 2
    assert out.read_bytes() == fresh.read_bytes()


@pytest.mark.parametrize(("size", "ratio"), [("224", 0.875), ("96", 0.75), ("100x60", 0.9)])
def test_crop_ratio_pack_is_torchvisions_eval_transform_by_hand(tmp_path, size, ratio):
    """pack-images --crop-ratio R against Resize(int(size/R)) + CenterCrop(size) done by hand
    with Pillow on the rotated source (odd margins: the crop offset's rounding shows)."""
    src = tmp_path / "src"
    src.mkdir()
    shapes = [(500, 375), (375, 500), (641, 480), (301, 250)]
    for k, (w, h) in enumerate(shapes):
        exif = Image.Exif()
        exif[0x0112] = (1, 3, 6, 2)[k]
        Image.fromarray(photo_like(w, h, seed=k)).save(src / f"{k}.png", exif=exif)
    out = tmp_path / "p.bin"
    result = CliRunner().invoke(
        main, [str(src), str(out), "--size", size, "--crop-ratio", str(ratio), "--labels", "none"]
    )
    assert result.exit_code == 0, result.output
    tw, th = settings.parse_size(size)
    _, _, _, paths, pix = read_geometry(out)
    for k, rel in enumerate(paths):
        img = ImageOps.exif_transpose(Image.open(src / rel)).convert("RGB")
        w, h = img.size
        if tw * h >= th * w:
            rw = int(tw / ratio)
            rh = int(rw * h / w)
        else:
            rh = int(th / ratio)
            rw = int(rh * w / h)
        left, top = int(round((rw - tw) / 2.0)), int(round((rh - th) / 2.0))
        tv = np.asarray(img.resize((rw, rh), Image.BILINEAR).crop((left, top, left + tw, top + th)))
        diff = np.abs(pix[k].astype(int) - tv)
        assert diff.max() <= 2 and diff.mean() < 0.3, (rel, size)
