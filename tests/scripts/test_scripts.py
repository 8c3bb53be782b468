"""The scripts under scripts/ run as a user runs them, at a tiny size, and print their tables.

Nothing here imports a script: each runs in its own interpreter, its results and samples in
``tmp_path`` (``IMGPACK_SCRIPTS_OUT``). The numbers are not checked (tests never check speed);
that each script runs to its table, and the training examples' resume, are.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from preloaded import Preloaded

from imgpack.packer.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def environment(out: Path, **extra: str) -> dict[str, str]:
    """The scripts' environment: results in ``out``, this checkout first, no torchrun
    variables but those in ``extra``."""
    env = {**os.environ, "IMGPACK_SCRIPTS_OUT": str(out), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return {**env, **extra}


def run(preloaded: Preloaded, *args: str, out: Path, cwd: Path | None = None) -> str:
    """The script's output; it must exit 0."""
    [(code, stdout, stderr)] = preloaded.run((args, cwd or out, environment(out)), timeout=240)
    assert code == 0, stderr[-3000:]
    return stdout


def pack_images(*args: str) -> None:
    """The packer's command line, in this process (the scripts' own runs are what is tested)."""
    done = CliRunner().invoke(main, [*args])
    assert done.exit_code == 0, done.output


def two_ranks(preloaded: Preloaded, *args: str, out: Path) -> str:
    """The script as torchrun starts it on one machine: two ranks, the group's address in
    their environment (without the launcher's own interpreter); rank 0's output."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    group = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    ranks = preloaded.run(
        *[(args, out, environment(out, **group, RANK=r, LOCAL_RANK=r)) for r in ("0", "1")],
        timeout=240,
    )
    for code, _, stderr in ranks:
        assert code == 0, stderr[-3000:]
    return ranks[0][1]


TINY = {
    "bench_load.py": ["--images", "40", "--size", "16", "--batch-size", "8", "--repeats", "1"],
    "bench_pack.py": ["--images", "10", "--size", "32", "--repeats", "1", "--workers", "1"],
    "bench_codecs.py": ["--images", "10", "--fit", "32", "--crop", "16", "--batch-size", "8",
                        "--repeats", "1"],
    "bench_crops.py": ["--images", "10", "--fit", "32", "--size", "16", "--batch-size", "8",
                       "--repeats", "1"],
    "bench_fidelity.py": ["--images", "10", "--fit", "32", "--ffcv", "24", "--crop", "16",
                          "--crops", "1"],
    "gpu_proof.py": ["--dry-run"],
}  # fmt: skip


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """One results folder for the benchmarks: bench_crops reuses the sample and the jpeg pack
    bench_codecs made, as it would in out/."""
    return tmp_path_factory.mktemp("out")


@pytest.mark.parametrize("script", TINY)
def test_a_benchmark_prints_its_table_and_writes_its_results_outside_docs(preloaded, script, out):
    printed = run(preloaded, str(SCRIPTS / script), *TINY[script], out=out)
    table = [line for line in printed.splitlines() if line.startswith("|")]
    assert len(table) >= 3 and table[1].startswith("|---"), printed
    result = json.loads((out / script).with_suffix(".json").read_text())
    assert "machine" in result


def test_the_demo_packs_a_sample_and_prints_the_speed_up(preloaded, tmp_path):
    printed = run(preloaded, str(SCRIPTS / "demo.py"), str(tmp_path / "demo"), "--classes", "2",
                  "--per-class", "8", "--size", "16", "--batch-size", "4", "--step-ms", "1",
                  "--epochs", "1", out=tmp_path)  # fmt: skip
    assert "per-file PIL decode" in printed and "speed-up: " in printed
    assert (tmp_path / "demo" / "train.bin").exists()


@pytest.mark.parametrize("script", ["demo.sh", "test.sh"])
def test_the_readme_commands_parse(script):
    assert subprocess.run(["bash", "-n", str(SCRIPTS / script)]).returncode == 0


def test_the_training_example_stops_and_resumes_at_the_next_batch(
    preloaded, image_folder, tmp_path
):
    src = image_folder(classes=("ant", "bee"), per_class=6, width=40, height=30, ext=".png")
    pack = tmp_path / "t.bin"
    pack_images(str(src), str(pack), "--resize", "fit", "--size", "24", "--workers", "1")
    args = [str(SCRIPTS / "train_example.py"), "--train", str(pack), "--val", str(pack),
            "--sizes", "16,24", "--epochs", "2", "--batch-size", "4", "--device", "cpu",
            "--checkpoint", str(tmp_path / "ck.pt")]  # fmt: skip
    first = run(preloaded, *args, "--stop-after", "4", out=tmp_path)
    assert "epoch 0 at 16px" in first and "stopped after 4 steps" in first
    second = run(preloaded, *args, out=tmp_path)
    assert "resumed at epoch 1, batch 1" in second and "epoch 1 at 24px" in second


@pytest.mark.skipif(sys.platform == "win32", reason="gloo over TCP on Linux/macOS")
def test_two_ranks_see_disjoint_samples_covering_the_epoch_across_a_restart(
    preloaded, image_folder, tmp_path
):
    """Three shards merged, two gloo ranks, stopped and resumed: together the
    ranks saw every record once, none twice, as the delivered pixels say."""
    src = image_folder(classes=("ant", "bee", "cow"), per_class=8, width=20, height=20,
                       ext=".png")  # fmt: skip
    shards = [str(tmp_path / f"part-{i}.bin") for i in range(3)]
    for i, shard in enumerate(shards):
        pack_images(str(src), shard, "--size", "16", "--workers", "1", "--num-shards", "3",
                    "--shard-index", str(i))  # fmt: skip
    pack_images("merge", str(tmp_path / "all.manifest.json"), *shards)
    args = [str(SCRIPTS / "train_ddp.py"), "--data", "all.manifest.json", "--epochs", "1",
            "--batch-size", "4", "--shard-local", "--checkpoint", "ck.pt",
            "--log-samples", "seen.jsonl", "--device", "cpu"]  # fmt: skip
    first = two_ranks(preloaded, *args, "--stop-after", "2", out=tmp_path)
    assert "batches 0..2 of 3" in first and "stopped" in first
    second = two_ranks(preloaded, *args, out=tmp_path)
    assert "batches 2..3 of 3" in second
    log = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    assert [(e["rank"], e["first_batch"], len(e["ids"])) for e in log] == [
        (0, 0, 8), (1, 0, 8), (0, 2, 4), (1, 2, 4),
    ]  # fmt: skip
    seen = {r: [i for e in log if e["rank"] == r for i in e["ids"]] for r in (0, 1)}
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(24))
