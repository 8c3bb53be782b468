"""bench: the page-cache tools, the timing windows with a fake clock, and one tiny real run."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from workbench.bench import fromfile_images_per_s, memcpy_images_per_s
from workbench.bench_run import run_benchmark, tile_pack
from workbench.report import add_ratios, markdown_table

from imgpack.diagnose.measure import PeakMemory, cached_fraction, drop_cache, stat, time_window
from imgpack.format.index import read_index

ROOT = Path(__file__).resolve().parents[2]


def _fs_type(path: Path) -> str:
    """The filesystem type of the mount holding ``path`` (longest matching mount point)."""
    best, kind = "", "?"
    with open("/proc/mounts", encoding="utf-8") as f:
        for line in f:
            _, mount, fstype, *_ = line.split()
            if str(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
    return kind


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")
def test_drop_cache_empties_the_page_cache_of_one_file(tmp_path):
    if _fs_type(tmp_path) in ("tmpfs", "ramfs", "overlay", "?"):
        pytest.skip(f"{_fs_type(tmp_path)}: its pages are the storage and cannot be dropped")
    f = tmp_path / "blob"
    f.write_bytes(os.urandom(4 << 20))
    f.read_bytes()
    assert cached_fraction(f) == 1.0
    assert drop_cache(f) is True
    assert cached_fraction(f) < 0.1
    f.read_bytes()
    assert cached_fraction(f) == 1.0


def test_stat_median_and_range():
    s = stat([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.min, s.max) == (2.5, 1.0, 10.0)
    assert s.to_json() == {
        "images_per_s": 2.5,
        "min": 1.0,
        "max": 10.0,
        "samples": [3.0, 1.0, 2.0, 10.0],
    }


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def batches(clock, wait_s, size=8):
    while True:
        clock.t += wait_s  # the loader takes this long to hand over each batch
        yield np.zeros((size, 3, 2, 2), np.uint8), np.zeros(size, np.int64)


def test_time_window_counts_images_time_and_wait_with_a_fake_clock():
    clock = FakeClock()
    n, s, w = time_window(batches(clock, 0.01), 5, step_s=0.03, clock=clock, sleep=clock.sleep)
    assert n == 40 and s == pytest.approx(0.2) and w == pytest.approx(0.05)


def test_time_window_by_seconds_takes_at_least_min_batches():
    clock = FakeClock()
    n, s, _ = time_window(batches(clock, 1.0), seconds=0.5, min_batches=3, clock=clock)
    assert n == 24 and s == pytest.approx(3.0)
    n, s, _ = time_window(batches(clock, 0.1), seconds=0.95, clock=clock)
    assert n == 80 and s == pytest.approx(1.0)


def test_memcpy_and_fromfile_rates_are_records_per_second(tmp_path):
    mc = memcpy_images_per_s(1000, nbytes=1 << 20, repeats=2)
    assert len(mc.samples) == 2 and mc.min > 0
    f = tmp_path / "blob"
    f.write_bytes(bytes(1 << 20))
    warm, cached = fromfile_images_per_s(f, 1000, cold=False, repeats=2)
    assert len(warm.samples) == 2 and warm.min > 0 and cached is None
    cold, cached = fromfile_images_per_s(f, 1000, cold=True, repeats=1)
    assert cold.min > 0 and cached is not None


def test_peak_memory_sees_an_allocation_in_this_process():
    pytest.importorskip("psutil")
    with PeakMemory(interval=0.01) as before:
        pass
    with PeakMemory(interval=0.01) as mem:
        block = np.ones(64 << 20, np.uint8)  # 64 MiB touched
    del block
    assert mem.peak_rss >= before.peak_rss + (48 << 20)
    if mem.peak_private is not None:
        assert mem.peak_private >= before.peak_private + (48 << 20)


def test_tile_pack_repeats_records_in_order(make_pack, tmp_path):
    small, pixels, labels = make_pack(count=3, height=4, width=5)
    big = tile_pack(small, tmp_path / "big.bin", 7)
    ix = read_index(big)
    assert ix.count == 7 and ix.shape == (4, 5, 3)
    raw = np.fromfile(ix.data_path, np.uint8)
    got = ix.section_array("pixels", raw).reshape(7, 4, 5, 3)
    assert np.array_equal(got, pixels[[0, 1, 2, 0, 1, 2, 0]])
    assert ix.read_section("labels").tolist() == labels[[0, 1, 2, 0, 1, 2, 0]].tolist()


def test_ratios_and_markdown_table():
    rows = [
        {
            "row": "memcpy",
            "label": "memcpy",
            "cache": "warm",
            "images_per_s": 1000.0,
            "min": 990.0,
            "max": 1010.0,
        },
        {
            "row": "baseline",
            "label": "baseline",
            "cache": "warm",
            "images_per_s": 10.0,
            "min": 9.0,
            "max": 11.0,
        },
        {
            "row": "imgpack",
            "label": "imgpack default",
            "cache": "cold",
            "images_per_s": 600.0,
            "min": 550.0,
            "max": 650.0,
        },
    ]
    add_ratios(rows)
    assert rows[2]["vs_baseline"] == 60.0 and rows[2]["vs_memcpy"] == 0.6
    table = markdown_table(rows).splitlines()
    assert table[0].startswith("| measurement | cache | images/s (median)")
    assert table[-1] == "| imgpack default | cold | 600 | 550–650 | 60.0× | 60.0% |"


def test_a_tiny_run_measures_every_row(tmp_path):
    rows = run_benchmark(
        work_dir=tmp_path / "w",
        images=48,
        size=16,
        batch_size=8,
        repeats=1,
        sample_images=20,
        baseline_batches=1,
        workers=(0, 1),
        prefetch=(2,),
        memcpy_mb=1,
        log=lambda _: None,
    )
    meta, rest = rows[0], rows[1:]
    assert meta["row"] == "meta" and meta["images"] == 48 and meta["record_bytes"] == 16 * 16 * 3
    kinds = [(r["row"], r["cache"]) for r in rest]
    for kind in [
        ("memcpy", "warm"),
        ("fromfile", "warm"),
        ("fromfile", "cold"),
        ("baseline", "warm"),
        ("imgpack", "warm"),
        ("imgpack", "cold"),
    ]:
        assert kind in kinds
    labels = [r["label"] for r in rest if r["row"] == "imgpack"]
    assert "imgpack in-process threads=1 prefetch=2" in labels
    assert "imgpack workers=1 prefetch=2" in labels
    assert any("block" in label for label in labels) and any("uniform" in label for label in labels)
    for r in rest:
        assert r["images_per_s"] > 0 and r["min"] <= r["images_per_s"] <= r["max"]
        assert "vs_baseline" in r and "vs_memcpy" in r
    # a cold row starts with the pack's pages dropped: what mincore saw is recorded, and is
    # not the whole file (None only where this machine cannot tell; on tmpfs and the like
    # the pages are the storage and stay)
    cold = [r for r in rest if r["cache"] == "cold"]
    assert {r["row"] for r in cold} == {"fromfile", "imgpack"}
    seen = [c for r in cold for c in r["cached_before"]]
    assert len(seen) == len(cold)  # one per repeat, and repeats=1
    if cached_fraction(meta["pack"]) is None:
        assert set(seen) == {None}
    elif _fs_type(Path(meta["pack"])) in ("tmpfs", "ramfs", "overlay", "?"):
        assert all(isinstance(c, float) for c in seen), seen
    else:
        assert all(isinstance(c, float) and 0.0 <= c < 1.0 for c in seen), seen


def _script():
    spec = importlib.util.spec_from_file_location("bench_load", ROOT / "scripts" / "bench_load.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_script_writes_json_lines_a_plot_and_a_markdown_table(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "p.png"
    args = [
        "--images",
        "40",
        "--size",
        "16",
        "--batch-size",
        "8",
        "--repeats",
        "1",
        "--sample-images",
        "20",
        "--baseline-batches",
        "1",
        "--workers",
        "0,1",
        "--prefetch",
        "2",
        "--memcpy-mb",
        "1",
        "--no-cold",
        "--work-dir",
        str(tmp_path / "w"),
        "--out",
        str(out),
        "--plot",
        str(png),
    ]
    res = CliRunner().invoke(_script().main, args)
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["row"] == "meta" and all(r["cache"] == "warm" for r in rows[1:])
    assert "| imgpack workers=1 prefetch=2 | warm |" in res.output
    versus = [r for r in rows if r["row"] == "versus"]  # the hand-written loops, same run
    assert [r["consumer"] for r in versus] == [
        "copies each batch into a reused tensor", "copies each batch into a new tensor",
        "reads nothing (a GPU's DMA)",
    ]  # fmt: skip
    for r in versus:
        assert set(r["samples"]) == {"mm[idx]", "np.take(out=)", "np.take(out=, clip)", "imgpack"}
        assert all(len(v) == 5 * 3 for v in r["samples"].values())  # 5 epochs x 3 alternations
        for loop, ratio in r["ratio"].items():
            rates = r["rates"]
            assert abs(ratio - rates["imgpack"] / rates[loop]) <= 0.006, (loop, r)
    assert (
        0
        < versus[-1]["of_memcpy"]
        == round(versus[-1]["rates"]["imgpack"] / versus[-1]["memcpy_images_per_s"], 3)
    )
    assert "| copies each batch into a new tensor |" in res.output
    assert "of one core's memcpy" in res.output
    with Image.open(png) as im:
        assert im.format == "PNG"
