"""scripts/train_ddp.py under a real torchrun: two gloo ranks, a sharded pack, stop and resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from workbench.train_ddp import main, record_checksums, sample_ids, train

from imgpack.packer.merge import merge_packs
from imgpack.packer.pack import pack_folder
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.order import EpochOrder

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_ddp.py"


@pytest.fixture
def manifest(image_folder, tmp_path):
    """24 PNGs in 3 classes, packed at 16x16 as 3 shards (as 3 machines would), then merged."""
    src = image_folder(classes=("ant", "bee", "cow"), per_class=8, width=20, height=20, ext=".png")
    (tmp_path / "shards").mkdir()
    shards = [tmp_path / "shards" / f"part-{i:05d}.bin" for i in range(3)]
    for i, out in enumerate(shards):
        pack_folder(src, out, size=(16, 16), workers=1, progress=False, num_shards=3, shard_index=i)
    out = tmp_path / "all.manifest.json"
    merge_packs(out, shards)
    return out


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sample_ids_come_from_the_delivered_pixels(manifest):
    ds = PackedImageDataset(manifest)
    lookup = {int(c): i for i, c in enumerate(record_checksums(ds).tolist())}
    assert len(lookup) == len(ds) == 24  # distinct images, distinct checksums
    idx = np.array([23, 0, 9, 8])
    images, _ = ds.gather(idx)
    assert sample_ids(images, lookup) == idx.tolist()
    images[1] += 1  # another picture is not any record
    assert sample_ids(images, lookup)[1] == -1


def test_one_process_trains_and_logs_the_whole_epoch(manifest, tmp_path):
    log = tmp_path / "seen.jsonl"
    done = train(data=[str(manifest)], epochs=1, batch_size=8, log_samples=log, device="cpu")
    assert done["world_size"] == 1 and done["steps"] == 3 and np.isfinite(done["loss"])
    (entry,) = read_log(log)
    assert entry["rank"] == 0 and sorted(entry["ids"]) == list(range(24))
    bad = CliRunner().invoke(main, ["--data", str(tmp_path / "absent.manifest.json")])
    assert bad.exit_code == 1 and bad.stderr.startswith("train_ddp: error: ")


def torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(SCRIPT), *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.skipif(sys.platform == "win32", reason="gloo over TCP on Linux/macOS")
def test_two_ranks_see_disjoint_samples_covering_the_epoch_across_a_restart(manifest, tmp_path):
    args = ["--data", str(manifest), "--epochs", "1", "--batch-size", "4", "--shard-local",
            "--checkpoint", "ck.pt", "--log-samples", "seen.jsonl"]  # fmt: skip
    first = torchrun(*args, "--stop-after", "2", cwd=tmp_path)  # preempted after 2 of 3 steps
    assert "batches 0..2 of 3" in first.stderr and "stopped" in first.stderr
    assert (tmp_path / "ck.pt").exists()
    second = torchrun(*args, "--workers", "2", cwd=tmp_path)  # same command: resumes
    assert "batches 2..3 of 3" in second.stderr

    log = read_log(tmp_path / "seen.jsonl")
    assert [(e["rank"], e["epoch"], e["first_batch"], len(e["ids"])) for e in log] == [
        (0, 0, 0, 8), (1, 0, 0, 8), (0, 0, 2, 4), (1, 0, 2, 4),
    ]  # fmt: skip
    seen = {r: [i for e in log if e["rank"] == r for i in e["ids"]] for r in (0, 1)}
    assert not set(seen[0]) & set(seen[1])  # disjoint shares
    assert sorted(seen[0] + seen[1]) == list(range(24))  # together: the whole epoch, once
    for rank in (0, 1):  # and each rank saw exactly its planned share, restart or not
        plan = EpochOrder(24, batch_size=4, rank=rank, world_size=2, shard_sizes=[8, 8, 8])
        assert seen[rank] == plan.indices(0).tolist()
