"""The load benchmark's storage rows: stretch raw, fit raw and fit yuv420 packs of one folder."""

from __future__ import annotations

import pytest
from workbench.bench_load_storage import storage_rows
from workbench.sample import make_sample_folder


def test_every_storage_rule_gets_a_row_per_transform(tmp_path):
    src = make_sample_folder(tmp_path / "src", classes=2, per_class=3)
    storage = (("stretch", 48, "raw"), ("fit", 64, "raw"), ("fit", 64, "yuv420"))
    rows = storage_rows(src, tmp_path / "w", batch_size=4, repeats=1, size=32,
                        storage=storage, log=lambda _: None)  # fmt: skip
    assert [(r["mode"], r["codec"], r["transform"]) for r in rows] == [
        (m, c, t) for m, _, c in storage for t in ("canvas", "train")
    ]
    for r in rows:
        assert r["row"] == "storage" and r["images"] == 6 and r["images_per_s"] > 0
        assert r["file_bytes_per_image"] > r["pixel_bytes_per_image"]
    by = {(r["mode"], r["codec"]): r for r in rows}
    assert by[("stretch", "raw")]["pixel_bytes_per_image"] == 48 * 48 * 3
    fit, yuv = by[("fit", "raw")], by[("fit", "yuv420")]
    assert fit["pixel_bytes_per_image"] <= 64 * 64 * 3
    assert yuv["pixel_bytes_per_image"] == pytest.approx(fit["pixel_bytes_per_image"] / 2, rel=0.05)
    assert yuv["yuv_to_rgb_on"] in ("cpu", "cuda") and fit["yuv_to_rgb_on"] is None
