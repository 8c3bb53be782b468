"""The reader's two small benchmarks run end to end on a tiny pack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import bench_first_batch
import bench_loop

from imgpack.format.index import read_index

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_first_batch_times_a_cold_pack(tmp_path):
    pack = tmp_path / "p.bin"
    bench_first_batch.make_pack(pack, 0.002, size=16)  # 0.002 GiB of 16x16 records
    count = read_index(pack).count
    assert count == 2796  # as many 768-byte records as fit in 2,147,483 bytes
    row = bench_first_batch.first_batch(pack, None, 32)
    assert row["batches"] == -(-count // 32) and 0 < row["first_batch_s"] <= row["epoch_s"]


def test_loop_compares_checkouts_in_one_run(tmp_path):
    root = str(SCRIPTS.parent)
    cmd = [sys.executable, str(SCRIPTS / "bench_loop.py"), "--tree", f"a={root}", "--tree",
           f"b={root}", "--images", "300", "--size", "16", "--batch-size", "32", "--epochs", "1",
           "--rounds", "1", "--pack", str(tmp_path / "loop.bin")]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 2 * len(bench_loop.CASES) and all("rates" in r for r in rows)
    assert "| make_loader(ds, B) |" in out.stdout
