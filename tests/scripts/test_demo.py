"""The demo at a tiny size: real JPEGs, a real pack, both loaders, the meter's numbers printed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from workbench.demo import DemoResult, format_rows, main, run_demo

from imgpack.diagnose.report import MeterSummary

ROOT = Path(__file__).resolve().parents[2]


def test_run_demo_prints_both_rows_and_the_speedup(tmp_path):
    lines: list[str] = []
    result = run_demo(
        tmp_path / "demo",
        classes=2,
        per_class=12,
        size=32,
        batch_size=4,
        step_ms=1,
        epochs=1,
        progress=False,
        out=lines.append,
    )
    text = "\n".join(lines)
    assert "packed 24 images into train.bin" in text
    base = re.search(r"^per-file PIL decode \(DataLoader\)\s+([\d,]+)\s+(\d+)%", text, re.M)
    fast = re.search(r"^imgpack \(make_loader\)\s+([\d,]+)\s+(\d+)%", text, re.M)
    assert base and fast, text
    speed = re.search(r"^speed-up: ([\d.]+)x images/s; the GPU waits for data (\d+)%", text, re.M)
    assert speed, text
    assert float(speed.group(1)) == round(result.speedup, 1)
    # every batch of the epoch went through the meter (the warm-up batch is reported apart)
    assert result.imgpack.batches == 24 // 4 - 1 and result.imgpack.finished
    assert result.baseline.batches == 24 // 4 - 1  # drop_last: 6 full batches
    assert (tmp_path / "demo" / "train.json").is_file()


def summary(rate, wait):
    return MeterSummary(
        batches=10,
        images=640,
        seconds=1.0,
        wait_s=wait,
        data_wait_fraction=wait,
        images_per_s=rate,
        wait_p50_s=0.01,
        wait_p90_s=0.02,
        wait_p99_s=0.03,
        step_p50_s=0.02,
        first_batch_s=0.5,
        first_batch_images=64,
        finished=True,
    )


def test_format_rows_side_by_side():
    lines = format_rows(
        DemoResult(summary(400.0, 0.9), summary(3000.0, 0.02)), batch_size=64, step_ms=20
    )
    assert lines[0] == (
        "simulated training: 20 ms per batch of 64 (a GPU that could take 3,200 images/s)"
    )
    assert lines[2].split()[-4:] == ["400", "90%", "0.50", "s"]
    assert lines[3].split()[-4:] == ["3,000", "2%", "0.50", "s"]
    assert lines[-1] == (
        "speed-up: 7.5x images/s; the GPU waits for data 90% of the time with per-file "
        "decoding, 2% with imgpack"
    )


def test_cli_sample_and_train_refuse_a_missing_pack(tmp_path):
    out = CliRunner().invoke(
        main, ["sample", str(tmp_path / "img"), "--classes", "1", "--per-class", "4"]
    )
    assert out.exit_code == 0 and "made 4 JPEGs" in out.output
    out = CliRunner().invoke(
        main, ["train", str(tmp_path / "img"), str(tmp_path / "no.bin"), "--batch-size", "2"]
    )
    assert out.exit_code == 1 and "no.json" in out.output and "Traceback" not in out.output


def test_demo_sh_runs_every_step_on_a_tiny_folder(tmp_path):
    """The script itself, end to end, with pip stood in for (no network, nothing installed)."""
    pip_log = tmp_path / "pip.log"
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> {shlex.quote(str(pip_log))}; '
        "exit 0; fi\n"
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    python.chmod(0o755)
    env = {
        **os.environ,
        "PYTHON": str(python),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "DEMO_CLASSES": "2",
        "DEMO_PER_CLASS": "8",
        "DEMO_BATCH": "4",
        "DEMO_STEP_MS": "1",
    }
    work = tmp_path / "work"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "demo.sh"), str(work)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    steps = [line for line in out.splitlines() if line.startswith("== ")]
    assert [s.split()[1] for s in steps] == ["1/4", "2/4", "3/4", "4/4"]
    assert "made 16 JPEGs" in out and "packed 16 images into train.bin" in proc.stderr
    assert re.search(r"^imgpack \(make_loader\)\s+[\d,]+\s+\d+%", out, re.M), out
    assert re.search(r"^speed-up: [\d.]+x images/s", out, re.M), out
    assert (work / "train.json").is_file()
    # torch and this very checkout are importable: neither is installed again
    installs = pip_log.read_text() if pip_log.exists() else ""
    assert "torch" not in installs and "-e ." not in installs, installs
