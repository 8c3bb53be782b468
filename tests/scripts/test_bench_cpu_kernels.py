"""The CPU kernels' benchmark, quick run through its CLI: every table's rows exist and hang
together. No timing is asserted (the rates only have to exist); fidelity is: imgpack's crop
resampler keeps every crop within 0.5 dB of the exact resample, and the candidates agree
with what they claim to compute."""

from __future__ import annotations

import json
import math

import bench_cpu_kernels
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import photo_like
from workbench.cpu_candidates import CANDIDATES, imgpack, pillow, rounded, torch_rounded
from workbench.cpu_kernels_report import report


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cpu")
    out = tmp / "r.json"
    res = CliRunner().invoke(
        bench_cpu_kernels.main, ["--quick", "--out", str(out), "--work", str(tmp)]
    )
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text()), res.output


def test_table_a_has_every_side_at_every_thread_count(quick):
    result, _ = quick
    sides = {(r["side"], r["threads"]) for r in result["yuv"]}
    names = {"raw copy", "yuv420 -> RGB, HWC canvas", "yuv420 -> RGB, planar canvas",
             "yuv420 -> RGB, planar canvas, numpy", "RGB copy", "torch canvas"}  # fmt: skip
    assert sides == {(s, t) for s in names for t in (1, 2)}
    for r in result["yuv"]:
        assert r["images_per_s"] > 0 and r["ns_per_pixel"] > 0 and r["scaling"] > 0
        assert (r["vs_raw_copy"] == 1) == (r["side"] == "raw copy")
        assert (r["vs_rgb_copy"] == 1) == (r["side"] == "RGB copy")


def test_table_b_imgpacks_crop_keeps_the_contract(quick):
    result, _ = quick
    rows = result["candidates"]
    assert {(r["kind"], r["candidate"]) for r in rows} == {
        (k, c) for k in ("train", "eval") for c in CANDIDATES
    }
    for r in rows:
        assert r["crops"] == result["config"]["photos"] and r["us_per_crop"] > 0
        assert math.isfinite(r["worst_db"]) and r["worst_db"] >= r["mean_db"]
        assert 0 <= r["over"] <= r["crops"]
        if r["candidate"].startswith("imgpack"):
            assert r["over"] == 0 and r["worst_db"] < 0.5 and r["psnr_vs_exact"] > 45


def test_tables_c_and_d(quick):
    result, output = quick
    assert {(r["kind"], r["threads"]) for r in result["path"]} == {
        (k, t) for k in ("train", "eval") for t in (1, 2)
    }
    for r in result["path"]:
        assert r["ratio"] == pytest.approx(r["imgpack_images_per_s"] / r["ffcv_images_per_s"])
        assert sum(r["scales"].values()) == result["config"]["photos"]
    assert {(r["method"], r["dtype"], r["threads"]) for r in result["normalise"]} == {
        (m, d, t) for m in ("DeviceTransform", "rows") for d in ("float32", "bfloat16")
        for t in (1, 2)
    }  # fmt: skip
    assert report(result) in output  # what the CLI printed: the JSON's own tables
    for r in result["path"]:
        assert r["normalised_images_per_s"] > 0 and r["today_images_per_s"] > 0
        assert set(r["samples_s"]) == {"imgpack", "FFCV", "imgpack + normalise", "today"}
    assert "| crops | threads | imgpack images/s | FFCV images/s | imgpack / FFCV |" in output


@pytest.mark.parametrize(
    "box", [(2.3, 4.6, 50.8, 41.1), (0.0, 0.0, 64.0, 48.0), (5.5, 3.25, 20.5, 18.25)]
)
def test_the_candidates_compute_what_they_claim(box):
    """imgpack's crop (torch aligned to the grid within ALIGN px, else Pillow) lands near
    Pillow's exact one;
    the rounded one is Pillow's of the record cropped to the rounded box (its taps stop at
    the crop's edges, as FFCV's do), to within torch's rounding."""
    record = photo_like(64, 48, seed=2)
    exact, aligned, rounded_out = (np.empty((24, 24, 3), np.uint8) for _ in range(3))
    pillow(record, box, 24, True, exact)
    imgpack(record, box, 24, True, aligned)
    assert np.abs(aligned.astype(int) - exact).max() <= 4
    torch_rounded(record, box, 24, False, rounded_out)
    x0, y0, x1, y1 = rounded(np.asarray(box))
    want = np.empty_like(exact)
    pillow(record[y0:y1, x0:x1], (0, 0, x1 - x0, y1 - y0), 24, False, want)
    assert np.abs(rounded_out.astype(int) - want).max() <= 1
