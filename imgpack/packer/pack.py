"""The packing pipeline: list SRC, decode in worker processes, write records in order.

Workers decode and digest (CRC + channel sums); the main process only appends
bytes, in source order, so the output is byte-identical whatever the worker
count. At most a fixed window of chunks is in flight, so memory does not grow
with the folder. Every outcome is journalled beside the partial file, so an
interrupted run (Ctrl-C, SIGTERM, SIGKILL, full disk) continues with ``resume``.

The output may live inside SRC: a pack's own files never count as images.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgpack import __version__
from imgpack import format as fmt
from imgpack.errors import (
    ImageReadError,
    InsufficientSpaceError,
    OutputExistsError,
    OutputPathError,
)
from imgpack.machine import usable_cores
from imgpack.packer import decode, discover
from imgpack.packer.inspect import human_bytes
from imgpack.packer.journal import Journal, begin, fingerprint, journal_path, printable_path
from imgpack.packer.parallel import ParallelDecoder, decode_one
from imgpack.packer.targets import targets_digest, targets_for
from imgpack.packer.writer import PackWriter, check_free_space, partial_path
from imgpack.shards import SHARD_BY

__all__ = ["PackSummary", "pack_folder", "default_workers", "shard_range", "shard_slice"]

JOURNAL_EVERY = 32  # outcomes per journal write: at most this much work is redone after SIGKILL


@dataclass
class PackSummary:
    """What one ``pack_folder`` run did; ``index`` is the JSON index as written."""

    out_bin: Path
    out_json: Path
    count: int
    skipped: list[dict[str, str]]
    bytes: int
    seconds: float
    images_per_s: float
    processed: int
    resumed: int
    index: dict[str, Any]

    def lines(self, *, show_skipped: int = 5) -> list[str]:
        """A closing summary for people: totals, then the first few skipped files."""
        out = [
            f"packed {self.count} images into {self.out_bin.name} "
            f"({human_bytes(self.bytes)}), skipped {len(self.skipped)}; "
            f"{self.processed} files in {self.seconds:.1f} s, {self.images_per_s:.1f} images/s"
            + (f" (resumed after {self.resumed})" if self.resumed else "")
        ]
        if self.skipped:
            shown = ", ".join(f"{s['path']} ({s['reason']})" for s in self.skipped[:show_skipped])
            more = (
                f" and {len(self.skipped) - show_skipped} more"
                if len(self.skipped) > show_skipped
                else ""
            )
            out.append(f"skipped: {shown}{more}; see {self.out_json.name} 'skipped'")
        return out


def default_workers() -> int:
    """Decoding processes when --workers is not given: every core this process may use."""
    return usable_cores()


def shard_range(total: int, num_shards: int, shard_index: int) -> tuple[int, int]:
    """The contiguous slice [start, stop) of the sorted file list that one shard packs."""
    return shard_index * total // num_shards, (shard_index + 1) * total // num_shards


def shard_slice(total: int, num_shards: int, shard_index: int, by: str = "contiguous") -> slice:
    """The files of the sorted list that one shard packs: its contiguous range, or, for
    ``interleaved``, every ``num_shards``-th file from ``shard_index`` (every class in each)."""
    if by == "interleaved":
        return slice(shard_index, total, num_shards)
    return slice(*shard_range(total, num_shards, shard_index))


def pack_folder(
    src: str | os.PathLike,
    out_bin: str | os.PathLike,
    *,
    size: tuple[int, int] = (224, 224),
    resize: str = "center-crop",
    filter: str = "bilinear",
    workers: int | None = None,
    labels: str = "folders",
    on_error: str = "skip",
    force: bool = False,
    resume: bool = False,
    progress: bool | None = None,
    num_shards: int = 1,
    shard_index: int = 0,
    shard_by: str = "contiguous",
    start_method: str | None = None,
    channels: int = 3,
    crop_ratio: float = 1.0,
    targets: Mapping[str, Sequence[float]] | None = None,
) -> PackSummary:
    """Pack the images under ``src`` into ``out_bin`` and its index; ``size`` is (width, height).

    ``resume`` continues an interrupted run with the same settings (or starts
    fresh when there is nothing to continue). ``progress`` None shows a bar only
    when stderr is a terminal. ``shard_by`` says how ``num_shards`` cut the sorted
    listing (``shard_slice``); one shard is the whole listing either way. ``start_method``
    picks the multiprocessing context (default: fork where available, else spawn).
    ``channels`` 1 stores Pillow's ``convert("L")`` of each RGB record; ``crop_ratio`` R
    (center-crop) keeps the centre ``size`` of the image scaled to cover ``size / R``.
    ``targets`` maps a file's path relative to ``src`` (as discovered, "/"-separated) to
    its target vector, K numbers for every file packed (``ds.target_vectors``).
    """
    t0 = time.perf_counter()
    settings = decode.DecodeSettings(
        int(size[0]),
        int(size[1]),
        resize=resize,
        filter=filter,
        channels=channels,
        crop_ratio=crop_ratio,
    )
    if on_error not in ("skip", "fail"):
        raise ValueError(f"on_error must be 'skip' or 'fail', got {on_error!r}")
    if not (isinstance(num_shards, int) and num_shards >= 1 and 0 <= shard_index < num_shards):
        raise ValueError(f"shard_index must be 0..num_shards-1, got {shard_index} of {num_shards}")
    if shard_by not in SHARD_BY:
        raise ValueError(f"shard_by must be one of {', '.join(SHARD_BY)}, got {shard_by!r}")
    if num_shards == 1:
        shard_by = "contiguous"  # the same files, the same pack, the same resume journal
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")

    out_bin = Path(out_bin)
    out_json, _ = fmt.pack_paths(out_bin)
    _check_output(out_bin, force=force, resume=resume)
    listing = discover.discover(src, labels=labels)
    total = len(listing.files)
    cut = shard_slice(total, num_shards, shard_index, shard_by)
    files = listing.files[cut]
    file_targets = targets_for(files, targets)
    target_dim = len(file_targets[0]) if file_targets else 0

    packer = {
        "imgpack_version": __version__,
        **settings.to_json(),
        "labels": labels,
        "source": listing.root.name,
    }
    shard: dict[str, Any] = {"index": shard_index, "count": num_shards, "source_files": total}
    if shard_by == "contiguous":  # as before --shard-by existed: a missing "by" means this
        shard["source_range"] = [cut.start, cut.stop]
    else:
        shard.update(by=shard_by, source_stride=[shard_index, num_shards])
    extra = {"shard": shard}
    fp = fingerprint(
        settings=settings.to_json(),
        labels=labels,
        on_error=on_error,
        shard=(shard_index, num_shards),
        shard_by=shard_by,
        classes=listing.classes,
        files=files,
        version=__version__,
        targets=targets_digest(file_targets),
    )
    partial = partial_path(out_bin)
    paths_bytes = sum(len(rel.encode("utf-8", "surrogateescape")) for rel, _ in files)
    record_bytes = settings.width * settings.height * settings.channels
    needed = (
        fmt.file_bytes(fmt.layout_sections(len(files), record_bytes, paths_bytes))
        + len(files) * (40 + 4 * target_dim)  # the record fields
        + 65536
        + 200 * len(listing.classes)
    )
    if resume and partial.exists():
        needed -= partial.stat().st_size
    check_free_space(out_bin.parent, needed, what=f"pack of {len(files)} images")

    writer = PackWriter(
        out_bin,
        height=settings.height,
        width=settings.width,
        classes=listing.classes,
        channels=settings.channels,
        target_dim=target_dim,
    )
    journal, done = begin(out_bin.name, writer, files, fp, resume=resume, targets=file_targets)

    try:
        processed = _run(
            files,
            listing.root,
            settings,
            writer,
            journal,
            on_error=on_error,
            workers=workers,
            progress=progress,
            total=len(files),
            done=done,
            start_method=start_method,
            targets=file_targets,
        )
        index = writer.finish(packer=packer, extra=extra)
    except ImageReadError:
        writer.abort()
        partial.unlink(missing_ok=True)
        journal.remove()
        raise
    except BaseException as exc:
        _keep_for_resume(writer, journal)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise InsufficientSpaceError(
                f"{out_bin.parent}: disk full after {writer.count} records; the partial pack "
                f"is kept at {partial.name}: free space and rerun with --resume"
            ) from exc
        raise
    journal.remove()
    seconds = time.perf_counter() - t0
    return PackSummary(
        out_bin=out_bin,
        out_json=out_json,
        count=index["count"],
        skipped=index["skipped"],
        bytes=index["data_file_bytes"],
        seconds=seconds,
        images_per_s=processed / seconds if seconds > 0 else 0.0,
        processed=processed,
        resumed=done,
        index=index,
    )


def _check_output(out_bin: Path, *, force: bool, resume: bool) -> None:
    """Refuse outputs that would lose data or could never be written."""
    if out_bin.suffix != ".bin" or out_bin.name == ".bin":
        raise OutputPathError(
            f"{out_bin}: the output must be named NAME.bin (NAME.json goes beside it)"
        )
    if not out_bin.parent.is_dir():
        raise OutputPathError(f"{out_bin.parent}: output folder does not exist")
    out_json, _ = fmt.pack_paths(out_bin)
    if not force:
        for p in (out_bin, out_json):
            if p.exists():
                raise OutputExistsError(f"{p}: already exists; use --force to overwrite it")
        if not resume and (partial_path(out_bin).exists() or journal_path(out_bin).exists()):
            raise OutputExistsError(
                f"{partial_path(out_bin)}: an interrupted pack is here; "
                f"use --resume to continue it or --force to start over"
            )


def _run(
    files,
    root,
    settings,
    writer,
    journal,
    *,
    on_error,
    workers,
    progress,
    total,
    done,
    start_method,
    targets=None,
) -> int:
    """Decode ``files[done:]``, write every outcome in order; return how many files were handled."""
    workers = min(workers, len(files) - done) or 1
    with ExitStack() as stack:
        if workers == 1:
            stack.enter_context(decode.pillow_quiet())  # once, not per file
            results = (
                (i, *files[i], *decode_one(root, files[i][0], settings))
                for i in range(done, len(files))
            )
        else:
            decoder = stack.enter_context(
                ParallelDecoder(
                    files,
                    done,
                    root,
                    settings,
                    workers=workers,
                    record_bytes=writer.record_bytes,
                    start_method=start_method,
                )
            )
            results = iter(decoder)
        results = stack.enter_context(closing(results))
        stack.enter_context(_term_as_interrupt())
        bar = _progress_bar(progress, total, done)  # after the fork: no thread is copied
        if bar is not None:
            stack.callback(bar.close)
        n = 0
        for i, rel, label, payload, info in results:
            if payload is None:
                if on_error == "fail":
                    raise ImageReadError(f"{rel}: {info} (--on-error fail: nothing written)")
                writer.skip(printable_path(rel), info)
                journal.add_skip(i, rel, info)
            else:
                digest, geometry = info
                target = None if targets is None else targets[i]
                writer.append(payload, label, rel, digest, geometry=geometry, target=target)
                journal.add_record(i, rel, digest, geometry)
            n += 1
            if journal.pending >= JOURNAL_EVERY:
                writer.flush()
                journal.flush()
            if bar is not None:
                bar.update(1)
        writer.flush()
        journal.flush()
    return n


def _keep_for_resume(writer: PackWriter, journal: Journal) -> None:
    """Leave the partial file and the journal consistent for ``resume``, then let go."""
    try:
        writer.flush()
        journal.flush()
    except (OSError, ValueError):
        pass  # a torn record or line is found and dropped on resume
    writer.abort()
    journal.close()


def _progress_bar(progress: bool | None, total: int, done: int):
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return None
    from tqdm import tqdm  # only when drawn: keeps `import imgpack.packer.pack` light

    return tqdm(
        total=total, initial=done, unit="img", file=sys.stderr, smoothing=0.05, dynamic_ncols=True
    )


class _term_as_interrupt:
    """While packing, SIGTERM (schedulers, ``kill``) stops the run like Ctrl-C does."""

    def __enter__(self):
        self.old = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGTERM, _interrupt)
        return self

    def __exit__(self, *exc) -> None:
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)


def _interrupt(signum, frame):
    exc = KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")
    exc.signum = signum
    raise exc
