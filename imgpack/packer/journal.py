"""The resume journal: which source files an interrupted pack already finished, and how a
rerun continues from it.

``NAME.bin.partial.journal`` sits beside the partial data file. Its first line
pins what is being packed (the run's recipe, under the key ``"fingerprint"``);
every further line is the outcome of one source file, in pack order: a record
with its CRC and channel sums, or a skip with its reason, each with the stamp (size,
modification time) of the file it came from. Lines are appended in batches, each
batch only after the records it names were handed to the OS, so the journal never
claims bytes the partial file lacks. A torn last line (the process was killed
mid-write) is ignored.

The journal is also the lock: one exclusive ``flock`` per output, taken before a run
looks at anything, so two ``pack-images`` runs can never write the same partial file
nor replace each other's pack. ``begin`` decides whether a run continues (the same
recipe) or starts afresh, and keeps the journalled records the partial file still
holds intact, believing or redoing each one; it changes nothing on disk before its
checks end, so a rerun stopped while it checks loses nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from contextlib import suppress
from pathlib import Path
from typing import Any

from imgpack.errors import PackError
from imgpack.format.layout import HEADER_BYTES
from imgpack.format.write import record_checksum, sums_possible
from imgpack.packer.sources.source import printable_path
from imgpack.packer.writer import PackWriter, partial_path
from imgpack.validate import is_int, is_int_list, json_or_none

try:  # POSIX; elsewhere runs are not protected against each other
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

__all__ = ["Journal", "journal_path", "recipe_diff", "recipe_digest", "sources_diff"]

# 2: records carry their geometry ("geo") and C channel sums; 3: "size"; 4: every line the
# "st" (size, mtime) of its source file
JOURNAL_VERSION = 4
JOURNAL_EVERY = 32  # outcomes per journal write: at most this much work is redone after SIGKILL


def journal_path(out_bin: str | os.PathLike) -> Path:
    """``NAME.bin.partial.journal``: removed with the partial when the pack completes."""
    return Path(f"{partial_path(out_bin)}.journal")


class Journal:
    """An open, locked journal file: ``begin`` continues an interrupted run or starts
    afresh, then ``append`` hands each outcome to the run's writer and journals it, and
    ``flush`` commits both in batches."""

    def __init__(self, out_bin: str | os.PathLike) -> None:
        self.path = journal_path(out_bin)
        self._pending: list[str] = []
        while True:
            existed = self.path.exists()
            # O_APPEND: every write goes after the lines kept, wherever begin() cut them
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            if fcntl is None:
                break
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._fd)
                raise PackError(
                    f"{self.path}: another pack-images run is writing this output right now"
                ) from None
            with suppress(FileNotFoundError):
                if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                    break
            os.close(self._fd)  # locked a journal another run removed as it finished: again
        self.created = not existed

    # -- starting and resuming -------------------------------------------------------

    def header(self, recipe: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        """(then, why): the recipe the journal was started with (None if it is empty, or no
        resume journal this imgpack understands: another version's, or damaged), and why a
        run of ``recipe`` cannot continue it (None: it can, or there is nothing to continue).
        """
        with open(self.path, "rb") as f:
            first = f.readline()
        if not first.endswith(b"\n"):
            return None, None  # nothing was ever committed: nothing to resume
        head = json_or_none(first)
        known = isinstance(head, dict) and head.get("imgpack_journal") == JOURNAL_VERSION
        if not (known and isinstance(head.get("fingerprint"), dict)):
            return None, f"{self.path.name} is not a resume journal this imgpack understands"
        return head["fingerprint"], recipe_diff(head["fingerprint"], recipe)

    def begin(self, writer: PackWriter, plan, *, resume: bool | None, notify) -> int:
        """Continue the interrupted run this journal describes, or start afresh; open
        ``writer`` to match, and flush it before each batch of lines from now on. Returns
        how many of ``plan.files`` are done; ``notify`` hears what was decided.

        ``resume`` True: continue, or fail if the run was made differently; None (a plain
        rerun): continue when the run matches, else start over, saying why; False: start
        afresh. The plan's ``targets[i]`` is file i's target
        vector (None: the pack has none), its ``stamps[i]`` the stamp of its source file now.
        """
        self.writer, self.plan, recipe, name = writer, plan, plan.recipe, writer.out_bin.name
        then, why = self.header(recipe) if resume is not False else (None, None)
        if resume and (why or then is None):  # "continue or fail": say what to run instead
            why = why or "nothing to resume (no interrupted pack of it here)"
            raise PackError(
                f"cannot resume {name}: {why}; run the same command without --resume to pack "
                f"it from the start"
            )
        if why:
            notify(f"starting over, the interrupted pack of {name} differs: {why}")
            then = None
        done = 0 if then is None else self._restore(notify)
        if then is None:  # the on-disk key of the recipe: "fingerprint"
            head = {"imgpack_journal": JOURNAL_VERSION, "fingerprint": recipe}
            os.ftruncate(self._fd, 0)
            self._pending = [json.dumps(head) + "\n"]
        writer.open()
        self.flush()
        if done:
            notify(
                f"resuming: {done:,} of {len(plan.files):,} images already packed "
                f"(an interrupted run of the same command)"
            )
        return done

    def _restore(self, notify) -> int:
        """Keep the journalled outcomes whose records the partial file still holds intact, up
        to the first torn, unparsable or out-of-order line, or the first whose source file
        changed since: that one and those after it are packed again. Records follow each
        other at the offsets their journalled sizes give, exactly as the finished pack will
        place them. Cuts the journal after the last line kept; later lines append there."""
        writer, plan = self.writer, self.plan
        if not writer.partial.exists() and writer.out_bin.exists():
            # stopped (killed, disk full) after the finished .bin took its name, before its
            # .json: every record is there to keep, and finish() writes the rest again
            os.replace(writer.out_bin, writer.partial)
        done = 0
        partial = open(writer.partial, "rb") if writer.partial.exists() else io.BytesIO()
        with open(self.path, "rb") as f, partial as data:
            keep_offset = len(f.readline())  # the header line
            data.seek(HEADER_BYTES)
            for line in f:
                entry = json_or_none(line) if line.endswith(b"\n") else None
                try:  # ValueError, IndexError: a line not to believe, or a value the writer refuses
                    stored, outcome = _outcome(writer, data, entry, done, plan.files)
                    if entry["st"] != list(plan.stamps[done]):
                        notify(
                            f"{printable_path(entry['path'])} changed since it was packed (its "
                            f"size or modification time): it and the images after it are packed "
                            f"again"
                        )
                        break
                    self.append(done, stored, outcome, kept=True)
                except (ValueError, IndexError):
                    break
                done += 1
                keep_offset += len(line)
        os.ftruncate(self._fd, keep_offset)
        return done

    # -- appending -----------------------------------------------------------------

    def append(self, i: int, payload: Any, info: Any, *, kept: bool = False) -> None:
        """Sample ``i``'s outcome, to the writer and then to the journal: a skip (``info`` its
        reason) or a record (``payload`` its pixels or stored bytes, ``info`` its (digest,
        geometry, (width, height), as_is)). ``kept``: a journalled record read back from the
        partial file (resume), accounted for and not journalled again. Every
        ``JOURNAL_EVERY`` lines, the batch is flushed.

        A line holds the stamp of the sample's file (``sources.source.stamps``), and a
        record's digest, geometry and size, which say where it ends; jpeg: its length in
        bytes (``"len"``), which does, and ``as_is`` (a source's own bytes)."""
        plan, writer = self.plan, self.writer
        name, label = plan.files[i]
        entry: dict[str, Any] = {"i": i, "path": name}
        if isinstance(info, str):
            writer.skip(name, info)
            entry["skip"] = info
        else:
            digest, geometry, size, as_is = info
            target = None if plan.targets is None else plan.targets[i]
            record = dict(geometry=geometry, target=target, size=size, as_is=as_is, kept=kept)
            writer.append(payload, label, name, digest, **record)
            crc, sums, sums_sq = digest
            entry.update(size=[int(v) for v in size], crc=int(crc), sum=[int(v) for v in sums])
            entry.update(sum_sq=[int(v) for v in sums_sq], as_is=bool(as_is))
            if geometry is not None:  # floats print as repr: they read back to the same value
                (w, h), sbox, cbox = geometry
                entry["geo"] = [int(w), int(h), *map(float, sbox), *map(float, cbox)]
            if writer.codec == "jpeg":
                entry["len"] = len(payload)
        if kept:
            return
        entry["st"] = list(plan.stamps[i])
        self._pending.append(json.dumps(entry) + "\n")
        if len(self._pending) >= JOURNAL_EVERY:
            self.flush()

    def flush(self) -> None:
        """Hand the writer's records to the OS, then append the pending lines that name
        them with one write: the journal never claims bytes the partial file lacks."""
        self.writer.flush()
        data = "".join(self._pending).encode("ascii")  # json.dumps escapes the rest
        self._pending = []
        with open(self._fd, "ab", closefd=False) as f:  # buffered: every byte, or an error
            f.write(data)

    def close(self) -> None:
        """Release the lock; the file stays for --resume."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def remove(self) -> None:
        """Delete the journal (pack finished or discarded), then release the lock."""
        self.path.unlink(missing_ok=True)
        self.close()


def _outcome(writer: PackWriter, data, entry: Any, i: int, files: list) -> tuple[bytes | None, Any]:
    """(stored bytes, outcome) of journal line ``i``, which must name source file ``i`` of
    ``files`` and hold its stamp: a skip with its reason, or a record of the right types whose
    bytes the partial file (``data``, at the record) still holds with the CRC the worker
    computed, and whose sums are ones its pixels can have; else a ValueError: it and every
    line after it are redone."""
    if not (
        isinstance(entry, dict)
        and is_int(entry.get("i"))
        and entry["i"] == i < len(files)  # (a journal longer than the listing: not believed)
        and entry.get("path") == files[i][0]
        and is_int_list(entry.get("st"), 2)  # the stamp of its source file
    ):
        raise ValueError("not the line of source file i")
    if isinstance(entry.get("skip"), str):  # a skip with another value: no record either
        return None, entry["skip"]
    size, sums, sums_sq, geo = (entry.get(k) for k in ("size", "sum", "sum_sq", "geo"))
    if not (
        is_int_list(size, 2, minimum=1)
        and is_int(entry.get("crc"))
        and is_int_list(sums, writer.channels)
        and is_int_list(sums_sq, writer.channels)
        and isinstance(geo or [], list)
        and is_int(entry.get("len", 0))
        and entry.get("as_is", False) in (True, False)
        and sums_possible(size[0] * size[1], sums, sums_sq)
    ):
        raise ValueError("a record line of the wrong types, or impossible channel sums")
    nbytes = writer.nbytes(size, entry.get("len"))
    stored = data.read(nbytes)
    if len(stored) != nbytes or record_checksum(stored) != entry["crc"]:
        raise ValueError("the record's bytes are not the ones journalled")
    geometry = ((geo[0], geo[1]), tuple(geo[2:6]), tuple(geo[6:10])) if geo else None
    digest = (entry["crc"], tuple(sums), tuple(sums_sq))
    return stored, (digest, geometry, size, entry.get("as_is", False))


# -- the recipe: everything that decides a pack's bytes, and how two differ, in the
# user's words. A resumed run must have the interrupted one's (the journal's first line holds
# it, under the on-disk key "fingerprint"); a finished pack records its digest (the index's
# "command_fingerprint") so that a rerun can find it complete.

# the recipe keys a user may change that are no pack-images option, in the user's words;
# every other is named as the user spells it (--crop-ratio). The fixed choices of
# ``DecodeSettings.to_json`` (draft, max_pixels, ...) change only with the imgpack version,
# which comes first in the recipe and so is named instead
_NAMES = {
    "shard": "--shard-index/--num-shards",
    "targets": "the target vectors",
    "pillow": "Pillow version",
    "imgpack_version": "imgpack version",
    "source_kind": "the kind of source",
}
# recipe values that are pairs, said as the options take them
_PAIRS = {"size": "{}x{}", "shard": "{} of {}"}


def _show(key: str, value: Any) -> str:
    if key in _PAIRS and isinstance(value, list) and len(value) == 2:
        return _PAIRS[key].format(*value)
    if key == "targets":  # a digest: its first digits tell two apart
        return value[:12] if isinstance(value, str) else "none"
    return json.dumps(value)


def recipe_diff(then: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The first difference between two recipes, worded for the user; None if equal: the
    options that choose the files first, then the files themselves, then the rest."""
    # the options that choose which source files are packed come before the file list, so
    # that a changed option is named as such rather than reported as a changed source folder
    for key in ("labels", "shard_by", "shard", "sources", "classes", "files", "files_sha256", *now):
        if then.get(key) != now.get(key):
            return _differ(key, then, now)
    return None


def sources_diff(then: list | None, now: list | None) -> str | None:
    """Which source file (a tar shard, a Parquet file) is new, gone, or changed, from two
    lists of [name, size, digest] (``sources.source.source_files``); None if they agree."""
    if then == now:
        return None
    before = {n: tuple(rest) for n, *rest in then or []}
    after = {n: tuple(rest) for n, *rest in now or []}
    for n in [*after, *before]:  # the first name new now, else the first gone
        if n not in before or n not in after:
            return f"{n} is new" if n in after else f"{n} is gone"
    for n, (size, *_) in after.items():
        if before[n] != after[n]:
            if before[n][0] == size:
                return f"{n}: the same size, other contents"
            return f"{n}: {before[n][0]:,} bytes then, {size:,} now"
    return "the same files in another order"


def _differ(key: str, then: dict[str, Any], now: dict[str, Any]) -> str:
    """What changed at ``key``: the source files and classes in their own words, an
    option as the user spells it (``--crop-ratio``)."""
    since = "changed since the interrupted run"
    if key == "sources":
        return f"the source files {since} ({sources_diff(then.get(key), now.get(key))})"
    if key == "classes":
        return (
            f"the class list {since} ({then.get('class_count')} classes then, "
            f"{now['class_count']} now: --classes-from or the class folders)"
        )
    what, unit = (
        ("the source files", "samples") if "sources" in now else ("the source folder", "files")
    )
    if key == "files":
        return f"{what} {since} ({then.get('files')} {unit} then, {now['files']} now)"
    if key == "files_sha256":
        return f"{what} {since} (same count, other {unit})"
    name = _NAMES.get(key, "--" + key.replace("_", "-"))
    was, is_now = _show(key, then.get(key)), _show(key, now.get(key))
    return f"settings differ: {name} {was} then, {is_now} now"


def recipe_digest(recipe: dict[str, Any]) -> str:
    """SHA-256 of a recipe: the index's ``command_fingerprint``."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode("ascii")).hexdigest()
