"""bench_pack: one tiny real run (sample folders, naive loop, decode ablations, real worker
processes), the naive transform itself, the ratios and targets, the script's exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import PIL
import pytest
from PIL import Image
from workbench.bench_pack import ABLATIONS, QUICK, naive_pixels, run_pack_benchmark
from workbench.bench_pack_report import (
    add_ratios,
    filesystem,
    markdown_report,
    targets,
    write_json,
)
from workbench.errors import BenchError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_pack.py"
RECORD = 224 * 224 * 3


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("bench_pack")
    log: list[str] = []
    result = run_pack_benchmark(workdir=workdir, workers=(1, 2), log=log.append, **QUICK)
    return result, workdir, log


def _rows(result, folder, kind):
    return [r for r in result["rows"] if r["folder"] == folder and r["row"] == kind]


def test_quick_run_measures_every_row_on_both_folders(quick):
    result, _, log = quick
    assert result["folders"]["imagenet-like"]["images"] == QUICK["imagenet_images"]
    assert result["folders"]["large"]["images"] == QUICK["large_images"]
    assert result["folders"]["large"]["min_short_side"] >= 2000
    w, h = result["folders"]["imagenet-like"]["mean_size"]
    assert 300 <= w <= 480 and 280 <= h <= 480
    keys = [
        (r["folder"], r["row"], r["workers"], r.get("draft"), r.get("reducing_gap"))
        for r in result["rows"]
    ]
    assert keys == [
        ("imagenet-like", "naive", 1, None, None),
        ("imagenet-like", "decode", 1, True, None),
        ("imagenet-like", "pack", 1, None, None),
        ("imagenet-like", "pack", 2, None, None),
        ("large", "naive", 1, None, None),
        *[("large", "decode", 1, d, g) for d, g in ABLATIONS],
        ("large", "pack", 1, None, None),
        ("large", "pack", 2, None, None),
    ]
    for r in result["rows"]:
        n = result["folders"][r["folder"]]["images"]
        assert r["images"] == n
        assert len(r["samples"]) == QUICK["repeats"]
        assert 0 < r["min"] <= r["images_per_s"] <= r["max"]
        if r["row"] == "pack":
            assert (r["count"], r["skipped"]) == (n, 0)
            assert r["output_bytes"] > n * RECORD  # header, records, index sections
        else:
            assert r["output_bytes"] == n * RECORD
    assert sum("repeat" in line for line in log) == QUICK["repeats"] * len(result["rows"])


def test_packs_are_identical_across_workers_and_match_the_naive_job(quick):
    result, workdir, _ = quick
    for name, folder in result["folders"].items():
        packs = _rows(result, name, "pack")
        assert folder["identical_across_workers"] is True
        assert len({r["sha256"] for r in packs}) == 1
        # Same job, other arithmetic (one resize of the crop box, draft on the large
        # photos): a few levels of 255 apart on average, not a different picture.
        assert 0 < folder["pack_mean_abs_diff_vs_naive"] < 8
    index = json.loads((workdir / "out" / "imagenet-like-w2.json").read_text())
    assert index["count"] == QUICK["imagenet_images"]


def test_the_quick_run_has_ratios_and_targets(quick):
    result, _, _ = quick
    for name in result["folders"]:
        naive = _rows(result, name, "naive")[0]
        one, two = _rows(result, name, "pack")
        assert naive["x_naive"] == 1.0 and one["efficiency"] == 1.0
        assert two["per_core_x_naive"] > 0 and two["efficiency"] > 0
    assert len(result["targets"]) == 6  # per core at 1 and 2 workers, twice; efficiency, twice


def test_ratios_and_targets_from_known_rates():
    rates = {"imagenet-like": (100.0, 120.0, 204.0), "large": (10.0, 25.0, 40.0)}
    rows = [
        {"folder": f, "row": row, "workers": w, "images_per_s": ips}
        for f, (naive, one, two) in rates.items()
        for row, w, ips in (("naive", 1, naive), ("pack", 1, one), ("pack", 2, two))
    ]
    add_ratios(rows)
    two = rows[2]  # imagenet-like, 2 workers: 2.04x naive, 1.02x per core, 204 / 2 / 120
    assert (two["x_naive"], two["per_core_x_naive"], two["efficiency"]) == (2.04, 1.02, 0.85)
    got = [(t["target"].split(": ", 1)[1], t["value"], t["met"]) for t in targets(rows, [1, 2])]
    assert got == [
        ("pack-images per core at 1 worker vs naive", 1.2, True),
        ("pack-images per core at 2 workers vs naive", 1.02, True),  # goal 1.0
        ("pack-images per core at 1 worker vs naive", 2.5, False),  # large: goal 3.0
        ("pack-images per core at 2 workers vs naive", 2.0, False),
        ("scaling efficiency 1 -> 2 workers", 0.85, True),  # goal 0.85: met when equal
        ("scaling efficiency 1 -> 2 workers", 0.8, False),
    ]


def test_result_records_the_machine_and_how_it_measured(quick, tmp_path):
    result, _, _ = quick
    m = result["machine"]
    assert m["cpu_model"] and m["cpus"] >= 1 and m["usable_cpus"] >= 1
    assert m["pillow"] == PIL.__version__ and m["numpy"] == np.__version__
    assert isinstance(m["libjpeg_turbo"], bool)
    s = result["settings"]
    assert s["repeats"] == QUICK["repeats"] and s["workers"] == [1, 2] and s["size"] == 224
    assert "warm" in s["page_cache"] and "decode_image" in s["ablation"]
    write_json(tmp_path / "r.json", result)
    assert json.loads((tmp_path / "r.json").read_text()) == result
    assert not list(tmp_path.glob(".*tmp"))


def test_markdown_has_a_line_per_row_and_per_target(quick):
    result, _, _ = quick
    text = markdown_report(result)
    lines = text.splitlines()
    assert sum(line.startswith(("| imagenet-like |", "| large |")) for line in lines) == len(
        result["rows"]
    )
    assert sum(
        line.startswith("| imagenet-like:") or line.startswith("| large:") for line in lines
    ) == len(result["targets"])
    assert "| large | decode_image loop, draft off, reducing_gap 2.0 | 1 |" in text


def test_naive_pixels_is_resize_shorter_side_then_centre_crop(tmp_path):
    rng = np.random.default_rng(0)
    square = Image.fromarray(rng.integers(0, 256, (448, 448, 3), dtype=np.uint8))
    square.save(tmp_path / "sq.png")
    assert (
        naive_pixels(tmp_path / "sq.png", 224)
        == square.resize((224, 224), Image.Resampling.BILINEAR).tobytes()
    )
    tall = Image.fromarray(rng.integers(0, 256, (300, 200, 3), dtype=np.uint8)).convert("L")
    tall.save(tmp_path / "tall.png")  # grey: convert("RGB") makes 3 equal channels
    want = tall.convert("RGB").resize((224, 336), Image.Resampling.BILINEAR)
    got = naive_pixels(tmp_path / "tall.png", 224)
    assert got == want.crop((0, 56, 224, 280)).tobytes()


def test_targets_without_two_workers_are_not_measured():
    rows = [
        {"folder": f, "row": row, "workers": 1, "images_per_s": ips}
        for f in ("imagenet-like", "large")
        for row, ips in (("naive", 100.0), ("pack", 350.0))
    ]
    add_ratios(rows)
    got = {t["target"]: (t["value"], t["met"]) for t in targets(rows, [1])}
    assert got["imagenet-like: pack-images per core at 1 worker vs naive"] == (3.5, True)
    assert got["large: pack-images per core at 1 worker vs naive"] == (3.5, True)
    assert got["large: scaling efficiency 1 -> 2 workers"] == (None, None)


def test_filesystem_names_the_mount_holding_a_path():
    if not Path("/proc/mounts").exists():
        assert filesystem(Path.cwd()) is None
    else:  # /proc/<pid> lies on the proc mount, not on whatever holds /
        assert filesystem("/proc/self") == "proc"


def test_refuses_a_work_folder_it_did_not_make(tmp_path):
    mine = tmp_path / "imagenet-like" / "keep.txt"
    mine.parent.mkdir()
    mine.write_text("precious")
    with pytest.raises(BenchError, match="was not made by bench_pack"):
        run_pack_benchmark(workdir=tmp_path, imagenet_images=2, large_images=1, repeats=1)
    assert mine.read_text() == "precious"
    (tmp_path / "file").write_text("")
    with pytest.raises(BenchError, match="is a file"):
        run_pack_benchmark(workdir=tmp_path / "file", repeats=1)
    with pytest.raises(BenchError, match=">= 1"):
        run_pack_benchmark(workdir=tmp_path, repeats=0)


def _script(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_script_quick_run_writes_json_and_prints_the_table(tmp_path):
    out = tmp_path / "results.json"
    args = ("--quick", "--imagenet-images", "10", "--large-images", "1", "--repeats", "1")
    proc = _script(*args, "--workers", "1", "--workdir", str(tmp_path / "w"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["settings"]["repeats"] == 1  # given flags win over --quick's sizes
    assert result["folders"]["imagenet-like"]["images"] == 10
    assert result["command"].startswith("python scripts/bench_pack.py --quick")
    assert "| folder | measurement | workers |" in proc.stdout


def test_script_errors_exit_2_for_usage_and_1_with_one_line(tmp_path):
    assert _script("--workers", "0").returncode == 2
    assert _script("--out", str(tmp_path / "missing" / "r.json")).returncode == 2
    (tmp_path / "imagenet-like").mkdir()
    proc = _script("--quick", "--workdir", str(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"bench_pack: error: {tmp_path / 'imagenet-like'}: exists and was not made by "
        "bench_pack; use another --workdir"
    ]
