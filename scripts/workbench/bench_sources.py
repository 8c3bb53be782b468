"""Packing tar shards and Parquet files against packing the same images as a folder.

Issue 26's promise: packing the images of a tar or Parquet source gives the records
packing them as a folder gives, byte for byte, at no less than 0.9x the folder's images/s.
One set of ImageNet-like JPEGs (``sample.cut_images``, real photographs) is written three
ways: a class folder (``class_XX/NNNNN.jpg``); WebDataset tar shards whose members are
those same relative paths plus a ``.cls`` (so the tar order is the folder's order); and
Parquet files in the Hub's layout (``struct<bytes, path>`` images, an int64 label whose
``ClassLabel`` names sit in the ``huggingface`` schema metadata, 100 rows a row group as
the ``datasets`` library writes image sets).

Each repeat packs all three, side by side, in an order that rotates every repeat (no kind
always first on a machine whose load drifts), after every source file was read once (a
warm page cache: CPU work, not the disk). Reported per kind: the median seconds and
images/s, and the ratio to the folder, as the median of the per-repeat ratios (each pair
measured within one repeat) with their min and max: the spread says how noisy the machine
was. Before timing, every kind's records are checked equal to the folder's. The listing
(the source stage alone: a folder walk, the tar headers and label members, the Parquet
label column) is timed apart too, as a rate per sample: it runs on one core before any
decoding, so it is the part of a pack that does not scale with the cores.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.format.index import read_index
from imgpack.packer.pack import pack_folder, pack_workers
from imgpack.packer.sources.select import open_source
from workbench.bench_pack_report import filesystem, loadavg, machine_facts
from workbench.errors import BenchError
from workbench.sample import cut_images

__all__ = ["KINDS", "QUICK", "record_bytes", "run_sources_bench", "write_sources"]

KINDS = ("folder", "tar", "parquet")
QUICK = {"images": 40, "repeats": 2, "shards": 2, "size": 64}
_CLASSES = 10
_ROW_GROUP = 100  # rows per row group in the Hub's image datasets
_MARK = ".imgpack-bench-sources"


def write_sources(work: Path, images: int, shards: int, seed: int) -> dict[str, list[str]]:
    """The same JPEGs as a folder, ``shards`` tar shards and ``shards`` Parquet files under
    ``work``; returns each kind's SRC arguments."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if work.exists() and any(work.iterdir()) and not (work / _MARK).is_file():
        raise BenchError(f"{work}: not empty and not made by bench_sources; use another --work")
    for kind in KINDS:
        shutil.rmtree(work / kind, ignore_errors=True)
        (work / kind).mkdir(parents=True)
    (work / _MARK).write_text("made by workbench.bench_sources; remade on every run\n")
    per_class = max(1, images // _CLASSES)
    names = [f"class_{c:02d}" for c in range(_CLASSES)]
    samples = []  # (relative path, label, bytes), in the folder's pack order
    for n, (img, _) in enumerate(cut_images(per_class * _CLASSES, seed=seed)):
        c, i = divmod(n, per_class)
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90)
        samples.append((f"{names[c]}/{i:05d}.jpg", c, buf.getvalue()))
    for rel, _, data in samples:
        path = work / "folder" / rel
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    features = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
    meta = {"huggingface": json.dumps({"info": {"features": features}})}
    cuts = np.array_split(np.arange(len(samples)), shards)
    for s, part in enumerate(cuts):
        with tarfile.open(
            work / "tar" / f"train-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT
        ) as tf:
            for k in part:
                rel, label, data = samples[k]
                key = rel.rsplit(".", 1)[0]
                for name, payload in ((rel, data), (f"{key}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
        rows = [samples[k] for k in part]
        table = pa.table(
            {
                "image": pa.array([{"bytes": d, "path": r} for r, _, d in rows], image_type),
                "label": pa.array([lab for _, lab, _ in rows], pa.int64()),
            }
        ).replace_schema_metadata(meta)
        name = f"train-{s:05d}-of-{shards:05d}.parquet"
        pq.write_table(table, work / "parquet" / name, row_group_size=_ROW_GROUP)
    return {
        "folder": [str(work / "folder")],
        "tar": sorted(str(p) for p in (work / "tar").glob("*.tar")),
        "parquet": sorted(str(p) for p in (work / "parquet").glob("*.parquet")),
    }


def record_bytes(out: Path) -> tuple[bytes, bytes, bytes]:
    """(records, labels, checksums) of a pack, as stored: what must not differ by source."""
    index = read_index(out)
    raw = np.fromfile(index.data_path, dtype=np.uint8)
    pixels = raw[index.data_offset : index.data_offset + int(index.record_offsets[-1])]
    return (
        pixels.tobytes(),
        index.section_array("labels", raw).tobytes(),
        index.section_array("checksums", raw).tobytes(),
    )


def _warm(paths: list[str]) -> int:
    """Read every source file once; returns the bytes read."""
    total = 0
    for p in paths:
        for root, _, files in os.walk(p) if os.path.isdir(p) else [("", [], [p])]:
            for f in files:
                with open(os.path.join(root, f), "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        total += len(chunk)
    return total


def run_sources_bench(
    work: str | os.PathLike,
    *,
    quick: bool = False,
    seed: int = 0,
    images: int = 1000,
    repeats: int = 5,
    shards: int = 8,
    size: int = 224,
    workers: int | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Pack the three kinds ``repeats`` times each (see the module docstring)."""
    if quick:
        images, repeats, shards, size = (QUICK[k] for k in ("images", "repeats", "shards", "size"))
    import pyarrow

    facts = {**machine_facts(), "pyarrow": pyarrow.__version__}  # the load before the run
    work = Path(work)
    workers = workers or pack_workers()
    log(f"writing {images} images as a folder, {shards} tar shards and {shards} Parquet files")
    sources = write_sources(work, images, shards, seed)
    source_bytes = {k: _warm(v) for k, v in sources.items()}
    outs = {k: work / f"{k}.bin" for k in KINDS}
    settings = {"size": (size, size), "workers": workers, "progress": False, "force": True}
    for kind in KINDS:
        pack_folder(sources[kind], outs[kind], **settings)
    reference = record_bytes(outs["folder"])
    equal = {k: record_bytes(outs[k]) == reference for k in KINDS}
    if not all(equal.values()):
        raise BenchError(
            f"records differ from the folder's: {[k for k, v in equal.items() if not v]}"
        )
    count = read_index(outs["folder"]).count
    seconds: dict[str, list[float]] = {k: [] for k in KINDS}
    listing: dict[str, list[float]] = {k: [] for k in KINDS}
    start_load = loadavg()
    for r in range(repeats):
        order = KINDS[r % 3 :] + KINDS[: r % 3]
        for kind in order:
            t0 = time.perf_counter()
            open_source(sources[kind]).listing()  # the first stage alone, on one core
            t1 = time.perf_counter()
            pack_folder(sources[kind], outs[kind], **settings)
            seconds[kind].append(time.perf_counter() - t1)
            listing[kind].append(t1 - t0)
        log(f"repeat {r + 1}/{repeats}: " + ", ".join(f"{k} {seconds[k][-1]:.2f} s" for k in KINDS))
    rows = []
    for kind in KINDS:
        ratios = [f / s for f, s in zip(seconds["folder"], seconds[kind])]
        median = statistics.median(seconds[kind])
        rows.append(
            {
                "kind": kind,
                "sources": len(sources[kind]) if kind != "folder" else 1,
                "source_bytes": source_bytes[kind],
                "seconds": seconds[kind],
                "median_s": median,
                "images_per_s": count / median,
                "listing_s": statistics.median(listing[kind]),
                "vs_folder": statistics.median(ratios),
                "vs_folder_min": min(ratios),
                "vs_folder_max": max(ratios),
                "records_equal": equal[kind],
            }
        )
    return {
        "machine": facts,
        "filesystem": filesystem(work),
        "loadavg": {"start": start_load, "end": loadavg()},
        "settings": {
            "images": count,
            "repeats": repeats,
            "shards": shards,
            "size": size,
            "workers": workers,
            "seed": seed,
            "row_group": _ROW_GROUP,
        },  # fmt: skip
        "rows": rows,
    }
