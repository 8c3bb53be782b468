"""The augmentation benchmark's quick run: every setting measured, and the numbers hang together."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from workbench.bench_augment_report import report, verdict
from workbench.bench_augment_run import run_augment_bench

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
    assert fit["source"] == yuv["source"] == "pack"
    assert fit["bytes"] <= 64 * 64 * 3 and yuv["bytes"] <= 72 * 72 * 1.5
    assert fit["file_bytes"] > fit["bytes"] and yuv["file_bytes"] > yuv["bytes"]
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
    assert "ffcv 64 area (FFCV's own filter)" in table and "fit 72 bilinear yuv420 | pack" in table
    assert "grid_sample bilinear" in table and quick["speed"][0]["train_images_per_s"] > 0
    json.dumps(quick)  # the JSON the script writes


def test_cli_rejects_a_bad_flag():
    import bench_augment

    res = CliRunner().invoke(bench_augment.main, ["--seed", "x"])
    assert res.exit_code == 2 and "Invalid value for '--seed'" in res.output
