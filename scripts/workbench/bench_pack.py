"""Packing benchmark: a naive Pillow loop against pack-images at 1, 2 and all workers.

One run on one machine answers "what does pack-images cost and win". Two sample
folders are made once per run with a fixed seed (ImageNet-like JPEGs, and large
photos with the short side >= 2000 px) and every source file is read once before
timing, so all rows see a warm page cache and measure CPU work, not the disk.

Every row writes the same bytes somewhere, so none gets a free ride: the naive
loop (full decode, ``convert("RGB")``, bilinear resize of the shorter side to
``size``, centre crop, the plain torchvision way) and the ``decode_image`` loops
append their pixels to one output file and fsync it at the end, as
``pack_folder`` (which also writes and fsyncs its index) does. ``pack_folder``
does not take draft/reducing_gap, so their ablation times ``decode_image`` in a
single-process loop with ``DecodeSettings`` variants instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from imgpack.diagnose.measure import stat
from imgpack.errors import BenchError
from imgpack.packer import decode, discover
from imgpack.packer.pack import pack_folder, pack_workers
from imgpack.packer.settings import DecodeSettings
from workbench.bench_pack_report import (
    FOLDERS,
    NOTES,
    add_ratios,
    filesystem,
    loadavg,
    machine_facts,
    targets,
)
from workbench.sample import make_sample_folder

__all__ = [
    "QUICK",
    "ABLATIONS",
    "FOLDERS",
    "naive_pixels",
    "run_pack_benchmark",
]

QUICK = {"imagenet_images": 20, "large_images": 2, "repeats": 2}
# (draft, reducing_gap) pairs timed through decode_image on the large photos
ABLATIONS: tuple[tuple[bool, float | None], ...] = (
    (False, None),
    (True, None),
    (False, 2.0),
    (True, 2.0),
    (False, 3.0),
    (True, 3.0),
)
_CLASSES = 10  # sample folders have up to this many classes; counts round down to a multiple
_MARK = ".imgpack-bench-sample"  # a sample folder this tool made, and may therefore remove

Log = Callable[[str], None]


def naive_pixels(path: str | os.PathLike, size: int) -> bytes:
    """The plain way: full decode, RGB, shorter side to ``size`` (bilinear), centre crop."""
    with Image.open(path) as img:
        img = img.convert("RGB")
    w, h = img.size
    new = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    img = img.resize(new, Image.Resampling.BILINEAR)
    left, top = int(round((new[0] - size) / 2.0)), int(round((new[1] - size) / 2.0))
    return img.crop((left, top, left + size, top + size)).tobytes()


def _time_loop(paths: list[Path], one: Callable[[Path], Any], out: Path) -> tuple[float, int]:
    """Seconds to turn every path into bytes appended to ``out`` (fsynced), and bytes written."""
    t0 = time.perf_counter()
    with open(out, "wb") as f:
        for p in paths:
            f.write(one(p))
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    return seconds, out.stat().st_size


def _check_ours(dest: Path) -> None:
    """Refuse to remove a folder this tool did not make."""
    if dest.exists() and not (dest / _MARK).is_file():
        raise BenchError(f"{dest}: exists and was not made by bench_pack; use another --workdir")


def _make_folder(dest: Path, n: int, *, large: bool, seed: int) -> int:
    """(Re)make one sample folder of about ``n`` images; return how many it holds."""
    _check_ours(dest)
    if dest.exists():
        shutil.rmtree(dest)
    classes = min(_CLASSES, n)
    per_class = n // classes
    make_sample_folder(dest, classes=classes, per_class=per_class, large=large, seed=seed)
    (dest / _MARK).write_text("made by workbench.bench_pack; removed on the next run\n")
    return classes * per_class


def _describe(paths: list[Path]) -> dict[str, Any]:
    """Images, bytes and the mean/min size of a folder, read from the headers."""
    sizes = []
    for p in paths:
        with Image.open(p) as img:
            sizes.append(img.size)
    arr = np.array(sizes)
    return {
        "images": len(paths),
        "bytes": sum(p.stat().st_size for p in paths),
        "mean_size": [int(v) for v in arr.mean(axis=0).round()],
        "min_short_side": int(arr.min(axis=1).min()),
    }


def _warm(paths: list[Path]) -> int:
    """Read every source file once so that each timed pass finds it in the page cache."""
    total = 0
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    return total


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _mean_abs_diff(naive_raw: Path, index: dict[str, Any], out_bin: Path) -> float:
    """Mean |packed - naive| over all pixels: how close the two jobs' outputs are."""
    n, (h, w, c) = index["count"], index["shape"]
    rb = h * w * c  # a stretch pack: every record is the bound's size, raw
    naive = np.memmap(naive_raw, dtype=np.uint8, mode="r", shape=(n, rb))
    packed = np.memmap(
        out_bin, dtype=np.uint8, mode="r", offset=index["data_offset"], shape=(n, rb)
    )
    total = 0
    for k in range(0, n, 64):
        a, b = naive[k : k + 64].astype(np.int16), packed[k : k + 64].astype(np.int16)
        total += int(np.abs(a - b).sum(dtype=np.int64))
    return total / max(1, n * rb)


def run_pack_benchmark(
    *,
    workdir: str | os.PathLike,
    imagenet_images: int = 600,
    large_images: int = 40,
    repeats: int = 3,
    size: int = 224,
    workers: Sequence[int] | None = None,
    seed: int = 0,
    command: str | None = None,
    log: Log | None = None,
) -> dict[str, Any]:
    """Make both folders, time every row ``repeats`` times; return the JSON-ready result.

    ``workers``: pack-images worker counts (default 1, 2 and all usable cores).
    """
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if min(imagenet_images, large_images, repeats, size) < 1:
        raise BenchError("imagenet_images, large_images, repeats and size must all be >= 1")
    cores = pack_workers()
    workers = sorted(set(workers or (1, min(2, cores), cores)))
    if workers[0] < 1:
        raise BenchError(f"worker counts must be >= 1, got {workers}")
    if 1 not in workers:
        workers.insert(0, 1)  # every speed-up and efficiency is relative to 1 worker
    machine = machine_facts()  # load average before the run starts
    workdir = Path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise BenchError(f"{workdir}: --workdir is a file, expected a folder")
    for name in FOLDERS:
        _check_ours(workdir / name)  # before any work: refuse early, leave nothing behind
    (workdir / "out").mkdir(parents=True, exist_ok=True)

    counts = {"imagenet-like": imagenet_images, "large": large_images}
    folders: dict[str, dict[str, Any]] = {}
    paths: dict[str, list[Path]] = {}
    for name in FOLDERS:
        log(f"making {name} sample folder ({counts[name]} images, seed {seed})")
        _make_folder(workdir / name, counts[name], large=name == "large", seed=seed)
        listing = discover.discover(workdir / name)
        paths[name] = [listing.root / rel for rel, _ in listing.files]
        folders[name] = {"path": str(listing.root), **_describe(paths[name])}

    plan = _plan(workers)
    samples: dict[tuple, list[float]] = {key: [] for name in FOLDERS for key in plan[name]}
    facts: dict[tuple, dict[str, Any]] = {}
    if hasattr(os, "sync"):
        os.sync()  # the new samples' writeback must not land inside a timed pass
    for name in FOLDERS:
        _warm(paths[name])
        naive_pixels(paths[name][0], size)  # untimed warm-up: plugins, decoder libraries
        decode.decode_image(paths[name][0], DecodeSettings(size, size))
    for r in range(repeats):
        for name in FOLDERS:
            for key in plan[name]:
                log(f"repeat {r + 1}/{repeats}: {name} {_label(key)}")
                seconds, fact = _measure(key, name, paths[name], workdir, size)
                samples[key].append(len(paths[name]) / seconds)
                facts[key] = fact

    rows = [
        _row(key, name, stat(samples[key]), facts[key], len(paths[name]))
        for name in FOLDERS
        for key in plan[name]
    ]
    add_ratios(rows)
    for name in FOLDERS:
        folders[name]["identical_across_workers"] = (
            len({r["sha256"] for r in rows if r["folder"] == name and r["row"] == "pack"}) == 1
        )
        diff = facts[(name, "pack", 1)].get("mean_abs_diff_vs_naive")
        folders[name]["pack_mean_abs_diff_vs_naive"] = None if diff is None else round(diff, 3)
    machine["loadavg_end"] = loadavg()
    return {
        "benchmark": "imgpack pack",
        "command": command,
        "machine": machine,
        "settings": {
            "size": size,
            "repeats": repeats,
            "workers": workers,
            "seed": seed,
            "workdir_filesystem": filesystem(workdir),
            **NOTES,
        },
        "folders": folders,
        "rows": rows,
        "targets": targets(rows, workers),
    }


def _plan(workers: list[int]) -> dict[str, list[tuple]]:
    """Row keys per folder, in the order they run within a repeat."""
    plan = {}
    for name in FOLDERS:
        ablations = ABLATIONS if name == "large" else ((True, None),)
        plan[name] = [
            (name, "naive", 1),
            *[(name, "decode", 1, d, g) for d, g in ablations],
            *[(name, "pack", w) for w in workers],
        ]
    return plan


def _label(key: tuple) -> str:
    if key[1] == "naive":
        return "naive Pillow loop"
    if key[1] == "decode":
        return f"decode_image loop, draft {'on' if key[3] else 'off'}, reducing_gap {key[4]}"
    return f"pack-images, {key[2]} worker{'s' if key[2] > 1 else ''}"


def _measure(key: tuple, name: str, paths: list[Path], workdir: Path, size: int):
    """One timed pass of row ``key``: (seconds, facts to keep about its output)."""
    out = workdir / "out"
    if key[1] == "naive":
        seconds, nbytes = _time_loop(paths, lambda p: naive_pixels(p, size), out / f"{name}.naive")
        return seconds, {"output_bytes": nbytes}
    if key[1] == "decode":
        s = DecodeSettings(size, size, draft=key[3], reducing_gap=key[4])
        raw = out / "decode.raw"
        seconds, nbytes = _time_loop(paths, lambda p: decode.decode_image(p, s), raw)
        raw.unlink()
        return seconds, {"output_bytes": nbytes, "draft": key[3], "reducing_gap": key[4]}
    out_bin = out / f"{name}-w{key[2]}.bin"
    for p in (out_bin, out_bin.with_suffix(".json")):
        p.unlink(missing_ok=True)
    t0 = time.perf_counter()
    summary = pack_folder(  # force: a partial left by an interrupted run of ours goes too
        workdir / name, out_bin, size=(size, size), workers=key[2], progress=False, force=True
    )
    seconds = time.perf_counter() - t0
    fact = {
        "output_bytes": summary.bytes,
        "count": summary.count,
        "skipped": len(summary.skipped),
        "sha256": _sha256(out_bin),
    }
    if key[2] == 1:
        fact["mean_abs_diff_vs_naive"] = _mean_abs_diff(
            out / f"{name}.naive", summary.index, out_bin
        )
    return seconds, fact


def _row(key: tuple, name: str, s, fact: dict[str, Any], images: int) -> dict[str, Any]:
    fact = {k: v for k, v in fact.items() if k != "mean_abs_diff_vs_naive"}
    return {
        "folder": name,
        "row": key[1],
        "label": _label(key),
        "workers": key[2],
        "images": images,
        **s.to_json(),
        "seconds": round(images / s.median, 4),
        **fact,
    }
