"""The packing pipeline: list the source, decode in worker processes, write records in order.

A run is one chain: the source (``sources``: a folder, a labels file over one, WebDataset
tar shards, Parquet files) lists its samples; ``PackPlan`` cuts this shard's share and pins
the run's recipe; the ``journal`` (the run's lock, taken first, under which this module
checks the output) continues an interrupted run of the same recipe; ``parallel`` decodes
every sample, whatever kind it came from, and the ``writer`` appends the records in order;
this module publishes the pack, or keeps the partial file.

Workers decode and digest (CRC + channel sums); the main process only appends
bytes, in source order, so the output is byte-identical whatever the worker
count. At most a fixed window of chunks is in flight, so memory does not grow
with the folder. Every outcome is journalled beside the partial file, in batches
(``journal.JOURNAL_EVERY``), so an interrupted run (Ctrl-C, SIGTERM, SIGKILL, full disk)
continues when the same command runs again; what decides "the same" is the run's
recipe (``journal``). SIGTERM stops a run the way Ctrl-C does, keeping the partial file.

The output may live inside SRC: a pack's own files never count as images.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, suppress
from pathlib import Path
from typing import Any

import numpy as np

from imgpack import __version__
from imgpack.errors import OutputExistsError, PackError, SourceError
from imgpack.format.index import read_index
from imgpack.format.layout import file_bytes, layout_sections, pack_paths, record_nbytes
from imgpack.machine import usable_cores
from imgpack.packer.decode import DecodeSettings, check_choice, parse_size
from imgpack.packer.journal import Journal, recipe_digest, sources_diff
from imgpack.packer.parallel import ParallelDecoder
from imgpack.packer.sources.select import open_source
from imgpack.packer.sources.source import Payload, Source, printable_path, stamps
from imgpack.packer.verify import PackSummary, human_bytes, progress_bar
from imgpack.packer.writer import PackWriter, check_target, handling, partial_path
from imgpack.shards import SHARD_BY, shard_slice
from imgpack.validate import json_or_none

__all__ = ["PackPlan", "check_free_space", "pack_folder"]

# what the index's packer field names, but the recipe compares under its own keys (the
# files' names and labels, the class list, the source's identity)
_NAMED_APART = ("source", "labels_file", "classes_from")


def pack_folder(
    src: str | os.PathLike | Sequence[str | os.PathLike],
    out_bin: str | os.PathLike,
    *,
    size: int | str | tuple[int, int] = (224, 224),
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
    image_column: str | None = None,
    label_column: str | None = None,
    label_key: str | None = None,
    published: tuple[str, Mapping[str, Any]] | None = None,
) -> PackSummary:
    """Pack the images of ``src`` into ``out_bin`` and its index; ``size`` is (width, height), or
    ``S``/``"WxH"`` as ``--size`` takes it.

    ``src``: a folder, or WebDataset tar shards or Parquet files: one path or several,
    shell globs and brace ranges (``sources.select``). ``labels``: "folders" (for shards
    and Parquet: each sample's own label), "none", or a .csv/.jsonl labels file over a
    folder (``sources.folder``); ``classes_from``: a pack, manifest or text file whose class
    list (and order) to use. Parquet: ``image_column`` and ``label_column`` (None: found;
    "none": no labels); tar shards: ``label_key``, the integer of that key in each
    sample's ``.json`` instead of its ``.cls``. ``published``: (URL, index) of a pack
    already where ``out_bin`` will be uploaded (``imgpack.remote.mirror``): a rerun of the
    command that made it finds it complete, and another command is refused without
    ``force``, as for a local output.
    ``on_error`` None skips bad images but refuses a class missing from ``classes_from``;
    "skip" skips both; "fail" stops at either, writing nothing.
    ``resume`` None (a plain rerun) continues an interrupted run of the same command,
    or starts over when anything differs (the reason goes to ``notify``); a pack
    already complete from the same command is left as it is. True: continue or fail.
    False: refuse an interrupted run. ``progress`` None shows a bar only when stderr
    is a terminal. ``shard_by`` says how ``num_shards`` cut the listing
    (``imgpack.shards.shard_slice``). ``start_method`` picks the multiprocessing context
    (default: fork where available, else spawn). ``notify`` gets one-line notes.
    ``channels`` 1 stores Pillow's ``convert("L")`` of each RGB record; ``crop_ratio`` R
    (center-crop) keeps the centre ``size`` of the image scaled to cover ``size / R``.
    ``resize`` "fit" (``size`` (S, S)) keeps each image's aspect, its longer side S (never
    up), at its own size; ``codec`` "yuv420" stores Y, Cb, Cr, "jpeg" a JPEG stream at
    ``quality`` (default 90; encoded in the workers, or a source's own bytes where it
    needs no change).
    ``targets`` maps a sample's name (a path relative to ``src`` as discovered,
    "/"-separated, or ``shard.tar:key``, ``file.parquet:row``) to its target vector, K
    numbers for every sample packed (``ds.target_vectors``); a labels file's ``targets``
    column gives the same without it.
    """
    t0 = time.perf_counter()
    pixels = dict(resize=resize, filter=filter, channels=channels, crop_ratio=crop_ratio)
    if isinstance(size, (int, np.integer, str)) and not isinstance(size, bool):
        size = parse_size(str(size))  # 224 or "320x240", as on the command line
    settings = DecodeSettings(*map(int, size), codec=codec, quality=quality, **pixels)
    if on_error not in (None, "skip", "fail"):
        raise ValueError(f"on_error must be 'skip' or 'fail', got {on_error!r}")
    if not (isinstance(num_shards, int) and num_shards >= 1 and 0 <= shard_index < num_shards):
        raise ValueError(f"shard_index must be 0..num_shards-1, got {shard_index} of {num_shards}")
    check_choice("shard_by", shard_by, SHARD_BY)
    if num_shards == 1:
        shard_by = "contiguous"  # the same files, the same pack, the same resume journal
    # decoding processes: every core this process may use (not the reader's DataLoader
    # workers, at most two: packing decodes, which scales with cores)
    workers = usable_cores() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    notify = notify or (lambda line: None)
    out_bin = Path(out_bin)
    check_output_name(out_bin)
    journal = Journal(out_bin)  # the lock, first: one run per output, whatever it finds
    try:
        done_before = check_output(out_bin, journal, force=force, resume=resume)
        kinds = dict(image_column=image_column, label_column=label_column, label_key=label_key)
        source = open_source(
            src,
            labels=labels,
            classes_from=classes_from,
            on_error=on_error,
            ignore=(*pack_paths(out_bin), partial_path(out_bin), journal.path),  # its own
            workers=workers,
            **kinds,
        )
        shard = (shard_index, num_shards, shard_by)
        plan = PackPlan(source, settings, on_error or "skip", shard, targets)
        # a published pack (URL, index) stands where the local one would
        where, done_before = published if published and not force else (out_bin, done_before)
        if done_before is not None:
            return _already_complete(where, out_bin, done_before, plan, journal)
        resume = False if force and not resume else resume
        writer = plan.writer(out_bin)
        done = journal.begin(writer, plan, resume=resume, notify=notify)
    except BaseException:
        # stopped or refused before a record was written: an interrupted run's journal stays
        # as it was (restore changes nothing on disk until its checks are done)
        if journal.created:
            journal.remove()
        else:
            journal.close()
        raise
    try:
        _decode_and_write(journal, done, on_error, workers, progress, start_method)
        if num_shards == 1 and writer.skipped and not writer.count:
            # every file was skipped: discard the run rather than publish an empty pack with
            # exit 0 (a shard is judged with the others, when they are merged; a source
            # with no files at all stays a valid, empty pack)
            first = writer.skipped[0]
            raise SourceError(
                f"{plan.listing.root}: no image could be packed: {len(writer.skipped):,} "
                f"skipped, e.g. {first['path']} ({first['reason']})"
            )
        index = writer.finish(packer=plan.packer, extra=plan.extra)
    except SourceError:  # the same command would fail the same way: keep nothing
        writer.abort()
        writer.partial.unlink(missing_ok=True)
        journal.remove()
        raise
    except BaseException as exc:
        if writer.published:  # Ctrl-C as the pack was published: it is whole, nothing to resume
            journal.remove()
            raise
        # the partial file and the journal left consistent for a rerun (where a write fails,
        # the torn record or line is found and dropped on resume)
        with suppress(OSError, ValueError):
            journal.flush()
        writer.abort()
        journal.close()
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            kept = writer.partial if writer.partial.exists() else out_bin  # index unwritten
            raise PackError(
                f"{out_bin.parent}: disk full after {writer.count} records; the partial pack "
                f"is kept at {kept.name}: free space and rerun the same command to continue"
            ) from exc
        raise
    journal.remove()
    seconds, processed = time.perf_counter() - t0, len(plan.files) - done
    return PackSummary(out_bin, index, seconds, processed, done, plan.listing.empty_classes)


class PackPlan:
    """This shard's samples, listed and pinned before any decoding: ``files[i]`` (name,
    label) is the listing's ``positions[i]``, ``targets`` their vectors (K floats each, or
    None), ``stamps`` the (size, mtime) of the file holding each; what the index
    (``packer``, ``extra``) and the journal (``recipe``) record about them; the run's
    ``writer``, made once the disk has room for the finished pack; and the ``source`` whose
    ``feed`` gives their payloads.

    The listing comes from the run's source, numbered by the class list of
    ``--classes-from`` when given; ``shard`` (index, count, by) takes its cut of it. The
    recipe pins everything that decides the pack's bytes (the source's own identity
    included), so a rerun of the same command can tell "continue" (or "already done")
    from "start over", and say which setting changed. ``on_error`` is pinned only: a
    sample known to be bad from the listing (``listing.bad``) comes to the loop as a Skip,
    so that "fail" stops at the first bad sample in pack order, whether the listing or its
    decoding found it. ``targets``: name -> target vector (``pack_folder(targets=)``; names
    the pack does not hold, other shards' or splits', are ignored), or a labels file's column.
    """

    def __init__(self, source: Source, settings: DecodeSettings, on_error: str, shard, targets):
        index, count, by = shard
        self.source, self.settings = source, settings
        self.listing = listing = source.listing()
        total = len(listing.files)
        cut = shard_slice(total, count, index, by)
        self.positions = range(total)[cut]
        self.files = files = listing.files[cut]
        about = source.describe()
        self.targets = None
        if listing.targets is not None:
            if targets is not None:  # a labels file's column
                raise ValueError(f"{about['labels_file']} has a targets column: pass no targets=")
            self.targets = [tuple(row) for row in listing.targets[cut].tolist()]
        elif targets is not None:  # K floats each, K the first file's (``check_target``)
            self.targets = []
            for rel, _ in files:
                k = len(self.targets[0]) if self.targets else None
                self.targets.append(check_target(rel, targets.get(rel), k))
        self.target_dim = len(self.targets[0]) if self.targets else 0
        self.packer = {"imgpack_version": __version__, **settings.to_json(), **about}
        place: dict[str, Any] = {"index": index, "count": count, "source_files": total}
        if by == "contiguous":  # as before --shard-by existed: a missing "by" means this
            place["source_range"] = [cut.start, cut.stop]
        else:
            place.update(by=by, source_stride=[index, count])
        identity = source.identity()
        listed = hashlib.sha256()
        for rel, label in files:
            listed.update(f"{label}\t{rel}\n".encode("utf-8", "surrogateescape"))
        classes = "\n".join(listing.classes).encode("utf-8", "surrogateescape")
        # the target vectors as the pack stores them: float32
        floats = None if self.targets is None else np.asarray(self.targets, "<f4").tobytes()
        # everything that decides the pack's bytes, except the worker count (which never
        # does); compared key by key by ``journal.recipe_diff``
        self.recipe = {
            **{k: v for k, v in self.packer.items() if k not in _NAMED_APART},
            "on_error": on_error,
            "shard": [index, count],
            "shard_by": by,
            "classes": hashlib.sha256(classes).hexdigest(),
            "files": len(files),
            "files_sha256": listed.hexdigest(),
            "targets": None if self.targets is None else hashlib.sha256(floats).hexdigest(),
            "class_count": len(listing.classes),
            **identity,
        }
        self.stamps = stamps(source, self.positions)
        self.extra = {
            "source_stamps": hashlib.sha256(json.dumps(self.stamps).encode()).hexdigest(),
            "shard": place,
            "excluded": [{"path": printable_path(p), "reason": r} for p, r in listing.excluded],
            "excluded_hidden": listing.hidden,
            "command_fingerprint": recipe_digest(self.recipe),
            **identity,  # a finished pack's rerun names the source file that changed
        }

    def writer(self, out_bin: Path) -> PackWriter:
        """The writer of this run, once the disk has room for the finished pack (a partial
        file there is rewritten in place, whether continued or started over)."""
        s, files, partial = self.settings, self.files, partial_path(out_bin)
        paths_bytes = sum(len(rel.encode("utf-8", "surrogateescape")) for rel, _ in files)
        # at most: records of fit packs may be smaller than the bound; jpeg records have no
        # fixed size, and photographs at any quality up to 95 take well under raw's
        codec = "raw" if s.codec == "jpeg" else s.codec
        record = record_nbytes(codec, s.width, s.height, s.channels)
        needed = (
            file_bytes(layout_sections(len(files), len(files) * record, paths_bytes))
            + len(files) * (48 + 4 * self.target_dim)  # the record fields
            + 65536
            + 200 * len(self.listing.classes)
            - (partial.stat().st_size if partial.exists() else 0)
        )
        check_free_space(out_bin.parent, needed, what=f"pack of {len(files)} images")
        shape = dict(height=s.height, width=s.width, channels=s.channels)
        kind = dict(codec=s.codec, quality=s.quality, target_dim=self.target_dim)
        return PackWriter(out_bin, classes=self.listing.classes, **shape, **kind)

    def samples(self, start: int = 0) -> Iterator[tuple[int, str, int, Payload]]:
        """(i, name, label, payload) of ``files[start:]``, the payloads read as they are
        asked for. A source that runs out early has a bug: ``next`` raises (a
        RuntimeError, out of a generator), never a silently shorter pack."""
        payloads = iter(self.source.feed(self.positions[start:]))
        for i in range(start, len(self.files)):
            yield (i, *self.files[i], next(payloads))


def check_output_name(out_bin: Path) -> None:
    """Refuse an output that could never be written, before anything is made beside it."""
    if out_bin.suffix != ".bin" or out_bin.name == ".bin":
        raise PackError(f"{out_bin}: the output must be named NAME.bin (NAME.json goes beside it)")
    if printable_path(out_bin.name) != out_bin.name:  # the index names its .bin, in UTF-8
        raise PackError(
            f"{printable_path(str(out_bin))}: the output name must be valid UTF-8 "
            f"(the index stores it); rename it"
        )
    if not out_bin.parent.is_dir():
        raise PackError(f"{out_bin.parent}: output folder does not exist")


def check_output(
    out_bin: Path, journal: Journal, *, force: bool, resume: bool | None
) -> dict[str, Any] | None:
    """Refuse outputs that would lose data, under the journal's lock (``journal.created``:
    no interrupted run was here). Returns the index of a finished pack that a rerun of the
    same command may find complete, else None."""
    out_json, _ = pack_paths(out_bin)
    if force:
        return None
    if out_json.exists() and out_bin.exists() and resume is not False:
        index = json_or_none(out_json.read_bytes())
        if isinstance(index, dict) and isinstance(index.get("command_fingerprint"), str):
            return index  # compared with this command's once the source is listed
    publishing = out_bin.exists() and not out_json.exists() and not journal.created
    if publishing and resume is not False:
        return None  # killed between the .bin's rename and the .json: the run is redone
    for p in (out_bin, out_json):
        if p.exists():
            raise OutputExistsError(f"{p}: already exists; use --force to overwrite it")
    if resume is False and (partial_path(out_bin).exists() or not journal.created):
        raise OutputExistsError(
            f"{partial_path(out_bin)}: an interrupted pack is here; "
            f"rerun without resume=False to continue it or use --force to start over"
        )
    return None  # --resume with no interrupted run fails in ``Journal.begin``


def check_free_space(folder: str | os.PathLike, needed: int, *, what: str = "pack") -> None:
    """Refuse to start a write that cannot fit, instead of failing at 97%."""
    free = shutil.disk_usage(folder).free
    if needed > free:
        need, have = human_bytes(needed), human_bytes(free)
        if need == have:  # too close to tell apart at 3 digits
            need, have = f"{needed:,} bytes", f"{free:,} bytes"
        raise PackError(f"{folder}: the {what} needs {need} but only {have} is free")


def _already_complete(
    where: Path | str, out_bin: Path, index: Mapping[str, Any], plan, journal: Journal
) -> PackSummary:
    """A rerun of the command that made this pack (at ``out_bin``, or published at the URL
    ``where``): nothing to do, if it is intact.

    Beside it, an interrupted run of the same command (``--force`` then killed, or killed
    before it removed its journal) holds nothing new: its partial file and journal go.
    Another command's run is left to resume."""
    why = None  # the pack there was not made by this command, as it stands now
    if index.get("command_fingerprint") != plan.extra["command_fingerprint"]:
        why = "it was packed from another source or with other settings"
        changed = sources_diff(index.get("sources"), plan.recipe.get("sources"))
        if changed is not None and "sources" in index:
            why = f"it was packed from other source files: {changed}"
    elif index.get("source_stamps") != plan.extra["source_stamps"]:
        why = "a source file changed since it was packed: its size or modification time"
        if "source_stamps" not in index:
            why = "it was packed by an imgpack that did not pin its source files"
    if why is not None:
        raise OutputExistsError(f"{where}: already exists; use --force to overwrite it ({why})")
    if where == out_bin:  # the .bin must match its index, or this is no finished pack
        read_index(out_bin)
    then, why = journal.header(plan.recipe)
    if then is not None and why is not None:  # another command's run: left to resume
        journal.close()
    else:  # this command's run, or one nobody can continue: nothing there is new
        partial_path(out_bin).unlink(missing_ok=True)
        journal.remove()
    return PackSummary(out_bin, index, 0.0, 0, 0, plan.listing.empty_classes, complete=True)


def _decode_and_write(journal: Journal, done, on_error, workers, progress, start_method):
    """Decode the journal's plan's samples from ``done`` on, write every outcome in order.

    With on_error "fail", the first sample that could not be decoded raises a SourceError
    naming it: the caller discards the run (the source, which only lists, raises none here).
    """
    plan, writer = journal.plan, journal.writer
    workers = min(workers, len(plan.files) - done) or 1
    fetch = plan.source  # decoding processes call it, sent without its listing
    decoder = ParallelDecoder(plan, done, fetch, workers, writer.max_record_bytes, start_method)
    with closing(fetch), decoder, handling(signal.SIGTERM, _interrupt):
        # the bar after the fork
        with progress_bar(progress, len(plan.files), initial=done, unit="img") as bar:
            for i, name, _, payload, info in decoder:
                if payload is None and on_error == "fail":
                    raise SourceError(f"{name}: {info} (--on-error fail: nothing written)")
                journal.append(i, payload, info)
                bar.update(1)
        journal.flush()


def _interrupt(signum, frame):
    """While packing, SIGTERM (schedulers, ``kill``) stops the run like Ctrl-C does."""
    exc = KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")
    exc.signum = signum
    raise exc
