"""The JPEG benchmark's quick run: every table's rows are computed and hang together.

No timing is asserted: the rates only have to exist. The fidelity rows are seeded, so
their relations (more quality, more bytes; 4:4:4 above 4:2:0) are checked.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from workbench.bench_jpeg_report import report, verdict
from workbench.bench_jpeg_run import run_jpeg_bench
from workbench.jpeg_decoders import LoopPool, encode, plain_decode, to_decoded

from imgpack.reader.jpeg import GAP, SCALES, decode, scaled_size


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    return run_jpeg_bench(tmp_path_factory.mktemp("jpeg"), quick=True)


def test_table_a_has_every_side_and_quality_beside_ffcvs_rule(quick):
    rows = quick["quality"]
    assert rows[0]["storage"] == "ffcv raw" and rows[0]["bytes_vs_ffcv"] == 1
    jpeg = {(r["side"], r["quality"], r["subsampling"]): r for r in rows if r["storage"] == "jpeg"}
    assert set(jpeg) == {(64, 75, "4:2:0"), (64, 90, "4:2:0"), (96, 75, "4:2:0"),
                         (96, 90, "4:2:0"), (96, 90, "4:4:4")}  # fmt: skip
    for r in rows:
        assert 0 < r["bytes"] and 20 < r["train_psnr"] < 99 and 20 < r["eval_psnr"] < 99
        assert r["as_is"] == 0  # the quick photos are all larger than 96 px
    for side in (64, 96):
        assert jpeg[(side, 75, "4:2:0")]["bytes"] < jpeg[(side, 90, "4:2:0")]["bytes"]
    assert jpeg[(96, 90, "4:4:4")]["bytes"] > jpeg[(96, 90, "4:2:0")]["bytes"]
    assert jpeg[(96, 90, "4:4:4")]["train_psnr"] > jpeg[(96, 90, "4:2:0")]["train_psnr"]
    assert all(r["bytes"] < rows[0]["bytes"] for r in jpeg.values())  # raw is the largest


def test_the_scale_aware_rows_decode_below_full_size_where_the_box_allows(quick):
    rows = quick["scaled"]
    assert {(r["side"], r["size"], r["kind"], r["margin"]) for r in rows} == {
        (s, n, k, m) for s in (64, 96, "as-is") for n in (32, 16) for k in ("train", "eval")
        for m in (1.0, 3.0, GAP)  # the quick run's margins and the reader's rule (jpeg.GAP)
    }  # fmt: skip
    assert sum(r["rule"] for r in rows) == 3 * 2 * 2  # the reader's rule: one row per set
    for r in rows:
        crops = 4 if r["side"] != "as-is" else (2 if r["kind"] == "train" else 1)
        assert sum(r["scales"].values()) == r["crops"] == crops
        assert 20 < r["ffcv_psnr"] < 99
        if r["scales"]["1"] == r["crops"]:  # nothing scaled: the very same pixels
            assert r["scaled"] == r["full"] and r["dct_vs_box"] is None
            assert r["pixels_decoded"] == 1
        else:
            assert r["pixels_decoded"] < 1 and r["dct_vs_box"] > 30
    assert any(r["pixels_decoded"] < 1 for r in rows)  # 16 px out of 96 px records
    # the camera-sized photo kept as it came: its full decode is the truth, 1/8 is plenty
    camera = [r for r in rows if r["side"] == "as-is"]
    assert all(r["full"] == 99 for r in camera)
    assert all(r["scales"]["8"] == r["crops"] for r in camera if r["margin"] == 1)
    # the reader's rule never goes below 1/2 (jpeg.PICK_SCALES)
    assert all(r["scales"]["4"] == r["scales"]["8"] == 0 for r in rows if r["rule"])
    assert any(r["scales"]["2"] for r in camera if r["rule"])
    assert all(r["scaled_vs_full"] > 45 for r in camera)


def test_tables_b_and_c_and_the_report(quick):
    dec = {(r["decoder"], r["threads"]): r for r in quick["decode"]}
    names = (
        "imgpack decode_into",
        "imgpack decode_into, packed",
        "imgpack decode",
        "simplejpeg loop",
        "Pillow loop",
    )
    assert set(dec) == {(d, t) for d in names for t in (1, 2)}
    assert all(r["images_per_s"] > 0 and len(r["samples_s"]) == 2 for r in dec.values())
    assert dec[("simplejpeg loop", 1)]["vs_simplejpeg"] == 1
    assert [r["threads"] for r in quick["delivery"]] == [1, 2]
    for r in quick["delivery"]:
        assert r["imgpack_images_per_s"] > 0 and r["ffcv_images_per_s"] > 0
        assert r["packed_images_per_s"] > 0 and len(r["packed_samples_s"]) == 2
        # the draws of the loader's first epoch: every record once
        assert sum(r["scales"].values()) == quick["records"]["count"] == 4
    assert quick["records"]["side"] == 96 and quick["records"]["stored_as_is"] == 0
    assert quick["load_after"]
    table = report(quick)
    assert "| ffcv raw 64 | 0 |" in table and "| jpeg 96 q90 4:4:4 |" in table
    assert "| simplejpeg loop | 1 |" in table and "FFCV pipeline images/s" in table
    assert "--codec jpeg --quality 90 pack of 4 (0 stored as they came)" in table
    assert "| imgpack decode_into, packed | 2 |" in table
    assert set(verdict(quick)) == {"per_core", "scaling", "per_core_packed", "scaling_packed",
                                   "delivery_1", "delivery_2", "delivery_packed_1",
                                   "delivery_packed_2", "scaled_loss_db"}  # fmt: skip
    json.dumps(quick)  # the JSON the script writes


def test_the_helpers_decode_as_the_reader_and_boxes_divide():
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (50, 70, 3), np.uint8))
    buf = encode(img, 90)
    assert np.array_equal(plain_decode(buf), decode(buf, 70, 50, 3))
    for d in SCALES:
        assert decode(buf, 70, 50, 3, scale=d).shape[1::-1] == scaled_size(70, 50, d)
    assert to_decoded(np.array([[8.0, 4, 40, 20]]), np.array([4])).tolist() == [[2, 1, 10, 5]]
    pool, seen = LoopPool(), []
    pool.run(10, seen.append, 2)
    pool.close()
    assert sorted(seen) == list(range(10))


def test_cli_refuses_exclusive_flags():
    import bench_jpeg

    res = CliRunner().invoke(bench_jpeg.main, ["--fidelity-only", "--speed-only"])
    assert res.exit_code == 2 and "exclude each other" in res.output
    res = CliRunner().invoke(bench_jpeg.main, ["--seed", "x"])
    assert res.exit_code == 2 and "Invalid value for '--seed'" in res.output


def test_a_kept_work_folder_gets_the_same_photos_again(tmp_path):
    for _ in range(2):
        result = run_jpeg_bench(tmp_path, quick=True, fidelity=False, speed=False)
        assert result["photos"]["images"] == 4 and not result["quality"] and not result["decode"]
