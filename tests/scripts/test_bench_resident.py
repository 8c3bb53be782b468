"""scripts/bench_resident.py --quick: both loaders on every pack, the same images, a table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_resident.py"


def test_the_quick_run_measures_both_loaders_on_every_pack(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out), "--work", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=300, cwd=SCRIPT.parent,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    packs = json.loads(out.read_text())["packs"]
    assert set(packs) == {"32x32 raw", "fit 64 yuv420"}
    for name, r in packs.items():
        assert r["streamed"] > 0 and r["resident"] > 0 and r["copy_s"] > 0, name
        assert abs(r["ratio"] - r["resident"] / r["streamed"]) < 1e-9
        assert r["resident_bytes"] >= r["records"] * (3 if r["codec"] == "raw" else 1)
        assert len(r["samples"]["streamed"]) == len(r["samples"]["resident"]) == 1
    assert "| 32x32 raw | 600 |" in proc.stdout and "resident / streamed" in proc.stdout
