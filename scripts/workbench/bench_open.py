"""How long opening a pack takes as the record count grows (issue #2: 1M records, well under 1 s).

Opening must not scale with per-record Python work: the index JSON holds no
per-record entries, and labels, CRCs and paths are flat sections read by numpy.
This builds a pack of tiny records (the pixels do not matter for opening) and
times ``read_index`` and ``PackedImageDataset(...)`` plus the first sample.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np

from imgpack.format.index import read_index
from imgpack.packer.digest import digest_record
from imgpack.packer.writer import PackWriter

__all__ = ["make_tiny_pack", "time_open"]


def make_tiny_pack(path: str | os.PathLike, count: int, *, classes: int = 1000) -> Path:
    """A pack of ``count`` 4x4 records labelled round-robin, with ImageNet-like path lengths."""
    path = Path(path)
    record = np.zeros((4, 4, 3), dtype=np.uint8)
    digest = digest_record(record)  # every record is the same: digest once
    names = [f"n{c:08d}" for c in range(classes)]
    with PackWriter(path, height=4, width=4, classes=names) as w:
        for i in range(count):
            c = i % classes
            w.append(record, c, f"{names[c]}/{names[c]}_{i:07d}.JPEG", digest=digest)
        w.finish(packer={"size": [4, 4], "resize": "stretch", "filter": "bilinear"})
    return path


def time_open(path: str | os.PathLike, *, repeats: int = 5) -> dict[str, float]:
    """Median seconds for read_index, and for a dataset's open + len + targets + first item."""
    from imgpack.reader.dataset import PackedImageDataset

    index_s, dataset_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        read_index(path)
        t1 = time.perf_counter()
        ds = PackedImageDataset(path, prefault=False)
        len(ds), ds.targets, ds[0], ds.source_path(len(ds) - 1)
        t2 = time.perf_counter()
        ds.close()
        index_s.append(t1 - t0)
        dataset_s.append(t2 - t1)
    return {
        "records": read_index(path).count,
        "json_bytes": Path(path).with_suffix(".json").stat().st_size,
        "read_index_s": statistics.median(index_s),
        "dataset_open_s": statistics.median(dataset_s),
    }
