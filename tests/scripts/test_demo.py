"""The demo at a tiny size: real JPEGs, a real pack, both loaders, the meter's numbers printed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from click.testing import CliRunner
from workbench.demo import DemoResult, format_rows, main, run_demo

from imgpack.diagnose.meter import MeterSummary

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


def test_demo_sh_is_valid_bash_and_uses_the_documented_steps():
    script = ROOT / "scripts" / "demo.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert 'pip install -q "torch==2.13.0"' in text and "--no-deps scikit-image" in text
    assert "--size 224" in text and "demo.py train" in text
