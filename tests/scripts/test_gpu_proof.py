"""The GPU proof: its CPU dry run end to end, its ResNet-50, and its nvidia-smi sampler.

The dry run goes through the real script in a fresh interpreter, so an entry point
or import that rots fails here; the CUDA-only parts that a CPU cannot run are
checked to be reported as null with a reason. The sampler is fed by a stand-in
nvidia-smi, the only way to exercise its parsing without a GPU.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from workbench import gpu_measure
from workbench.errors import ProofError
from workbench.gpu_measure import CUDA_ONLY, GpuUtilSampler
from workbench.gpu_proof import main, run_proof, settings_for
from workbench.models import TrainStep, count_parameters, resnet50, tiny_resnet

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_proof.py"
DRY = settings_for(dry_run=True)
TOP_KEYS = {"schema", "dry_run", "settings", "machine", "ceilings", "pack", "loaders", "targets",
            "elapsed_s"}  # fmt: skip
RUN_KEYS = {"images_per_s", "images", "data_wait_fraction", "timeline_wait_fraction", "meter",
            "meter_line", "warmup_s", "measured_s", "final_loss", "model_params", "gpu_util",
            "h2d", "timeline"}  # fmt: skip


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One dry run of the script as a user would start it; (process, output folder)."""
    out = tmp_path_factory.mktemp("proof") / "out"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--dry-run"],
        capture_output=True, text=True, timeout=300, cwd=SCRIPT.parent,
    )  # fmt: skip
    return proc, out


def test_dry_run_exits_zero_and_prints_every_loader(dry_run):
    proc, out = dry_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["baseline", "imgpack", "imgpack resident"]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_proof.json", "gpu_proof.png"]


def test_dry_run_json_has_every_key_with_sane_values(dry_run):
    _, out = dry_run
    data = json.loads((out / "gpu_proof.json").read_text())
    assert set(data) == TOP_KEYS
    assert data["dry_run"] is True and data["elapsed_s"] > 0
    s = data["settings"]
    assert (s["device"], s["model"], s["image_size"]) == ("cpu", "tiny", 224)
    assert (s["steps"], s["batch_size"], s["generated_sample"]) == (DRY.steps, DRY.batch_size, True)
    assert data["pack"]["images"] == DRY.classes * DRY.per_class and data["pack"]["skipped"] == 0

    m = data["machine"]
    assert m["cpu_count"] == os.cpu_count() and m["torch"] == torch.__version__
    assert m["gpu_name"] is None and m["gpu_count"] == 0

    c = data["ceilings"]
    assert c["batch_bytes"] == DRY.batch_size * 3 * 224 * 224
    assert c["h2d_pinned_gbps"] is c["h2d_pageable_gbps"] is c["d2d_gbps"] is None
    assert c["reason"] == CUDA_ONLY
    assert data["targets"] == {
        "imgpack_wait_below_2pct": None,
        "h2d_at_least_80pct_of_pinned": None,
    }

    assert set(data["loaders"]) == {"baseline", "imgpack", "imgpack resident"}
    for name, run in data["loaders"].items():
        assert set(run) >= RUN_KEYS, name
        assert run["images"] == DRY.steps * DRY.batch_size
        assert run["images_per_s"] > 0 and run["measured_s"] > 0 and run["warmup_s"] > 0
        assert 0 <= run["data_wait_fraction"] <= 1
        assert 0 <= run["timeline_wait_fraction"] <= 1
        assert math.isfinite(run["final_loss"]) and run["final_loss"] > 0
        assert run["model_params"] == count_parameters(tiny_resnet(num_classes=DRY.classes))
        assert run["meter_line"]
        steps = run["timeline"]
        assert len(steps) == DRY.steps
        assert all(w >= 0 and c > 0 for _, w, c in steps)
        starts = [t for t, _, _ in steps]
        assert starts[0] == 0 and starts == sorted(starts)
        assert steps[-1][0] + steps[-1][1] + steps[-1][2] == pytest.approx(run["measured_s"])
        util, h2d = run["gpu_util"], run["h2d"]
        assert util["mean_percent"] is None and util["samples"] == [] and util["reason"]
        assert h2d["gbps"] is None and h2d["reason"] == CUDA_ONLY
    # imgpack moves the uint8 batches; their bytes are exactly counted
    image_bytes = DRY.steps * DRY.batch_size * 3 * 224 * 224
    assert (
        data["loaders"]["imgpack"]["h2d"]["bytes"] == image_bytes + DRY.steps * DRY.batch_size * 8
    )


def test_dry_run_png_is_a_valid_png(dry_run):
    _, out = dry_run
    path = out / "gpu_proof.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.format == "PNG" and im.width >= 800 and im.height >= 400
        colours = np.unique(np.asarray(im.convert("RGB")).reshape(-1, 3), axis=0)
    assert len(colours) > 10  # something was drawn


def test_a_given_folder_smaller_than_the_run_is_cycled_epoch_after_epoch(tmp_path, image_folder):
    src = image_folder(classes=("cat", "dog"), per_class=3, width=80, height=60)
    data = run_proof(tmp_path / "out", src=src, dry_run=True, steps=4)  # 5 batches of 4, 6 images
    assert data["settings"]["generated_sample"] is False and data["settings"]["src"] == str(src)
    assert data["pack"]["images"] == 6 and data["settings"]["num_classes"] == 2
    for run in data["loaders"].values():
        assert run["images"] == 4 * DRY.batch_size and len(run["timeline"]) == 4
    assert json.loads((tmp_path / "out" / "gpu_proof.json").read_text())["loaders"]
    assert sorted(p.name for p in src.iterdir()) == ["cat", "dog"]  # the source is left alone


# --- the model ----------------------------------------------------------------------


@pytest.fixture
def one_thread():
    """Small CPU models run faster on one thread than on two that other processes share."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_resnet50_has_resnet50_size_and_maps_images_to_logits(one_thread):
    model = resnet50()
    n = count_parameters(model)
    assert abs(n - 25.6e6) <= 0.02 * 25.6e6, n
    assert [len(stage) for stage in model.stages] == [3, 4, 6, 3]
    assert [stage[-1].conv3.out_channels for stage in model.stages] == [256, 512, 1024, 2048]
    model = model.to(memory_format=torch.channels_last).eval()
    x = torch.randn(2, 3, 224, 224).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        y = model(x)
    assert y.shape == (2, 1000) and y.dtype == torch.float32 and torch.isfinite(y).all()


def test_train_step_learns_a_fixed_batch(one_thread):
    torch.manual_seed(0)
    step = TrainStep(tiny_resnet(num_classes=2), "cpu", lr=0.05)
    x = torch.randn(8, 3, 32, 32)
    y = torch.tensor([0, 1] * 4)
    first = float(step(x, y))
    for _ in range(4):
        last = float(step(x, y))
    assert step.params == count_parameters(step.model)
    assert last < first


# --- refusals -----------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_one_line_and_exit_1(tmp_path):
    result = CliRunner().invoke(main, ["--out", str(tmp_path / "out"), "--device", "cuda"])
    assert result.exit_code == 1
    assert result.stderr.startswith("gpu_proof: device cuda: expected a CUDA GPU, found none")
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_an_output_path_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "taken"
    target.write_text("keep me")
    with pytest.raises(ProofError, match="expected an output folder, found a file"):
        run_proof(target, dry_run=True)
    assert target.read_text() == "keep me"


def test_a_missing_source_folder_is_refused(tmp_path):
    with pytest.raises(ProofError, match="expected a folder of class folders"):
        run_proof(tmp_path / "out", src=tmp_path / "nowhere", dry_run=True)


def test_take_cycles_epochs_and_refuses_an_empty_loader():
    assert list(gpu_measure._take([1, 2], 5)) == [1, 2, 1, 2, 1]
    with pytest.raises(ProofError, match="empty epoch after 0"):
        list(gpu_measure._take([], 3))


# --- nvidia-smi sampling ------------------------------------------------------------


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def test_sampler_reads_only_its_gpu_inside_the_window(tmp_path, monkeypatch):
    now = time.time()
    rows = [
        f"{_stamp(now - 5)}, GPU-1234-abcd, 11",  # before the window
        f"{_stamp(now + 0.1)}, GPU-1234-abcd, 40",
        f"{_stamp(now + 0.2)}, GPU-9999-ffff, 99",  # another GPU
        f"{_stamp(now + 0.3)}, GPU-1234-abcd, [N/A]",
        f"{_stamp(now + 0.4)}, GPU-1234-abcd, 80",
    ]
    args_file = tmp_path / "args.json"
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(f"""\
            import json, sys
            json.dump(sys.argv[1:], open({str(args_file)!r}, "w"))
            print({chr(10).join(rows)!r}, flush=True)
        """)
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: SimpleNamespace(uuid="1234-abcd")
    )
    with GpuUtilSampler(torch.device("cuda")) as sampler:
        sampler._proc.wait(timeout=30)  # the stand-in prints its rows and exits
    got = sampler.result(now, now + 1)
    assert got["reason"] is None and got["gpu_uuid"] == "GPU-1234-abcd"
    assert [u for _, u in got["samples"]] == [40, 80]
    assert got["mean_percent"] == pytest.approx(60)
    assert [round(t, 2) for t, _ in got["samples"]] == [0.1, 0.4]
    args = json.loads(args_file.read_text())
    assert "--query-gpu=timestamp,uuid,utilization.gpu" in args and "-lms" in args


def test_sampler_says_why_when_nvidia_smi_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(uuid="x"))
    with GpuUtilSampler(torch.device("cuda")) as sampler:
        pass
    got = sampler.result(0, time.time())
    assert got["mean_percent"] is None and got["reason"] == "nvidia-smi not found on PATH"
    with GpuUtilSampler(torch.device("cpu")) as sampler:
        pass
    assert sampler.result(0, time.time())["reason"] == CUDA_ONLY
