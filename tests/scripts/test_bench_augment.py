"""The augmentation benchmark's quick run: every setting measured, and the numbers hang together."""

from __future__ import annotations

import json

from click.testing import CliRunner
from workbench.bench_augment_run import report, run_augment_bench


def test_quick_run_measures_every_setting(tmp_path):
    result = run_augment_bench(tmp_path, quick=True)
    rows = {(r["mode"], r["side"]): r for r in result["fidelity"]}
    assert [r["filter"] for r in result["fidelity"]] == ["bilinear"] * 3 + ["area"]
    assert set(rows) == {("center-crop", 224), ("stretch", 64), ("pad", 64), ("ffcv", 64)}
    for (mode, side), r in rows.items():
        if mode != "ffcv":
            assert r["bytes"] == side * side * 3 and r["file_bytes"] > r["bytes"]
            # the transform reproduces the exact resample of the record (Pillow's own rounding)
            assert r["train"]["vs_exact"] > 50 and r["eval"]["vs_exact"] > 50
        else:
            assert r["bytes"] < 64 * 64 * 3 and r["train"]["vs_original"] is None
        assert 20 < r["train"]["exact_vs_orig"] < 99 and 20 < r["eval"]["exact_vs_orig"] < 99
    assert rows[("center-crop", 224)]["visible"] < 1 and rows[("stretch", 64)]["visible"] == 1
    # storing at 224 loses less than storing at 64
    assert (
        rows[("center-crop", 224)]["eval"]["exact_vs_orig"]
        > rows[("stretch", 64)]["eval"]["exact_vs_orig"]
    )
    by = {r["method"]: r for r in result["resamplers"]}
    assert (
        by["matmul (Pillow weights)"]["psnr_vs_pillow"]
        > by["grid_sample bilinear"]["psnr_vs_pillow"]
    )
    assert all(r["images_per_s"] > 0 for r in result["resamplers"])
    assert result["speed"][0]["device"] == "cpu" and result["speed"][0]["train_images_per_s"] > 0
    table = report(result)
    assert "| stretch 64 bilinear | 12,288 | 16 |" in table and "grid_sample bilinear" in table
    json.dumps(result)  # the JSON the script writes


def test_cli_rejects_a_bad_flag():
    import bench_augment

    res = CliRunner().invoke(bench_augment.main, ["--seed", "x"])
    assert res.exit_code == 2 and "Invalid value for '--seed'" in res.output
