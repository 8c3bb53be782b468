"""What the fuzzer demands of damaged packs: the oracles, the time limit.

Five targets, each a folder of pristine files (``fuzz_corpus``) copied
afresh for every case:

* ``index``: one pack (``p.bin`` + ``p.json``), opened with ``read_index`` and
  ``PackedImageDataset``, every record read;
* ``index-fit``, ``index-yuv`` and ``index-jpeg``: version 3 packs whose records differ
  in size (raw, yuv420 and jpeg), opened with ``read_index`` and every record read at
  the offset the format module computes (yuv420 converted back, jpeg decoded), each at
  its own size; a jpeg pack is also verified, and ``verify`` must name every record that
  does not decode or whose CRC does not match;
* ``manifest``: two shards merged by ``merge_packs``, opened with ``read_manifest`` and
  as one dataset, every record read;
* ``journal``: an interrupted pack (``p.bin.partial`` + its journal), resumed with
  ``pack_folder(resume=True)``, which reads the journal as any rerun does.

A case either succeeds (an outcome such as ``"opened"``), is refused with an
``ImgpackError`` (``"refused:ClassName"``), or fails: any other exception, a
``Violation`` of what an opened pack promises (every record inside the pixels
section, bytes as in the file, labels in range), or ``Hang`` past the time limit.
"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from fuzz_corpus import SIZE, Corpus, Target, make_corpus
from fuzz_mutate import Mutation, apply

from imgpack.errors import ImgpackError
from imgpack.format.codec import yuv420_to_rgb
from imgpack.format.index import PackIndex, read_index
from imgpack.format.layout import HEADER_BYTES, record_nbytes
from imgpack.format.write import record_checksum
from imgpack.packer.jpeg import decode_jpeg
from imgpack.packer.pack import pack_folder
from imgpack.packer.verify import verify_pack
from imgpack.reader.dataset import PackedImageDataset  # torch: imported once, not per case
from imgpack.shards import read_manifest

__all__ = [
    "TARGETS",
    "Violation",
    "Hang",
    "Target",
    "Corpus",
    "make_corpus",
    "prepare_case",
    "run_case",
    "read_every_record",
]

TARGETS = ("index", "manifest", "journal", "index-fit", "index-yuv", "index-jpeg")


class Violation(AssertionError):
    """An opened pack broke a promise: a record outside its section, other bytes, a bad label."""


class Hang(Exception):
    """A case ran past its time limit."""


@contextmanager
def time_limit(seconds: float):
    """Raise ``Hang`` in this (main) thread if the block runs longer than ``seconds``."""

    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# --- oracles -----------------------------------------------------------------------------


def read_every_record(ds, indexes: list[PackIndex]) -> None:
    """Each record lies in its pack's pixels section, reads as those bytes, has a valid label."""
    g = 0
    for ix in indexes:
        raw = ix.data_path.read_bytes()
        px, lab = ix.sections["pixels"], ix.sections["labels"]
        if not (HEADER_BYTES <= px.offset <= px.end <= len(raw)):
            raise Violation(f"{ix.data_path.name}: pixels {px.offset}..{px.end}, file {len(raw)}")
        n = len(ix.classes)
        for i in range(ix.count):
            start = ix.data_offset + i * ix.record_bytes
            end = start + ix.record_bytes
            if not (px.offset <= start and end <= px.end and lab.offset + 4 * i + 4 <= lab.end):
                raise Violation(f"{ix.data_path.name}: record {i} at {start}..{end} outside")
            image, label = ds[g]
            if image.permute(1, 2, 0).contiguous().numpy().tobytes() != raw[start:end]:
                raise Violation(f"{ix.data_path.name}: record {i} is not the bytes at {start}")
            on_disk = int.from_bytes(
                raw[lab.offset + 4 * i : lab.offset + 4 * i + 4], "little", signed=True
            )
            if label != on_disk or not (0 <= label < n if n else label == -1):
                raise Violation(f"{ix.data_path.name}: record {i} label {label} ({n} classes)")
            g += 1
    if g != len(ds):
        raise Violation(f"dataset has {len(ds)} records, its packs {g}")
    images, labels = ds.gather(list(range(len(ds))))[:2]
    for k in range(len(ds)):
        image, label = ds[k]
        if not (images[k].equal(image) and int(labels[k]) == label):
            raise Violation(f"batch row {k} differs from sample {k}")
    for k in range(len(ds)):
        try:
            ds.source_path(k)
        except ImgpackError:
            pass  # a damaged path section is refused when a path is asked for
    ds.close()


def _read_every_stored_record(ix: PackIndex) -> set[int]:
    """Each record of its own size lies in the pixels section, back to back from its
    start to its end, decodes (yuv420, jpeg) to its size, and has a valid label.

    Returns the records that do not decode (jpeg streams damaged in place)."""
    raw = ix.data_path.read_bytes()
    px, lab = ix.sections["pixels"], ix.sections["labels"]
    name = ix.data_path.name
    if not (HEADER_BYTES <= px.offset <= px.end <= len(raw)):
        raise Violation(f"{name}: pixels {px.offset}..{px.end}, file {len(raw)}")
    sizes, offsets = ix.record_sizes, ix.record_offsets
    if len(sizes) != ix.count or len(offsets) != ix.count + 1:
        raise Violation(f"{name}: {len(sizes)} sizes, {len(offsets)} offsets, {ix.count} records")
    if ix.count and (int(offsets[0]) != 0 or int(offsets[-1]) != px.nbytes):
        raise Violation(f"{name}: records span {offsets[0]}..{offsets[-1]} of {px.nbytes}")
    labels = ix.read_section("labels")
    n = len(ix.classes)
    ix.geometry()
    lengths, undecodable = ix.record_lengths, set()
    if len(lengths) != ix.count:
        raise Violation(f"{name}: {len(lengths)} lengths, {ix.count} records")
    for i in range(ix.count):
        w, h = (int(v) for v in sizes[i])
        start, end = ix.data_offset + int(offsets[i]), ix.data_offset + int(offsets[i + 1])
        if not (1 <= w <= ix.width and 1 <= h <= ix.height):
            raise Violation(f"{name}: record {i} is {w}x{h}, the bound {ix.width}x{ix.height}")
        nbytes = int(lengths[i])
        if ix.codec != "jpeg" and nbytes != record_nbytes(ix.codec, w, h, ix.channels):
            raise Violation(f"{name}: record {i} is {nbytes} bytes, not a {w}x{h} record's")
        if end - start != nbytes or end > px.end:
            raise Violation(f"{name}: record {i} at {start}..{end} outside or of another size")
        stored = np.frombuffer(raw[start:end], np.uint8)
        if ix.codec == "jpeg":
            try:
                image = decode_jpeg(stored, w, h, ix.channels)
            except ValueError:
                undecodable.add(i)
                image = np.zeros((h, w, ix.channels))  # verify must name it
        elif ix.codec == "yuv420":
            image = yuv420_to_rgb(stored, w, h)
        else:
            image = stored.reshape(h, w, ix.channels)
        if image.shape != (h, w, ix.channels):
            raise Violation(f"{name}: record {i} reads as {image.shape}, not {(h, w)}")
        label = int(labels[i])
        if lab.offset + 4 * i + 4 > lab.end or not (0 <= label < n if n else label == -1):
            raise Violation(f"{name}: record {i} label {label} ({n} classes)")
    return undecodable


def _verify_names_the_damage(ix: PackIndex, undecodable: set[int]) -> None:
    """``verify`` reports every record that does not decode, and passes only an intact pack."""
    report = verify_pack(ix.data_path, progress=False)
    named = {b["record"] for b in report.bad_records}
    if report.bad_count <= len(report.bad_records) and not undecodable <= named:
        missed = sorted(undecodable - named)
        raise Violation(f"{ix.data_path.name}: verify passed undecodable records {missed}")
    if not report.ok:
        return
    crcs = ix.read_section("checksums")
    raw = ix.data_path.read_bytes()
    for i in range(ix.count):
        a, b = (ix.data_offset + int(x) for x in ix.record_offsets[i : i + 2])
        if record_checksum(raw[a:b]) != int(crcs[i]):
            raise Violation(f"{ix.data_path.name}: verify passed record {i}, whose CRC differs")


def _refused(e: ImgpackError, *, file_problem: bool) -> str:
    if file_problem and not isinstance(e, ValueError):
        raise Violation(f"a damaged file raised {type(e).__name__}, not a ValueError: {e}")
    return f"refused:{type(e).__name__}"


def check_index(corpus: Corpus, case: Path) -> str:
    try:
        ix = read_index(case / "p.bin")
        read_every_record(PackedImageDataset(case / "p.bin"), [ix])
    except ImgpackError as e:
        return _refused(e, file_problem=True)
    return "opened"


def check_index_v3(corpus: Corpus, case: Path) -> str:
    """A pack of records of their own sizes: refused, or every record where it must be.

    The format module's promises only: reading such a pack through the dataset is the
    reader's to add here once it reads version 3.
    """
    try:
        ix = read_index(case / "p.bin")
        undecodable = _read_every_stored_record(ix)
        if ix.codec == "jpeg":
            _verify_names_the_damage(ix, undecodable)
    except ImgpackError as e:
        return _refused(e, file_problem=True)
    return "opened"


def check_manifest(corpus: Corpus, case: Path) -> str:
    try:
        read_manifest(case / "m.manifest.json")
        ds = PackedImageDataset(case / "m.manifest.json")
        read_every_record(ds, ds.indexes)
    except ImgpackError as e:
        return _refused(e, file_problem=True)
    return "opened"


def check_journal(corpus: Corpus, case: Path) -> str:
    """Resume from the journal: refused, or the pack a fresh run makes."""
    out = case / "p.bin"
    try:
        pack_folder(corpus.src, out, size=SIZE, workers=1, progress=False, resume=True)
    except ImgpackError as e:
        return _refused(e, file_problem=False)
    fresh = corpus.fresh
    if out.read_bytes() == fresh.read_bytes() and (
        out.with_suffix(".json").read_bytes() == fresh.with_suffix(".json").read_bytes()
    ):
        return "resumed:identical"
    # the .bin differs only by records the journal says were skipped; stats follow its sums
    ix, want = read_index(out), read_index(fresh)
    ds = PackedImageDataset(out)
    read_every_record(ds, [ix])
    raw, want_raw = out.read_bytes(), fresh.read_bytes()
    crcs = ix.section_array("checksums", raw)
    want_offsets = want.section_array("path_offsets", want_raw)
    want_paths = want.section_array("paths", want_raw)
    wanted = {want.source_path(i, want_offsets, want_paths): i for i in range(want.count)}
    offsets, paths = ix.section_array("path_offsets", raw), ix.section_array("paths", raw)
    for i in range(ix.count):
        rb, at = ix.record_bytes, ix.data_offset + i * ix.record_bytes
        rec = raw[at : at + rb]
        w = wanted.get(ix.source_path(i, offsets, paths))
        if (
            w is None
            or rec != want_raw[want.data_offset + w * rb : want.data_offset + (w + 1) * rb]
        ):
            raise Violation(f"resumed record {i} does not hold its source file's pixels")
        if record_checksum(rec) != int(crcs[i]):
            raise Violation(f"resumed record {i} fails its checksum")
    return "resumed:journal-trusted"


CHECKS: dict[str, Callable[[Corpus, Path], str]] = {
    "index": check_index,
    "manifest": check_manifest,
    "journal": check_journal,
    "index-fit": check_index_v3,
    "index-yuv": check_index_v3,
    "index-jpeg": check_index_v3,
}


def prepare_case(corpus: Corpus, target: str, mutations: list[Mutation], case: Path) -> Path:
    """A fresh copy of ``target``'s pristine files at ``case``, damaged by ``mutations``."""
    t = corpus.targets[target]
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(t.folder, case)
    for m in mutations:
        name, form = t.files[m.role]
        apply(m, case / name, form, t.zones.get(m.role, {}))
    return case


def run_case(
    corpus: Corpus, target: str, mutations: list[Mutation], case: Path, seconds: float = 10.0
) -> str:
    """``prepare_case``, then check under a time limit: the outcome.

    Raises whatever the code under test raised that is not an ``ImgpackError``, a
    ``Violation``, or ``Hang`` after ``seconds``.
    """
    prepare_case(corpus, target, mutations, case)
    with time_limit(seconds):
        return CHECKS[target](corpus, case)
