"""scripts/bench_cpu.py --quick: every row measured, the ratios from the rates, a table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_cpu.py"


def test_the_quick_run_measures_every_pipeline(tmp_path):
    out = tmp_path / "c.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out), "--work", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=300, cwd=SCRIPT.parent,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rates = result["rates"]
    assert len(rates) == 13 and all(r > 0 for r in rates.values())
    want = rates["imgpack train, jpeg 256"] / rates["FFCV, uint8"]
    assert abs(result["ratios"]["train vs FFCV uint8"] - want) < 1e-9
    want = rates["imgpack eval, jpeg 256"] / rates["FFCV eval, float"]
    assert abs(result["ratios"]["eval vs FFCV eval float"] - want) < 1e-9
    want = rates["imgpack train, jpeg 256, torch crops"] / rates["FFCV, float"]
    assert abs(result["ratios"]["train torch crops vs FFCV float"] - want) < 1e-9
    want = rates["imgpack RGB, yuv420 362, numpy"] / rates["imgpack RGB, raw 362"]
    assert abs(result["ratios"]["yuv420 362 numpy vs raw 362"] - want) < 1e-9
    assert "| FFCV, float |" in proc.stdout and "yuv420 362 vs raw 362" in proc.stdout
