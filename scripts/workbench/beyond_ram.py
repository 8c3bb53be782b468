"""Training input from a JPEG pack ten times larger than the memory the process may use.

``make_packs`` packs real photographs once (``--codec jpeg --resize fit``), then writes a
large pack of those records over and over (each keeps its digest, so nothing is decoded
twice) up to the size asked for. ``run_case`` runs a training loop's input side in a child
process: ``make_loader`` with ``DeviceTransform.train`` over a shuffled pass, each record
decoded at its crop's scale and handed over ready for the device's resample to 224
(``bench_jpeg_speed.gpu_stages``: the stages make_loader chooses for a GPU), the child
inside a memory cgroup of the size asked for, so the kernel cannot keep more of the pack
than that in the page cache. The same loop over
the small pack, warm in the page cache, is the reference: the ratio says whether reading
from the disk slowed the loop at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import BenchError

__all__ = ["make_packs", "memory_cgroup", "run_case", "CHILD"]

# The child: joins the cgroup before it imports torch, so everything it maps counts.
CHILD = textwrap.dedent(
    """
    import json, os, resource, sys, time
    procs, pack, batches, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if procs:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    import torch
    from imgpack import DeviceTransform, PackedImageDataset
    from imgpack.machine import usable_cores
    from imgpack.reader.read import Pixels
    from workbench.bench_jpeg_speed import gpu_stages

    def read_bytes():
        with open("/proc/self/io") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("read_bytes"))

    torch.manual_seed(0)
    ds = PackedImageDataset(pack)
    t = DeviceTransform.train(ds, 224)  # up to the device: no CPU resample
    source, plan = gpu_stages(ds, t, batch, 0, usable_cores(), Pixels)

    def passes():
        epoch = 0
        while True:
            plan.begin(epoch, 0)
            yield from source.batches(plan)
            epoch += 1

    it, seen, waited = passes(), 0, 0.0
    r0, t0 = read_bytes(), time.perf_counter()
    for k in range(batches):
        w0 = time.perf_counter()
        batch_ = next(it)  # a small pack: its passes one after the other
        images, labels = batch_.images, batch_.rest[0]
        waited += time.perf_counter() - w0
        seen += len(labels)
        int(images[:, :, ::32, ::32].sum())  # touch the batch, as a model would
    dt = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"images": seen, "seconds": dt, "images_per_s": seen / dt,
                      "waited_s": waited, "read_mb": (read_bytes() - r0) / 1e6,
                      "major_faults": usage.ru_majflt,
                      "max_rss_mb": usage.ru_maxrss / 1024}))
    """
)


def make_packs(
    work: Path, gigabytes: float, photos: int = 200, side: int = 384
) -> tuple[Path, Path]:
    """(small, big): the photographs packed as jpeg q90 at ``side``, and ``gigabytes`` GiB of
    their records repeated."""
    from imgpack.format.index import read_index
    from imgpack.packer.digest import digest_stored
    from imgpack.packer.pack import pack_folder
    from imgpack.packer.writer import PackWriter
    from workbench.bench_augment import make_photos

    small, big = work / "small.bin", work / "big.bin"
    if not small.exists():
        src = make_photos(work / "photos", photos, 0)
        pack_folder(src, small, size=(side, side), resize="fit", codec="jpeg", progress=False)
    if big.exists():
        return small, big
    ix = read_index(small)
    data = np.fromfile(small, np.uint8)
    base, offsets, sizes = ix.sections["pixels"].offset, ix.record_offsets, ix.record_sizes
    recs = [data[base + offsets[i] : base + offsets[i + 1]].copy() for i in range(ix.count)]
    digests = [
        digest_stored(r, "jpeg", *sizes[i].tolist(), ix.channels) for i, r in enumerate(recs)
    ]
    mean = float(offsets[-1]) / ix.count
    count = int(gigabytes * 2**30 / mean)
    with PackWriter(big, height=side, width=side, classes=["photos"], codec="jpeg") as w:
        for k in range(count):
            i = k % ix.count
            w.append(recs[i], 0, f"photos/{k}.jpg", digests[i], size=tuple(sizes[i].tolist()))
        w.finish(packer={"size": [side, side], "resize": "fit", "filter": "bilinear",
                         "codec": "jpeg", "quality": 90})  # fmt: skip
    return small, big


def memory_cgroup(megabytes: int) -> tuple[Path, str] | None:
    """A cgroup v1 memory group limited to ``megabytes`` (its folder, its procs file), or None
    where this process may not make one (not root, no v1 memory controller)."""
    root = Path("/sys/fs/cgroup/memory")
    if not (root / "cgroup.procs").exists():
        return None
    folder = root / f"imgpack-beyond-ram-{os.getpid()}"
    try:
        folder.mkdir(exist_ok=True)
        (folder / "memory.limit_in_bytes").write_text(str(megabytes << 20))
    except OSError:
        return None
    return folder, str(folder / "cgroup.procs")


def _peak(folder: Path | None) -> float | None:
    if folder is None:
        return None
    return int((folder / "memory.max_usage_in_bytes").read_text()) / 2**20


def run_case(pack: Path, batches: int, batch: int, cgroup: tuple[Path, str] | None,
             cold: bool) -> dict[str, Any]:  # fmt: skip
    """One child's loop over ``pack``; ``cold`` drops the pack's pages first."""
    from imgpack.diagnose.measure import cached_fraction, drop_cache

    if cold:
        drop_cache(pack)
    elif cached_fraction(pack) != 1.0:
        np.fromfile(pack, np.uint8)  # read it once, so it is warm
    folder, procs = cgroup if cgroup else (None, "")
    if folder is not None:
        (folder / "memory.max_usage_in_bytes").write_text("0")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, procs, str(pack), str(batches), str(batch)],
                         capture_output=True, text=True, env=env, timeout=1800)  # fmt: skip
    if out.returncode != 0:
        raise BenchError(
            f"{pack}: the child failed ({out.returncode}): {out.stderr.strip()[-800:]}"
        )
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(pack=pack.name, pack_gb=pack.stat().st_size / 2**30, cold=cold,
               cgroup_peak_mb=_peak(folder), wall_s=time.perf_counter() - t0)  # fmt: skip
    return row
