#!/usr/bin/env python3
"""Packing: ``pack-images`` beside FFCV's writer, on the same photographs, same workers.

    python scripts/bench_pack.py                    # 1,000 ImageNet-like JPEGs, 1 and all cores
    python scripts/bench_pack.py --images 40 --repeats 1                                 # a try
    python scripts/bench_pack.py --large --images 200     # camera photographs: the JPEG draft

Both sides store what FFCV stores by default: each image whole, its longer side at most
``--size`` (256), raw RGB pixels (``pack-images --resize fit --size 256``; FFCV's
``RGBImageField(write_mode="raw", max_resolution=256)``). The sides:

* ``pack-images``, the command, its process start and imports counted (what a user waits
  for), and the same command called in this process ("in-process": imports done).
* FFCV's own ``DatasetWriter``, where ``ffcv`` imports, called in this process as FFCV's
  examples call it: ``from_indexed_dataset`` of a dataset giving ``(Image.open(f).convert(
  "RGB"), label)``, ``num_workers`` processes.
* FFCV's writer emulated: each worker process decodes the whole image with Pillow, shrinks
  it with ``cv2.resize(INTER_AREA)`` (``ffcv_like.resize``) and appends the pixels to a file
  of its own. That is FFCV's per-image work and none of its machinery: no
  ``RGBImageField.encode`` (``np.array`` of the image, the checks, the copy into a page),
  no page allocator (8 MiB pages zeroed, written in page order, workers waiting on a
  spin lock for their turn), no shared-memory metadata table, no progress loop polling
  every 0.1 s, no allocation table or header written at the end. It is the bound FFCV's
  writer cannot beat, shown beside FFCV itself where FFCV installs.

FFCV 1.0.2 builds from its sdist beside torch 2.13 (CPU) in a venv of its own: Debian's
``pkg-config libturbojpeg0-dev libopencv-dev``, then ``pip install torch==2.13.0 numba
opencv-python-headless pillow simplejpeg click tqdm terminaltables assertpy psutil fastargs``,
``pip install --no-deps --no-build-isolation ffcv`` and ``pip install --no-deps -e .``.

The ratios compare like with like where FFCV runs: in-process against ``DatasetWriter``
(both in this process), and the command against it (start counted on our side only). The
source files are read once before timing (warm page cache: CPU work, not the disk); the
sides alternate, ``--repeats`` times: medians.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import importlib.metadata
import io
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import numpy as np
from common import OUT, alternate, machine, make_folder, pack, save, table
from ffcv_like import RESIZE, resize
from PIL import Image

import imgpack

_out = None  # each emulated FFCV worker's own output file


def _open(folder: str) -> None:
    global _out
    _out = open(os.path.join(folder, f"{os.getpid()}.raw"), "wb")


def _encode(job: tuple[str, int]) -> int:
    path, size = job
    image = np.asarray(Image.open(path).convert("RGB"))
    h, w = image.shape[:2]
    scale = size / max(h, w)
    if scale < 1:
        dims = (max(1, round(w * scale)), max(1, round(h * scale)))
        image = resize(image, *dims)
    _out.write(image.tobytes())
    _out.flush()
    return image.nbytes


def ffcv_emulated(files: list[Path], size: int, workers: int, work: Path) -> float:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(workers, _open, (str(work),)) as pool:
        sum(pool.imap_unordered(_encode, [(str(f), size) for f in files], chunksize=16))
    return time.perf_counter() - t0


def ffcv_real(files: list[Path], size: int, workers: int, work: Path) -> float:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    class Folder:  # what FFCV's examples hand it: (PIL image, label) pairs
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            return Image.open(files[i]).convert("RGB"), 0

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    fields = {"image": RGBImageField(write_mode="raw", max_resolution=size), "label": IntField()}
    t0 = time.perf_counter()
    DatasetWriter(str(work / "ffcv.beton"), fields, num_workers=workers).from_indexed_dataset(
        Folder()
    )
    return time.perf_counter() - t0


def in_process(src: Path, out: Path, *options: str) -> float:
    """``pack-images`` run in this process, its imports already done (as FFCV's writer is)."""
    from imgpack.packer.cli import main

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # its one-line summary
        main([str(src), str(out), *options, "--force"], "pack-images", standalone_mode=False)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", help="comma-separated counts (default: 1 and every core)")
    p.add_argument("--large", action="store_true", help="camera-sized photographs (2,000 px+)")
    a = p.parse_args()
    src = OUT / f"pack-src-{a.images}{'-large' if a.large else ''}"
    if not src.exists():
        make_folder(src, classes=10, per_class=max(1, a.images // 10), large=a.large)
    files = sorted(src.rglob("*.jpg"))
    for f in files:
        f.read_bytes()  # warm
    # byte-compiled, as pip leaves an installed package: a checkout run under
    # PYTHONDONTWRITEBYTECODE would compile every module again at each start of the command
    compileall.compile_dir(Path(imgpack.__file__).parent, quiet=1)
    try:
        import ffcv  # noqa: F401

        real = f"FFCV {importlib.metadata.version('ffcv')} DatasetWriter"
    except ImportError:
        real = None
    counts = a.workers.split(",") if a.workers else (1, len(os.sched_getaffinity(0)))
    n, rows, results = len(files), [], {}
    for workers in sorted(set(map(int, counts))):
        options = ("--resize", "fit", "--size", str(a.size), "--workers", str(workers))
        sides = {
            "pack-images": lambda o=options: n / pack(src, OUT / "pack-out.bin", *o),
            "in-process": lambda o=options: n / in_process(src, OUT / "pack-in.bin", *o),
            "FFCV emulated": lambda w=workers: n / ffcv_emulated(files, a.size, w, OUT / "ffcv-em"),
        }
        if real:
            sides[real] = lambda w=workers: n / ffcv_real(files, a.size, w, OUT / "ffcv-out")
        got = alternate(sides, a.repeats)
        results[f"{workers} workers"] = got
        med = {k: v["median"] for k, v in got.items()}
        theirs = med[real or "FFCV emulated"]
        rows.append(
            [workers, *(round(v) for v in med.values())]
            + [f"{med['pack-images'] / theirs:.2f}x", f"{med['in-process'] / theirs:.2f}x"]
        )
    print(machine())
    print(f"FFCV's resize: {RESIZE}; {real or 'ffcv does not import here: emulated only'}")
    sizes = "2,000 px and more" if a.large else "about 400x350"
    print(
        f"{n} JPEGs ({sizes}), longer side to {a.size}, raw, warm page cache, "
        f"medians of {a.repeats}; images/s (pack-images counts starting its process); "
        f"ratios against {real or 'the emulation'}"
    )
    head = ["workers", *sides, "pack-images / FFCV", "in-process / FFCV"]
    print(table(head, rows))
    save("bench_pack", results)


if __name__ == "__main__":
    main()
