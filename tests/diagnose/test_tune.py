"""tune: the decision on made-up measurements, then one real tiny sweep through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from PIL import Image

from imgpack.diagnose.tune import (
    Config,
    Measured,
    Stat,
    Sweep,
    decide,
    format_report,
    sweep_configs,
)

SHAPE = (224, 224, 3)
RECORD = 224 * 224 * 3


def m(config: Config, *rates: float, wait: float | None = None) -> Measured:
    return Measured(config, Stat.of(rates), wait_fraction=wait, peak_private=200 << 20)


W2P4 = Config("workers", 2, 4)
W2P8 = Config("workers", 2, 8)
W1P2 = Config("workers", 1, 2)
INPROC = Config("inprocess", 0, 2)


def verdict(measured, *, step_ms=0.0, cold=False, order="uniform", **kw):
    sweep = Sweep(256, step_ms, order, cold, 3)
    return decide(measured, sweep, **{"shape": SHAPE, "cores": 2, **kw})


_ADVICE = """
import sys
from imgpack.diagnose.tune import Measured, Stat, Sweep, decide, format_report, sweep_configs
configs = sweep_configs(cuda=False, workers=(0, 1, 2, 4), prefetch=(2, 4, 8))
ms = [Measured(c, Stat.of([100.0 + k])) for k, c in enumerate(configs)]
sweep = Sweep(64, 1000.0, "uniform", False, 3)
v = decide(ms, sweep, shape=(224, 224, 3), cores=2)
text = format_report(ms, v, sweep, record_bytes=150528)
assert "recommended: make_loader(ds, 64" in text and "keeps up" in text, text
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("imgpack.reader")))
"""


def test_deciding_and_printing_the_advice_imports_neither_the_reader_nor_torch():
    """What tune.Config.kwargs says: it alone imports the reader (and torch with it)."""
    out = subprocess.run(
        [sys.executable, "-c", _ADVICE], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- the configs -------------------------------------------------------------------


def test_sweep_tries_pin_only_where_cuda_and_inprocess_first():
    cpu = sweep_configs(cuda=False, workers=(0, 2), prefetch=(2, 4))
    assert [c.label for c in cpu] == [
        "in-process threads=1 prefetch=0",  # read in the loop's own thread
        "in-process threads=1 prefetch=2",
        "in-process threads=1 prefetch=4",
        "in-process threads=2 prefetch=2",
        "in-process threads=2 prefetch=4",
        "workers=0",
        "workers=2 prefetch=2",
        "workers=2 prefetch=4",
    ]
    assert not any(c.pin_memory for c in cpu)
    gpu = sweep_configs(cuda=True, workers=(0, 2), prefetch=(2, 4))
    assert len(gpu) == 2 * len(cpu) and sum(c.pin_memory for c in gpu) == len(cpu)


def test_gather_threads_reach_the_call_and_the_label():
    here, two = sweep_configs(cuda=False, workers=(), prefetch=(2,), threads=(2,))
    assert here.call(64) == (
        "make_loader(ds, 64, options=InProcessOptions(prefetch=0, gather_threads=1), "
        "pin_memory=False)"
    )
    assert two.call(64) == (
        "make_loader(ds, 64, options=InProcessOptions(prefetch=2, gather_threads=2), "
        "pin_memory=False)"
    )
    assert two.label == "in-process threads=2 prefetch=2"


def test_config_call_is_exact_make_loader_source():
    assert W2P4.call(256) == (
        "make_loader(ds, 256, num_workers=2, options=WorkerOptions(prefetch_factor=4), "
        "pin_memory=False)"
    )
    assert Config("workers", 0).call(64) == ("make_loader(ds, 64, num_workers=0, pin_memory=False)")
    assert INPROC.call(32, "block") == (
        'make_loader(ds, 32, options=InProcessOptions(prefetch=2), pin_memory=False, order="block")'
    )


def test_buffers_count_what_memory_holds():
    assert W2P4.buffers == 2 * 4 + 1
    assert Config("workers", 0).buffers == 1
    assert INPROC.buffers == 2 + 4


# --- noise and the winner ------------------------------------------------------------


def test_within_noise_by_overlapping_ranges_or_close_medians():
    assert Stat.of([100, 110, 120]).ties(Stat.of([118, 125, 130]))  # ranges overlap
    assert Stat.of([100, 100, 100]).ties(Stat.of([102, 102, 102]))  # 2% apart
    assert not Stat.of([100, 101, 102]).ties(Stat.of([110, 111, 112]))


def test_fastest_wins_when_clearly_ahead():
    v = verdict([m(W1P2, 5000, 5100, 5200), m(W2P4, 9000, 9100, 9200), m(INPROC, 6000, 6100, 6200)])
    assert v.fastest.config == W2P4 and v.recommended.config == W2P4 and v.ties == []
    assert v.keeps_up is None and v.advice == []


def test_cheapest_of_a_tie_is_recommended():
    # W2P8 is nominally fastest, but W2P4 overlaps it and holds fewer batches in memory.
    ms = [m(W2P8, 9000, 9300, 9400), m(W2P4, 8950, 9250, 9350), m(W1P2, 4000, 4100, 4200)]
    v = verdict(ms)
    assert v.fastest.config == W2P8
    assert [t.config for t in v.ties] == [W2P4]
    assert v.recommended.config == W2P4


def test_failed_configs_are_ignored_and_none_measured_gives_no_verdict():
    bad = Measured(W2P8, None, error="out of memory")
    assert verdict([bad, m(W1P2, 10, 11, 12)]).fastest.config == W1P2
    assert verdict([bad]) is None


# --- keeping up with the step --------------------------------------------------------


def test_keeps_up_when_the_step_is_slower_than_the_loader():
    # 256 images per 100 ms step: 2,560 images/s needed, 9,000 delivered
    v = verdict([m(W2P4, 2540, 2550, 2555, wait=0.01)], step_ms=100)
    assert Sweep(256, 100, "uniform", False, 3).needed == pytest.approx(2560)
    assert v.keeps_up is True and v.advice == []


def test_cannot_keep_up_says_so_and_what_would():
    # 256 images per 5 ms: 51,200 images/s needed, 9,000 delivered: 5.7x short
    v = verdict([m(W2P4, 8900, 9000, 9100, wait=0.82)], step_ms=5, cores=2)
    assert v.keeps_up is False
    text = " ".join(v.advice)
    assert "12 would keep up" in text  # ceil(2 cores * 5.69)
    assert "--size 88" in text  # 224 / sqrt(5.69) = 93.9, rounded down to a multiple of 8
    assert "--cold" in text and 'order="block"' in text


def test_cold_or_oversized_pack_advises_block_order_unless_already_block():
    ms = [m(W2P4, 3000, 3100, 3200)]
    assert any('order="block"' in a for a in verdict(ms, cold=True).advice)
    big = verdict(ms, pack_bytes=64 << 30, mem_available=16 << 30)
    assert any("larger than available memory" in a for a in big.advice)
    assert verdict(ms, cold=True, order="block").advice == []


def report(ms, step_ms=0.0, **kw):
    v = verdict(ms, step_ms=step_ms)
    return format_report(ms, v, Sweep(256, step_ms, "uniform", False, 3), record_bytes=RECORD, **kw)


def test_report_marks_fastest_ties_recommended_and_prints_the_call():
    ms = [m(W2P8, 9000, 9300, 9400), m(W2P4, 8950, 9250, 9350), m(W1P2, 4000, 4100, 4200)]
    text = report(ms, skipped=[Config("workers", 4, 8)])
    lines = {line.split("  ")[0].strip(): line for line in text.splitlines()}
    assert lines["workers=2 prefetch=8"].rstrip().endswith("*")
    assert lines["workers=2 prefetch=4"].rstrip().endswith("= <- recommended")
    assert "= within noise of it" in text  # the ties: marked in the table, not listed again
    assert (
        "recommended: make_loader(ds, 256, num_workers=2, "
        "options=WorkerOptions(prefetch_factor=4), "
        "pin_memory=False)" in text
    )
    # 9 buffers x 256 x 224x224x3 bytes = 331 MiB of batches in flight
    assert " 331 " in lines["workers=2 prefetch=4"]
    assert "not measured (budget spent): workers=4 prefetch=8" in text


def test_every_row_lines_up_under_the_header_however_long_its_config():
    long = Config("inprocess", 0, 2, gather_threads=2)  # "in-process threads=2 prefetch=2"
    ms = [m(long, 31000, 31100, 31200), m(W1P2, 4000, 4100, 4200)]
    header, *rows = report(ms).splitlines()[:3]
    end = header.index("images/s") + len("images/s")
    assert [row[end - 6 : end] for row in rows] == ["31,100", " 4,100"]


def test_report_says_plainly_when_nothing_keeps_up():
    text = report([m(W2P4, 8900, 9000, 9100)], step_ms=5)
    assert "NO configuration keeps up" in text and "51,200 images/s" in text
    assert "more cores" in text and "smaller stored size" in text


def test_report_with_a_step_that_is_met():
    text = report([m(W2P4, 2540, 2550, 2555)], step_ms=100)
    assert "keeps up: a 100 ms step on 256 images consumes 2,560 images/s" in text


# --- a real sweep ----------------------------------------------------------------------


def test_tune_cli_on_a_tiny_pack_prints_the_winner_and_writes_the_png(make_pack, tmp_path):
    from imgpack.packer.cli import main

    pack, _, _ = make_pack(count=48, height=16, width=16)
    png = tmp_path / "tune.png"
    args = [
        "tune",
        str(pack),
        "--batch-size",
        "8",
        "--budget-s",
        "1",
        "--repeats",
        "2",
        "--workers",
        "0,1",
        "--prefetch",
        "2",
        "--plot",
        str(png),
    ]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    for label in ("in-process threads=1 prefetch=2", "workers=0", "workers=1 prefetch=2"):
        assert label in out.output
    assert "recommended: make_loader(ds, 8, " in out.output
    assert out.output.rstrip().endswith(f"plot: {png}")  # the last line under the report
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > 400


def test_tune_cli_cold_with_a_step_reports_keep_up(make_pack):
    from imgpack.packer.cli import main

    pack, _, _ = make_pack(count=32, height=8, width=8)
    args = [
        "tune",
        str(pack),
        "--batch-size",
        "4",
        "--budget-s",
        "1",
        "--repeats",
        "1",
        "--workers",
        "0",
        "--prefetch",
        "2",
        "--step-ms",
        "1",
        "--cold",
    ]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "a 1 ms step on 4 images consumes 4,000 images/s" in out.output


def test_tune_cli_refuses_bad_input_in_one_line(tmp_path):
    from imgpack.packer.cli import main

    out = CliRunner().invoke(main, ["tune", str(tmp_path / "missing.bin")])
    assert out.exit_code == 1
    assert out.output.strip().startswith("pack-images: error:") and "missing.json" in out.output
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"format": "nope"}))
    assert CliRunner().invoke(main, ["tune", str(bad)]).exit_code == 1
    out = CliRunner().invoke(main, ["tune", str(bad), "--workers", "a,b"])
    assert out.exit_code == 2 and "comma-separated integers" in out.output


def test_tune_cli_takes_a_pack_at_a_url_as_the_dataset_does():
    """The URL reaches the dataset whole (a path type would fold ``//`` into ``/``)."""
    pytest.importorskip("fsspec", reason="the remote extra")
    from imgpack.packer.cli import main

    out = CliRunner().invoke(main, ["tune", "http://127.0.0.1:9/x.bin", "--budget-s", "1"])
    assert out.exit_code == 1
    assert out.output.startswith("pack-images: error: http://127.0.0.1:9/x"), out.output


def test_tune_cli_runs_on_a_one_channel_pack(image_folder, tmp_path):
    from imgpack.packer.cli import main

    pack = tmp_path / "gray.bin"
    src = image_folder(classes=("a",), per_class=24, width=10, height=8, ext=".png")
    args = [str(src), str(pack), "--size", "8", "--channels", "1", "--workers", "1", "-q"]
    assert CliRunner().invoke(main, args).exit_code == 0
    args = ["tune", str(pack), "--batch-size", "4", "--budget-s", "1", "--repeats", "1",
            "--workers", "0", "--prefetch", "2"]  # fmt: skip
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "recommended: make_loader(ds, 4, " in out.output


def test_tune_cli_runs_on_merged_shards(make_pack, tmp_path):
    """A dataset packed in shards is tuned through its manifest, as it is read."""
    from imgpack.packer.cli import main

    a, _, _ = make_pack(count=24, height=8, width=8, name="a")
    b, _, _ = make_pack(count=20, height=8, width=8, name="b")
    manifest = tmp_path / "all.manifest.json"
    out = CliRunner().invoke(main, ["merge", str(manifest), str(a), str(b)])
    assert out.exit_code == 0, out.output
    args = ["tune", str(manifest), "--batch-size", "4", "--budget-s", "1", "--repeats", "1",
            "--workers", "0", "--prefetch", "2"]  # fmt: skip
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "recommended: make_loader(ds, 4, " in out.output


def test_tune_cli_refuses_a_plot_in_a_missing_folder_before_the_sweep(make_pack, tmp_path):
    from imgpack.packer.cli import main

    pack, _, _ = make_pack(count=8, height=8, width=8)
    png = tmp_path / "nodir" / "tune.png"
    args = ["tune", str(pack), "--budget-s", "1", "--workers", "0", "--plot", str(png)]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 1
    assert f"--plot {png}: folder {png.parent} does not exist" in out.output
    assert "[1/" not in out.output and "tmp.png" not in out.output  # nothing measured
