"""The scale-aware decode benchmark's quick run: every set, output and gap is there, and the
numbers hang together (finite, within physical bounds, monotone in the gap).

No measured value is asserted: the relations are. A larger gap decodes at 1/2 a subset of
a smaller gap's crops, so it never decodes more crops nor fewer pixels.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from workbench.bench_scaled import loader_crop, run_scaled_bench, summarise
from workbench.bench_scaled_report import report, verdict

from imgpack.reader.resample import resample_boxes

GAPS = (3.0, 3.5, 4.0)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    return run_scaled_bench(tmp_path_factory.mktemp("scaled"), quick=True, gaps=GAPS)


def test_every_set_output_and_gap_has_its_row(quick):
    names = {s["name"] for s in quick["sets"]}
    assert names == {"96", "96 to L", "128", "128 to L", "imagenet"}
    grey = {s["name"]: s["grey"] for s in quick["sets"]}
    assert grey["96 to L"] == grey["128 to L"] == 3 and grey["96"] == grey["imagenet"] == 0
    keys = {(r["set"], r["photos"], r["out"], r["gap"]) for r in quick["rows"]}
    for name in names:
        photos = "grey" if name.endswith("to L") else "colour"
        assert {(name, photos, out, g) for out in (16, 8) for g in GAPS} <= keys
    assert len(keys) == len(quick["rows"])


def test_the_numbers_are_finite_and_plausible(quick):
    for r in quick["rows"]:
        assert 0 <= r["misses"] <= r["over"] <= r["at_half"] <= r["crops"]
        assert r["full_over"] <= r["at_half"]
        # at 1/2 a record has a quarter of its pixels (rounded up): 25% to 100%
        assert 0.25 <= r["pixels_decoded"] <= 1 and r["pixels"] > 0
        if r["at_half"]:
            assert math.isfinite(r["loss_db"]) and math.isfinite(r["full_loss_db"])
            assert -20 < r["loss_db"] < 40 and -20 < r["full_loss_db"] < 40
            assert r["pixels_decoded"] < 1
        else:
            assert r["loss_db"] is None and r["pixels_decoded"] == 1
    assert any(r["at_half"] for r in quick["rows"])  # 8 px out of 96-128 px records
    for c in quick["crops"]:  # each kept crop is one some gap decodes at 1/2
        assert c["gap"] >= min(GAPS) and math.isfinite(c["loss_db"])


def test_a_larger_gap_decodes_fewer_crops_at_half(quick):
    by = {(r["set"], r["photos"], r["out"], r["gap"]): r for r in quick["rows"]}
    for (name, photos, out, g), r in by.items():
        if g == GAPS[0]:
            continue
        smaller = by[(name, photos, out, GAPS[GAPS.index(g) - 1])]
        assert r["crops"] == smaller["crops"] and r["at_half"] <= smaller["at_half"]
        assert r["pixels_decoded"] >= smaller["pixels_decoded"]
    # the crops' own gaps say the same: the counts per gap follow from them
    for g in GAPS:
        rows = [r for r in quick["rows"] if r["gap"] == g]
        assert sum(r["at_half"] for r in rows) == sum(c["gap"] >= g for c in quick["crops"])


def test_the_report_and_verdict(quick):
    v = verdict(quick)
    assert set(v) == {"3", "3.5", "4"}
    for gap in v.values():
        assert gap["misses"] <= gap["colour_over"] <= gap["colour_at_half"]
        assert gap["met"] == (gap["misses"] == 0) and 0.25 <= gap["pixels_decoded"] <= 1
    text = report(quick)
    assert "| records | out | crops | 3: at 1/2 |" in text and "| 128 to L | 8 | 9 |" in text
    assert text.count("* gap ") == 3
    assert "| records | quality | bytes/pixel, over 0.5 dB | within |" in text
    assert all(0 < c["bytes_per_pixel"] < 3 for c in quick["crops"])  # at most 24 bits/pixel
    json.dumps(quick)  # the JSON the script writes


def test_the_worst_miss_is_a_miss_not_the_rows_worst_crop():
    # one row, two crops at 1/2: one over 0.5 dB where the full decode misses too (the
    # floor), the other a real miss, smaller; the verdict names the miss and its own floor
    def crop(loss, full):
        return {"set": "384", "quality": 90, "out": 32, "grey": False, "pixels": 100,
                "decoded": [25], "half": [True], "loss_db": loss, "full_loss_db": full}  # fmt: skip

    rows = summarise([crop(2.0, 1.5), crop(0.8, -0.3), crop(0.1, -0.5)], (3.0,))
    (row,) = rows
    assert (row["loss_db"], row["over"], row["misses"]) == (2.0, 2, 1)
    assert (row["worst_miss_db"], row["worst_miss_full_db"]) == (0.8, -0.3)
    result = {"config": {"gaps": [3.0], "qualities": [90]}, "rows": rows}
    w = verdict(result)["3"]["worst_miss"]
    assert (w["loss_db"], w["full_loss_db"], w["where"]) == (0.8, -0.3, "384 colour -> 32")
    del row["worst_miss_db"], row["worst_miss_full_db"]  # a JSON from before: the row's worst
    assert verdict(result)["3"]["worst_miss"]["loss_db"] == 2.0


def test_the_loaders_resample_of_the_reach_is_the_whole_images():
    img = np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    square = img[:, 10:50]  # the box of the whole image at its own size: the pixels
    assert np.allclose(loader_crop(square, [0, 0, 40, 40], 40, False), square)
    whole = torch.from_numpy(img).permute(2, 0, 1)[None]
    for box, flip in (([10.5, 4.25, 41.0, 30.0], True), ([0.5, 0.0, 58.0, 39.5], False)):
        want = resample_boxes(
            whole, torch.tensor([box], dtype=torch.float64), 8, torch.tensor([flip]), torch.float64
        )[0].permute(1, 2, 0)
        assert np.allclose(loader_crop(img, box, 8, flip), want.numpy())


def test_cli_parses_and_refuses_the_lists(tmp_path):
    import bench_scaled

    res = CliRunner().invoke(bench_scaled.main, ["--gaps", "3,x"])
    assert res.exit_code == 2 and "comma-separated numbers" in res.output
    res = CliRunner().invoke(bench_scaled.main, ["--qualities", "0,90"])
    assert res.exit_code == 2 and "should be in [1, 100]" in res.output
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        bench_scaled.main, ["--quick", "--gaps", "4,3", "--out", str(out), "--work", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    assert result["config"]["gaps"] == [3.0, 4.0] and "* gap 4:" in res.output
