"""The augmentation benchmark's quick run: every setting measured, and the numbers hang together."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from workbench.bench_augment_report import report, verdict
from workbench.bench_augment_run import run_augment_bench
from workbench.bench_storage import fit_size, yuv420_decode, yuv420_encode, yuv420_nbytes

ROW_KEYS = {"photos", "images", "train_crops", "mode", "side", "filter", "codec", "source",
            "bytes", "file_bytes", "visible", "train", "eval"}  # fmt: skip
PSNR_KEYS = {"vs_original", "exact_vs_orig", "vs_exact"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    return run_augment_bench(tmp_path_factory.mktemp("augment"), quick=True)


def test_quick_run_measures_every_setting_on_both_photo_sets(quick):
    rows = quick["fidelity"]
    assert {r["photos"] for r in rows} == {"natives", "cuts"}
    assert quick["sets"]["natives"]["images"] == 2 and quick["sets"]["cuts"]["images"] == 2
    for r in rows:
        assert set(r) == ROW_KEYS and set(r["train"]) == PSNR_KEYS and set(r["eval"]) == PSNR_KEYS
        assert r["train_crops"] == 2 * r["images"]
        assert 20 < r["train"]["exact_vs_orig"] < 99 and 20 < r["eval"]["exact_vs_orig"] < 99
        if r["mode"] == "ffcv":
            assert r["source"] == "emulated" and r["train"]["vs_original"] is None
            assert r["bytes"] <= 64 * 64 * 3
        else:
            # the transform reproduces the exact resample of the record (Pillow's own rounding)
            assert r["train"]["vs_exact"] > 50 and r["eval"]["vs_exact"] > 50
    by = {(r["photos"], r["mode"], r["codec"]): r for r in rows}
    stretch = by[("cuts", "stretch", "raw")]
    assert stretch["source"] == "pack" and stretch["bytes"] == 48 * 48 * 3
    assert stretch["file_bytes"] > stretch["bytes"] and stretch["visible"] == 1
    assert by[("cuts", "center-crop", "raw")]["visible"] < 1
    fit, yuv = by[("cuts", "fit", "raw")], by[("cuts", "fit", "yuv420")]
    assert fit["bytes"] <= 64 * 64 * 3 and yuv["bytes"] <= 72 * 72 * 1.5
    # fit keeps the aspect: the same bytes as FFCV's rule give or take the rounding
    ffcv = by[("cuts", "ffcv", "raw")]
    assert abs(fit["bytes"] - ffcv["bytes"]) / ffcv["bytes"] < 0.05


def test_the_report_and_the_verdicts(quick):
    v = verdict(quick["fidelity"])
    assert {(t["photos"], t["filter"]) for t in v["target"]} == {
        ("natives", "bilinear"),
        ("cuts", "bilinear"),
    }
    for t in v["target"]:
        assert t["best_bytes"] <= t["ffcv_bytes"] and t["met"] == (t["gain_train"] >= 1.5)
    assert v["transform_within"]
    table = report(quick)
    assert "| stretch 48 bilinear | pack | 6,912 |" in table
    assert "ffcv 64 area (FFCV's own filter)" in table and "fit 72 bilinear yuv420 | sim" in table
    assert "grid_sample bilinear" in table and quick["speed"][0]["train_images_per_s"] > 0
    json.dumps(quick)  # the JSON the script writes


def test_yuv420_follows_the_contract_by_hand():
    rgb = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255]]], dtype=np.uint8)  # 3x1
    buf = yuv420_encode(rgb)
    assert buf.size == yuv420_nbytes(3, 1) == 3 + 2 * 2 * 1
    assert list(buf[:3]) == [76, 150, 29]  # 0.299*255 = 76.2, 0.587*255 = 149.7, 29.07
    # chroma: the mean of the 2 pixels of the first block, the 1 pixel of the odd edge
    cb0 = 128 + (-0.168736 * 255 - 0.331264 * 255) / 2
    cr1 = 128 - 0.081312 * 255
    assert buf[3] == np.floor(cb0 + 0.5) and buf[6] == np.floor(cr1 + 0.5)
    back = yuv420_decode(buf, 3, 1)
    assert back.shape == (1, 3, 3) and back.dtype == np.uint8


def test_yuv420_keeps_grey_and_flat_colour_and_odd_sizes():
    rng = np.random.default_rng(0)
    grey = np.repeat(rng.integers(0, 256, (5, 7, 1), dtype=np.uint8), 3, axis=2)
    assert np.abs(yuv420_decode(yuv420_encode(grey), 7, 5).astype(int) - grey).max() <= 1
    flat = np.broadcast_to(np.array([200, 120, 40], dtype=np.uint8), (3, 5, 3)).copy()
    assert np.abs(yuv420_decode(yuv420_encode(flat), 5, 3).astype(int) - flat).max() <= 2


def test_yuv420_matches_the_format_module_when_it_exists():
    codec = pytest.importorskip("imgpack.format.codec")
    rgb = np.random.default_rng(1).integers(0, 256, (9, 11, 3), dtype=np.uint8)
    buf = yuv420_encode(rgb)
    assert np.array_equal(codec.rgb_to_yuv420(rgb), buf)
    assert np.array_equal(codec.yuv420_to_rgb(buf, 11, 9), yuv420_decode(buf, 11, 9))


def test_fit_keeps_the_aspect_and_never_upscales():
    assert fit_size(400, 300, 256) == (256, 192)
    assert fit_size(300, 200, 362) == (300, 200)
    assert fit_size(300, 400, 362) == (272, 362)
    assert fit_size(1000, 3, 256) == (256, 1)


def test_cli_rejects_a_bad_flag():
    import bench_augment

    res = CliRunner().invoke(bench_augment.main, ["--seed", "x"])
    assert res.exit_code == 2 and "Invalid value for '--seed'" in res.output
