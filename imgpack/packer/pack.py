"""The packing pipeline: list SRC, decode in worker processes, write records in order.

Workers decode and digest (CRC + channel sums); the main process only appends
bytes, in source order, so the output is byte-identical whatever the worker
count. At most a fixed window of chunks is in flight, so memory does not grow
with the folder. Every outcome is journalled beside the partial file, so an
interrupted run (Ctrl-C, SIGTERM, SIGKILL, full disk) continues when the same
command runs again; what decides "the same" is the run's recipe (``prepare``).

The output may live inside SRC: a pack's own files never count as images.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from imgpack.errors import OutputExistsError, PackError, SourceError
from imgpack.format.index import read_index
from imgpack.format.layout import pack_paths
from imgpack.machine import usable_cores
from imgpack.packer.discover import printable_path
from imgpack.packer.guards import check_free_space
from imgpack.packer.journal import Journal, journal_path
from imgpack.packer.loop import run_files
from imgpack.packer.prepare import check_output, prepare_pack
from imgpack.packer.recipe import recipe_diff
from imgpack.packer.resume import begin
from imgpack.packer.settings import DecodeSettings
from imgpack.packer.summary import PackSummary
from imgpack.packer.writer import PackWriter, partial_path
from imgpack.shards import SHARD_BY

__all__ = ["pack_folder", "pack_workers"]


def pack_workers() -> int:
    """Decoding processes when --workers is not given: every core this process may use.

    Not the reader's ``default_workers`` (DataLoader processes, at most two): packing
    decodes, which scales with cores; a loader's workers only copy decoded batches.
    """
    return usable_cores()


def pack_folder(
    src: str | os.PathLike,
    out_bin: str | os.PathLike,
    *,
    size: tuple[int, int] = (224, 224),
    resize: str = "center-crop",
    filter: str = "bilinear",
    workers: int | None = None,
    labels: str | os.PathLike = "folders",
    classes_from: str | os.PathLike | None = None,
    on_error: str | None = None,
    force: bool = False,
    resume: bool | None = None,
    progress: bool | None = None,
    num_shards: int = 1,
    shard_index: int = 0,
    shard_by: str = "contiguous",
    start_method: str | None = None,
    notify: Callable[[str], None] | None = None,
    channels: int = 3,
    crop_ratio: float = 1.0,
    targets: Mapping[str, Sequence[float]] | None = None,
    codec: str = "raw",
    quality: int | None = None,
) -> PackSummary:
    """Pack the images under ``src`` into ``out_bin`` and its index; ``size`` is (width, height).

    ``labels``: "folders", "none", or a .csv/.jsonl labels file (``labelfile``);
    ``classes_from``: a pack, manifest or text file whose class list (and order) to use.
    ``on_error`` None skips bad images but refuses a class folder missing from
    ``classes_from``; "skip" skips both; "fail" stops at either, writing nothing.
    ``resume`` None (a plain rerun) continues an interrupted run of the same command,
    or starts over when anything differs (the reason goes to ``notify``); a pack
    already complete from the same command is left as it is. True: continue or fail.
    False: refuse an interrupted run. ``progress`` None shows a bar only when stderr
    is a terminal. ``shard_by`` says how ``num_shards`` cut the listing
    (``prepare.shard_slice``). ``start_method`` picks the multiprocessing context
    (default: fork where available, else spawn). ``notify`` gets one-line notes.
    ``channels`` 1 stores Pillow's ``convert("L")`` of each RGB record; ``crop_ratio`` R
    (center-crop) keeps the centre ``size`` of the image scaled to cover ``size / R``.
    ``resize`` "fit" (``size`` (S, S)) keeps each image's aspect, its longer side S (never
    up), at its own size; ``codec`` "yuv420" stores Y, Cb, Cr, "jpeg" a JPEG stream at
    ``quality`` (default 90; encoded in the workers, or a source's own bytes where it
    needs no change).
    ``targets`` maps a file's path relative to ``src`` (as discovered, "/"-separated) to
    its target vector, K numbers for every file packed (``ds.target_vectors``); a labels
    file's ``targets`` column gives the same without it.
    """
    t0 = time.perf_counter()
    settings = DecodeSettings(
        int(size[0]),
        int(size[1]),
        resize=resize,
        filter=filter,
        channels=channels,
        crop_ratio=crop_ratio,
        codec=codec,
        quality=quality,
    )
    if on_error not in (None, "skip", "fail"):
        raise ValueError(f"on_error must be 'skip' or 'fail', got {on_error!r}")
    if not (isinstance(num_shards, int) and num_shards >= 1 and 0 <= shard_index < num_shards):
        raise ValueError(f"shard_index must be 0..num_shards-1, got {shard_index} of {num_shards}")
    if shard_by not in SHARD_BY:
        raise ValueError(f"shard_by must be one of {', '.join(SHARD_BY)}, got {shard_by!r}")
    if num_shards == 1:
        shard_by = "contiguous"  # the same files, the same pack, the same resume journal
    workers = pack_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    notify = notify or (lambda line: None)

    out_bin = Path(out_bin)
    out_json, _ = pack_paths(out_bin)
    done_before = check_output(out_bin, force=force, resume=resume)
    plan = prepare_pack(
        src,
        out_bin,
        settings,
        labels=labels,
        classes_from=classes_from,
        on_error=on_error,
        num_shards=num_shards,
        shard_index=shard_index,
        shard_by=shard_by,
        targets=targets,
    )
    listing, files = plan.listing, plan.files
    if done_before is not None:
        return _already_complete(out_bin, done_before, plan, t0)
    partial = partial_path(out_bin)
    needed = plan.needed
    if partial.exists():  # rewritten in place, whether continued or started over
        needed -= partial.stat().st_size
    check_free_space(out_bin.parent, needed, what=f"pack of {len(files)} images")

    file_targets = plan.targets  # K floats per file, or None
    writer = PackWriter(
        out_bin,
        height=settings.height,
        width=settings.width,
        classes=listing.classes,
        channels=settings.channels,
        target_dim=plan.target_dim,
        codec=settings.codec,
        quality=settings.quality,
    )
    for rel, reason in listing.missing:  # listed in a labels file, not there
        writer.skip(printable_path(rel), reason)
    journal, done = begin(
        out_bin.name,
        writer,
        files,
        plan.recipe,
        resume=False if force and not resume else resume,
        targets=file_targets,
    )
    if journal.restarted:
        notify(
            f"starting over, the interrupted pack of {out_bin.name} differs: {journal.restarted}"
        )
    elif done:
        notify(
            f"resuming: {done:,} of {len(files):,} images already packed "
            f"(an interrupted run of the same command)"
        )

    try:
        processed, refused = run_files(
            files,
            listing.root,
            settings,
            writer,
            journal,
            on_error=on_error or "skip",
            workers=workers,
            progress=progress,
            total=len(files),
            done=done,
            start_method=start_method,
            targets=file_targets,
        )
        refused = refused or _nothing_packed(listing.root, writer)
        if refused is None:
            index = writer.finish(packer=plan.packer, extra=plan.extra)
    except BaseException as exc:
        _keep_for_resume(writer, journal)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            kept = partial if partial.exists() else out_bin  # renamed, its index unwritten
            raise PackError(
                f"{out_bin.parent}: disk full after {writer.count} records; the partial pack "
                f"is kept at {kept.name}: free space and rerun the same command to continue"
            ) from exc
        raise
    if refused is not None:  # the same command would fail the same way: keep nothing
        writer.abort()
        partial.unlink(missing_ok=True)
        journal.remove()
        raise SourceError(refused)
    journal.remove()
    seconds = time.perf_counter() - t0
    return PackSummary.of(
        out_bin, index, seconds, processed, done, plan.listing.empty_classes, journal.restarted
    )


def _nothing_packed(root: Path, writer: PackWriter) -> str | None:
    """Every file was skipped: say so (the caller discards the run) rather than publish an
    empty pack with exit 0. A shard with no files at all stays a valid, empty pack."""
    if writer.count or not writer.skipped:
        return None
    first = writer.skipped[0]
    return (
        f"{root}: no image could be packed: {len(writer.skipped):,} skipped, "
        f"e.g. {first['path']} ({first['reason']})"
    )


def _already_complete(out_bin: Path, index: dict[str, Any], plan, t0: float) -> PackSummary:
    """A rerun of the command that made this pack: nothing to do, if it is intact."""
    if index.get("command_fingerprint") != plan.recipe_digest:
        raise OutputExistsError(
            f"{out_bin}: already exists; use --force to overwrite it "
            f"(it was packed from another source or with other settings)"
        )
    read_index(out_bin)  # the .bin must match its index, or this is no finished pack
    _drop_redundant_run(out_bin, plan)
    seconds = time.perf_counter() - t0
    empty = plan.listing.empty_classes
    return PackSummary.of(out_bin, index, seconds, 0, 0, empty, None, complete=True)


def _drop_redundant_run(out_bin: Path, plan) -> None:
    """Beside a finished pack, an interrupted run of the same command (``--force`` then
    killed, or killed before it removed its journal) holds nothing new: delete its partial
    file and journal, under the journal's lock. Another command's run is left to resume."""
    if not journal_path(out_bin).exists():
        return
    journal = Journal(out_bin)  # refuses while a run is writing this output
    readable, then = journal.header()
    if not readable:
        journal.remove()  # no run this imgpack could continue
        return
    if then is not None and recipe_diff(then, plan.recipe) is not None:
        journal.close()
        return
    partial_path(out_bin).unlink(missing_ok=True)
    journal.remove()


def _keep_for_resume(writer: PackWriter, journal: Journal) -> None:
    """Leave the partial file and the journal consistent for ``resume``, then let go."""
    try:
        writer.flush()
        journal.flush()
    except (OSError, ValueError):
        pass  # a torn record or line is found and dropped on resume
    writer.abort()
    journal.close()
