"""The resume journal: which source files an interrupted pack already finished.

``NAME.bin.partial.journal`` sits beside the partial data file. Its first line
pins what is being packed (the run's recipe, under the key ``"fingerprint"``);
every further line is the outcome of one source file, in pack order: a record
with its CRC and channel sums, or a skip with its reason. Lines are appended in
batches, each batch only after the records it names were handed to the OS, so
the journal never claims bytes the partial file lacks. A torn last line (the
process was killed mid-write) is ignored.

The journal is also the lock: one exclusive ``flock`` per output, so two
``pack-images`` runs can never write the same partial file.

This module reads and writes the file; ``resume`` decides from it whether a run
continues, and keeps the records the partial file still holds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from imgpack.errors import PackError
from imgpack.format.fields import RecordGeometry
from imgpack.packer.digest import RecordDigest
from imgpack.packer.writer import partial_path
from imgpack.validate import is_int, is_int_list, json_or_none

try:  # POSIX; elsewhere runs are not protected against each other
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

__all__ = ["JOURNAL_VERSION", "Journal", "journal_path"]

# 2: records carry their geometry ("geo") and C channel sums; 3: "size"; 4: every line the
# "st" (size, mtime) of its source file
JOURNAL_VERSION = 4


def journal_path(out_bin: str | os.PathLike) -> Path:
    """``NAME.bin.partial.journal``: removed with the partial when the pack completes."""
    p = partial_path(out_bin)
    return p.with_name(p.name + ".journal")


class Journal:
    """An open, locked journal file; append outcomes, ``flush()`` them in batches."""

    def __init__(self, out_bin: str | os.PathLike) -> None:
        self.path = journal_path(out_bin)
        self._pending: list[str] = []
        self.restarted: str | None = None  # why resume.begin() discarded an interrupted run
        self.changed: str | None = None  # the first packed source file changed since
        while True:
            existed = self.path.exists()
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if fcntl is None:
                break
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._fd)
                self._fd = -1
                raise PackError(
                    f"{self.path}: another pack-images run is writing this output right now"
                ) from None
            if self._is_at_path():
                break
            os.close(self._fd)  # locked a journal another run removed as it finished: again
        self.created = not existed

    def _is_at_path(self) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except FileNotFoundError:
            return False

    # -- starting and resuming -------------------------------------------------------

    def start(self, recipe: dict[str, Any]) -> None:
        """Begin an empty journal for a fresh pack of ``recipe``."""
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        head = {"imgpack_journal": JOURNAL_VERSION, "fingerprint": recipe}  # the on-disk key
        self._pending = [json.dumps(head) + "\n"]
        self.flush()

    def header(self) -> tuple[bool, dict[str, Any] | None]:
        """(readable, recipe): the recipe the journal was started with, None if it is empty.

        ``readable`` is False (and the recipe None) for a file that is no resume journal this
        imgpack understands: another version's, or damaged; ``unreadable`` says so to a user.
        """
        with open(self.path, "rb") as f:
            first = f.readline()
        if not first.endswith(b"\n"):
            return True, None  # nothing was ever committed: nothing to resume
        head = json_or_none(first)
        if (
            not isinstance(head, dict)
            or not is_int(head.get("imgpack_journal"))
            or head["imgpack_journal"] != JOURNAL_VERSION
            or not isinstance(head.get("fingerprint"), dict)
        ):
            return False, None
        return True, head["fingerprint"]

    def unreadable(self, name: str) -> PackError:
        """The error for ``--resume`` of ``name`` when ``header`` found no journal it reads."""
        return PackError(
            f"{self.path}: not a resume journal this imgpack understands; "
            f"use --force to start {name} over"
        )

    def entries(self, files: list[tuple[str, int]]) -> Iterator[tuple[dict[str, Any], int]]:
        """Yield (entry, end offset) for each intact line after the header, in order.

        Stops at the first torn, unparsable or out-of-order line: everything from
        there on is redone.
        """
        with open(self.path, "rb") as f:
            offset = len(f.readline())
            for i, line in enumerate(f):
                if not line.endswith(b"\n"):
                    return
                entry = json_or_none(line)
                if not _entry_ok(entry, i, files):
                    return
                offset += len(line)
                yield entry, offset

    def truncate(self, offset: int) -> None:
        """Drop every line after byte ``offset``; later appends continue from there."""
        os.ftruncate(self._fd, offset)
        os.lseek(self._fd, offset, os.SEEK_SET)

    # -- appending -----------------------------------------------------------------

    def add_record(
        self,
        i: int,
        relpath: str,
        digest: RecordDigest,
        geometry: RecordGeometry | None,
        size: tuple[int, int],
        stamp: tuple[int, int],
        length: int | None = None,
        as_is: bool = False,
    ) -> None:
        """Record ``i``: its digest, geometry and (width, height), which say where it ends;
        the ``stamp`` of the file it came from (``sources.source.stamps``); jpeg: its
        ``length`` in bytes (``"len"``), which does, and ``as_is`` (a source's own bytes)."""
        crc, sums, sums_sq = digest
        entry = {"i": i, "path": relpath, "size": [int(v) for v in size], "crc": int(crc)}
        entry.update(sum=[int(v) for v in sums], sum_sq=[int(v) for v in sums_sq])
        if geometry is not None:  # floats print as repr: they read back to the same value
            (w, h), sbox, cbox = geometry
            entry["geo"] = [int(w), int(h), *map(float, sbox), *map(float, cbox)]
        if length is not None:
            entry["len"] = int(length)
        if as_is:
            entry["as_is"] = True
        entry["st"] = list(stamp)
        self._pending.append(json.dumps(entry) + "\n")

    def add_skip(self, i: int, relpath: str, reason: str, stamp: tuple[int, int]) -> None:
        entry = {"i": i, "path": relpath, "skip": reason, "st": list(stamp)}
        self._pending.append(json.dumps(entry) + "\n")

    @property
    def pending(self) -> int:
        return len(self._pending)

    def flush(self) -> None:
        """Append the pending lines with one write; call only after the data file's flush."""
        if not self._pending:
            return
        data = "".join(self._pending).encode("ascii")  # json.dumps escapes the rest
        self._pending = []
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        """Release the lock; the file stays for --resume."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def release(self) -> None:
        """Let go of a run stopped before it wrote a record: a journal it created goes, an
        interrupted run's stays as it was for the next one."""
        if self.created:
            self.remove()
        else:
            self.close()

    def remove(self) -> None:
        """Delete the journal (pack finished or discarded), then release the lock."""
        self.path.unlink(missing_ok=True)
        self.close()


def _entry_ok(entry: Any, i: int, files: list[tuple[str, int]]) -> bool:
    """Line ``i`` describes source file ``i``, as a well-formed record or skip."""
    if not (
        isinstance(entry, dict)
        and is_int(entry.get("i"))
        and entry["i"] == i
        and i < len(files)
        and entry.get("path") == files[i][0]
    ):
        return False
    if not is_int_list(entry.get("st"), 2):
        return False
    if "skip" in entry:
        return isinstance(entry["skip"], str)
    sums, sums_sq = entry.get("sum"), entry.get("sum_sq")
    return (
        is_int_list(entry.get("size"), 2, minimum=1)
        and is_int(entry.get("crc"))
        and is_int_list(sums)
        and len(sums) in (1, 3)
        and is_int_list(sums_sq, len(sums))
        and _geometry_ok(entry.get("geo", []))
        and (is_int(entry.get("len")) and 2 <= entry["len"] < 2**32 if "len" in entry else True)
        and entry.get("as_is", False) in (True, False)
    )


def _geometry_ok(geo: Any) -> bool:
    """[w, h, source box, content box]: a size the pack can store, 8 finite numbers."""
    return (
        isinstance(geo, list)
        and len(geo) in (0, 10)
        and all(type(v) is int and 0 < v < 2**32 for v in geo[:2])
        and all(type(v) in (int, float) and abs(v) < 2**64 for v in geo[2:])
    )
