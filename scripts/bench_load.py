#!/usr/bin/env python3
"""Load-throughput benchmark: baseline vs disk vs memcpy vs imgpack, one JSON line per row.

    python scripts/bench_load.py --out results.json --plot bench.png   # a few minutes
    python scripts/bench_load.py --versus-only --images 4000           # the hand-written loops only
    python scripts/bench_load.py --quick                                # seconds, to try it
    python scripts/bench_load.py --storage-only                         # issue 18's packs only

Every run starts with the default loader against the 30-line numpy.memmap loops it
replaces (``mm[idx]``, and ``np.take(..., out=)`` into one reused buffer), alternated, with a
consumer that copies every batch, and with one that reads nothing (a GPU's DMA), where the
gather is set beside one core's memcpy (workbench/versus.py); the rest is in
scripts/workbench/bench_run.py. ``--storage`` adds the loader's images/s on
stretch raw, fit raw and fit yuv420 packs of the same sample photographs
(workbench/bench_load_storage.py). This file only parses flags.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from workbench.bench import memcpy_images_per_s
from workbench.bench_load_storage import storage_rows
from workbench.bench_run import prepare, run_benchmark, sample_folder
from workbench.report import machine_info, markdown_table, write_jsonl
from workbench.versus import versus_loops, versus_table

from imgpack.diagnose.plot import plot_sweep, pyplot
from imgpack.errors import ImgpackError

QUICK = {
    "images": 600,
    "size": 64,
    "batch_size": 32,
    "repeats": 2,
    "sample_images": 100,
    "baseline_batches": 2,
    "workers": (0, 1),
    "prefetch": (2, 4),
    "memcpy_mb": 32,
    "epochs": 2,
    "alternations": 1,
}


def _ints(ctx, param, value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, found {value!r}") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--images",
    type=click.IntRange(min=1),
    default=12_000,
    show_default=True,
    help="Records in the pack the imgpack rows read (12,000 at 224 = 1.8 GB).",
)
@click.option("--size", type=click.IntRange(min=8), default=224, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--sample-images",
    type=click.IntRange(min=10),
    default=1000,
    show_default=True,
    help="JPEGs in the folder the baseline decodes.",
)
@click.option(
    "--baseline-batches",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Batches per baseline repeat (it runs at a few hundred images/s).",
)
@click.option("--workers", default="0,1,2,4", show_default=True, callback=_ints)
@click.option("--prefetch", default="2,4,8", show_default=True, callback=_ints)
@click.option("--memcpy-mb", type=click.IntRange(min=1), default=512, show_default=True)
@click.option("--no-cold", is_flag=True, help="Skip the cold-cache rows.")
@click.option("--cold-grid", is_flag=True, help="Also run the whole workers x prefetch grid cold.")
@click.option(
    "--src",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Use this image folder for the baseline instead of a generated sample.",
)
@click.option(
    "--pack",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Use this pack for the imgpack rows instead of a generated one.",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("out/bench"),
    show_default=True,
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the rows here, one JSON object per line.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a PNG of images/s over num_workers x prefetch_factor.",
)
@click.option(
    "--epochs", type=click.IntRange(min=1), default=5, show_default=True,
    help="Timed epochs per side and alternation, against the numpy.memmap loop.",
)  # fmt: skip
@click.option("--alternations", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--versus-only", is_flag=True, help="Only the comparison with the memmap loop.")
@click.option(
    "--storage",
    is_flag=True,
    help="Also stretch raw vs fit raw vs fit yuv420 packs of the sample photos.",
)
@click.option("--storage-only", is_flag=True, help="Only those storage rows.")  # fmt: skip
@click.option("--quick", is_flag=True, help="A tiny run (64x64, 600 images) to check it works.")
def main(out, plot, quick, no_cold, epochs, alternations, versus_only, storage, storage_only,
         **kw) -> None:  # fmt: skip
    if quick:
        kw.update(QUICK)
        epochs, alternations = kw.pop("epochs"), kw.pop("alternations")
    if storage_only:
        _storage_only(out, kw)
        return
    if plot is not None:
        pyplot()  # fail now, not after the run, when matplotlib is missing
    _, pack = prepare(
        kw["work_dir"], images=kw["images"], size=kw["size"],
        sample_images=kw["sample_images"], src=kw["src"], pack=kw["pack"],
    )  # fmt: skip
    versus = [
        versus_loops(
            pack, batch_size=kw["batch_size"], epochs=epochs, alternations=alternations, into=into
        )
        for into in ("reused", "new", "none")
    ]
    _beside_memcpy(versus[-1], pack, kw["memcpy_mb"], kw["repeats"])
    print(versus_table(versus), flush=True)
    dma = versus[-1]
    print(f"gather for a GPU consumer: {dma['of_memcpy']:.0%} of one core's memcpy", flush=True)
    if versus_only:
        if out is not None:
            write_jsonl(out, [{"row": "meta", **machine_info(), "pack": str(pack)}, *versus])
        return
    rows = run_benchmark(cold=not no_cold, **{**kw, "pack": pack}) + versus
    if storage:
        rows += _storage(kw)
    if out is not None:
        write_jsonl(out, rows)
    if plot is not None:
        warm = [
            {**r, "row": r["heat_row"]}
            for r in rows
            if r["row"] == "imgpack" and r["cache"] == "warm"
        ]
        meta = rows[0]
        title = f"imgpack warm, {meta['shape'][1]}x{meta['shape'][0]}, batch {meta['batch_size']}"
        plot_sweep(warm, plot, title=f"{title}, {meta['usable_cpus']} cores")
    print(markdown_table(rows))


def _beside_memcpy(row: dict, pack: Path, memcpy_mb: int, repeats: int) -> None:
    """Add one core's memcpy, in the pack's records/s, and the loader's share of it."""
    from imgpack.format.index import read_index

    record = read_index(pack).record_bytes
    memcpy = memcpy_images_per_s(record, nbytes=memcpy_mb << 20, repeats=repeats).median
    row["memcpy_images_per_s"] = round(memcpy)
    row["of_memcpy"] = round(row["rates"]["imgpack"] / memcpy, 3)


def _storage(kw: dict) -> list[dict]:
    src = sample_folder(kw["work_dir"], sample_images=kw["sample_images"], src=kw["src"])
    return storage_rows(src, Path(kw["work_dir"]) / "storage", batch_size=kw["batch_size"],
                        repeats=kw["repeats"], log=lambda m: print(m, file=sys.stderr))  # fmt: skip


def _storage_only(out: Path | None, kw: dict) -> None:
    rows = _storage(kw)
    if out is not None:
        write_jsonl(out, [{"row": "meta", **machine_info()}, *rows])
    print(markdown_table(rows))


if __name__ == "__main__":
    try:
        main()
    except ImgpackError as exc:
        print(f"bench_load: error: {exc}", file=sys.stderr)
        sys.exit(1)
