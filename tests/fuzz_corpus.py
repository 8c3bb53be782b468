"""The fuzzer's pristine files: real packs made by the real packer from seven tiny images.

Six 8x6 PNGs in two classes and one file that does not decode, packed three ways:
``index/`` one pack; ``manifest/`` two shards and the manifest ``merge_packs`` writes;
``journal/`` a pack stopped after four records, as Ctrl-C there would leave it (the
partial file and its journal). Six more PNGs of other aspects are packed
``--resize fit`` (``index-fit/``, raw records of their own sizes), fit + yuv420
(``index-yuv/``) and fit + jpeg (``index-jpeg/``: JPEG streams of their own lengths).
Made once per run (0.3 s), copied for every case.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import interrupt_after
from PIL import Image

from imgpack.format.index import PackIndex, read_index
from imgpack.format.layout import HEADER_BYTES
from imgpack.packer import discover as discovery
from imgpack.packer.journal import journal_path
from imgpack.packer.merge import merge_packs
from imgpack.packer.pack import pack_folder
from imgpack.packer.writer import partial_path

__all__ = ["SIZE", "Target", "Corpus", "make_corpus"]

SIZE = (8, 6)  # (width, height) of every record: 144 bytes
KEPT = 4  # records the interrupted run wrote before it was stopped
FIT = 8  # --resize fit --size 8: records up to 8x8, each of its own size
SHAPES = ((8, 6), (5, 9), (12, 3), (3, 3), (16, 16), (7, 1))  # the fit packs' sources


@dataclass
class Target:
    """Pristine files of one target: role -> (file name, form), and byte zones for flips."""

    name: str
    folder: Path
    files: dict[str, tuple[str, str]]
    zones: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)

    @property
    def roles(self) -> dict[str, str]:
        return {role: form for role, (_, form) in self.files.items()}


@dataclass
class Corpus:
    src: Path
    files: list[tuple[str, int]]  # the source listing, as the packer sees it
    fresh: Path  # the uninterrupted pack a resume must reproduce
    targets: dict[str, Target]


def _write_source(src: Path) -> None:
    """Seven files: six 8x6 PNGs in two classes and one that does not decode (a skip)."""
    for k in range(6):
        cls = "ab"[k % 2]
        px = (np.arange(6 * 8 * 3, dtype=np.uint32).reshape(6, 8, 3) * (k + 3) + 17 * k) % 251
        (src / cls).mkdir(parents=True, exist_ok=True)
        Image.fromarray(px.astype(np.uint8)).save(src / cls / f"{k}.png")
    (src / "b" / "9.png").write_bytes(b"not a png")


def _write_shapes(src: Path) -> None:
    """Six PNGs of other aspects (wide, tall, square, smaller than the fit size)."""
    for k, (w, h) in enumerate(SHAPES):
        px = (np.arange(h * w * 3, dtype=np.uint32).reshape(h, w, 3) * (k + 5) + 29 * k) % 253
        (src / "ab"[k % 2]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(px.astype(np.uint8)).save(src / "ab"[k % 2] / f"{k}.png")


def _bin_zones(index: PackIndex) -> dict[str, tuple[int, int]]:
    px = index.sections["pixels"]
    # the header's fields: the struct, the pack id and the codec
    return {"fields": (0, 64), "padding": (64, HEADER_BYTES), "pixels": (px.offset, px.end),
            "tail": (px.end, index.data_file_bytes)}  # fmt: skip


def make_corpus(root: Path) -> Corpus:
    """Build the source folder and the three targets' pristine files under ``root``."""
    src = root / "src"
    _write_source(src)
    pack = dict(size=SIZE, workers=1, progress=False)
    index_dir, shard_dir, journal_dir = root / "index", root / "manifest", root / "journal"
    for d in (index_dir, shard_dir, journal_dir):
        d.mkdir()
    pack_folder(src, index_dir / "p.bin", **pack)
    shards = [shard_dir / f"s{i}.bin" for i in range(2)]
    for i, out in enumerate(shards):
        pack_folder(src, out, num_shards=2, shard_index=i, **pack)
    merge_packs(shard_dir / "m.manifest.json", shards)
    shapes = root / "src-shapes"
    _write_shapes(shapes)
    fit_dir, yuv_dir, jpeg_dir = root / "index-fit", root / "index-yuv", root / "index-jpeg"
    for d, codec in ((fit_dir, "raw"), (yuv_dir, "yuv420"), (jpeg_dir, "jpeg")):
        d.mkdir()
        pack_folder(shapes, d / "p.bin", resize="fit", codec=codec, **{**pack, "size": (FIT,) * 2})
    with pytest.MonkeyPatch.context() as mp:
        interrupt_after(mp, KEPT + 1)
        try:
            pack_folder(src, journal_dir / "p.bin", **pack)
        except KeyboardInterrupt:
            pass
    ix, s1 = read_index(index_dir / "p.bin"), read_index(shards[1])
    part = journal_dir / partial_path(journal_dir / "p.bin").name
    partial_zones = {"padding": (0, HEADER_BYTES), "pixels": (HEADER_BYTES, 1 << 40)}
    index_files = {"index": ("p.json", "json"), "bin": ("p.bin", "bin")}
    shard_files = {"manifest": ("m.manifest.json", "json"), "shard-index": ("s0.json", "json"),
                   "shard-bin": ("s1.bin", "bin")}  # fmt: skip
    journal_files = {"journal": (journal_path(journal_dir / "p.bin").name, "lines"),
                     "partial": (part.name, "bin")}  # fmt: skip
    targets = {
        "index": Target("index", index_dir, index_files, {"bin": _bin_zones(ix)}),
        "manifest": Target("manifest", shard_dir, shard_files, {"shard-bin": _bin_zones(s1)}),
        "journal": Target("journal", journal_dir, journal_files, {"partial": partial_zones}),
    }
    for name, d in (("index-fit", fit_dir), ("index-yuv", yuv_dir), ("index-jpeg", jpeg_dir)):
        targets[name] = Target(name, d, index_files, {"bin": _bin_zones(read_index(d / "p.bin"))})
    files = discovery.discover(src).files
    return Corpus(src, files, index_dir / "p.bin", targets)
