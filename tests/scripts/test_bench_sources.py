"""bench_sources: one quick real run (a folder, tar shards and Parquet files of the same
photographs, packed side by side), its report, and the script's exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from workbench.bench_sources import KINDS, QUICK, run_sources_bench, write_sources
from workbench.bench_sources_report import report
from workbench.errors import BenchError

pytest.importorskip("pyarrow")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_sources.py"


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    work = tmp_path_factory.mktemp("bench_sources")
    log: list[str] = []
    return run_sources_bench(work, quick=True, workers=2, log=log.append), work, log


def test_quick_run_packs_every_kind_side_by_side(quick):
    result, work, log = quick
    assert [r["kind"] for r in result["rows"]] == list(KINDS)
    assert result["settings"]["images"] == QUICK["images"]
    for r in result["rows"]:
        assert r["records_equal"] and len(r["seconds"]) == QUICK["repeats"]
        assert r["images_per_s"] > 0 and r["vs_folder_min"] <= r["vs_folder"] <= r["vs_folder_max"]
        assert r["listing_s"] > 0
    folder = result["rows"][0]
    assert folder["vs_folder"] == folder["vs_folder_min"] == folder["vs_folder_max"] == 1.0
    assert sorted(p.name for p in (work / "tar").iterdir()) == [
        "train-000000.tar",
        "train-000001.tar",
    ]
    assert len(log) == 1 + QUICK["repeats"]


def test_the_report_is_a_table_with_the_verdict(quick):
    text = report(quick[0])
    lines = text.splitlines()
    assert lines[0].startswith("| source | files | MB | median s | images/s | × folder")
    assert [line.split("|")[1].strip() for line in lines[2:5]] == list(KINDS)
    assert "identical" in lines[3] and lines[-1].startswith("Target: every source at >= 0.9x")


def test_a_work_folder_it_did_not_make_is_refused(tmp_path):
    (tmp_path / "precious.txt").write_text("x")
    with pytest.raises(BenchError, match="not empty and not made by bench_sources"):
        write_sources(tmp_path, 10, 1, 0)
    assert (tmp_path / "precious.txt").exists()


def test_the_script_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--workers", "2", "--out", str(out),
         "--work", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| tar |" in done.stdout and json.loads(out.read_text())["rows"][2]["kind"] == "parquet"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("x")
    refused = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--work", str(tmp_path / "mine")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 1 and "not made by bench_sources" in refused.stderr
