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


def test_every_case_of_the_loop_times_its_epochs(tmp_path, capsys):
    pack = tmp_path / "loop.bin"
    bench_loop.make_pack(pack, 300, 16)
    for case in bench_loop.CASES.values():  # what each child runs, here (real workers too)
        bench_loop.child(str(pack), case, 32, 2)
        row = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert len(row["rates"]) == 2 and min(row["rates"]) > 0, (case, row)


def test_loop_compares_checkouts_in_one_run(tmp_path):
    # one case, the one with worker processes, in a fresh interpreter per checkout: each
    # costs a torch import, and every case's child is run above
    root = str(SCRIPTS.parent)
    cmd = [sys.executable, str(SCRIPTS / "bench_loop.py"), "--tree", f"a={root}", "--tree",
           f"b={root}", "--images", "300", "--size", "16", "--batch-size", "32", "--epochs", "1",
           "--rounds", "1", "--case", "workers2", "--pack", str(tmp_path / "loop.bin")]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [(r["tree"], r["case"]) for r in rows] == [
        ("a", "make_loader(ds, B, num_workers=2)"), ("b", "make_loader(ds, B, num_workers=2)")
    ]  # fmt: skip
    assert all(len(r["rates"]) == 1 and r["rates"][0] > 0 for r in rows), rows
    table = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert table[0] == "| loop (300 records 16x16, batch 32, warm) | a | b |"
    assert table[1].startswith("| make_loader(ds, B, num_workers=2) | ") and len(table) == 2
    assert "fails" not in table[1]
