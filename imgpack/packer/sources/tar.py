"""WebDataset tar shards as a source: samples grouped by key, read in place, never extracted.

Listing reads every shard's headers with the standard library's ``tarfile`` (seeking past
the image data, reading only the small label members), one shard per process on every core
(``pool``), and keeps, per sample, where its image's bytes lie in the shard. A decoding
process then reads those bytes itself with one ``pread`` on the shard (kept open), so no
image travels through the parent and nothing is written to disk but the pack.
WebDataset's rules, as its ``tariterators`` apply them:

* A member's key is its name up to the first dot of its base name, the rest its extension
  (``n01440764/10026.seg.png``: key ``n01440764/10026``, extension ``seg.png``); names
  with no such dot, members that are not regular files and ``__x__`` bookkeeping names are
  passed over. Consecutive members with one key are one sample, in tar order.
* The image is the first member whose extension is one image extension Pillow reads
  (``jpg``, ``png``, ``webp``, ...; not ``seg.png``). The label is the integer text of
  ``.cls`` (or ``.label``), or with ``--label-key K`` the integer ``K`` of ``.json``.
* A sample with no image, no label, a label that does not parse or an extension twice is
  skipped and listed as ``shard.tar:key``. A shard cut short (a partial download) or
  damaged keeps the samples before the damage; the shard itself is listed with the last
  good key, as one more skipped entry, so that nothing is lost silently.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import SourceError
from imgpack.packer.discover import printable_path
from imgpack.packer.formats import image_extensions
from imgpack.packer.sources.numbering import number_labels
from imgpack.packer.sources.pool import map_in_processes
from imgpack.packer.sources.source import Data, Listing, Skip, source_files

__all__ = ["TarFetch", "TarSource", "scan_shard", "split_member"]

_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$", re.DOTALL)  # WebDataset's base_plus_ext
_INT = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)
_LABEL_EXTS = ("cls", "label")
_LABEL_BYTES = 1 << 20  # a label member larger than this is no label
_BLOCK = 512


def split_member(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member name, by WebDataset's rule; None when it has none."""
    match = _KEY.match(name)
    return (match[1], match[2]) if match else None


class TarSource:
    """Samples of WebDataset shards (``paths``, sorted), named ``name:key`` with ``names``
    the shards' names relative to ``root``."""

    kind = "tar"
    unit_size = 1  # each image is one pread

    def __init__(
        self,
        paths: Sequence[str],
        names: Sequence[str],
        root: Path,
        *,
        labelled: bool = True,
        label_key: str | None = None,
        classes_from: list[str] | None = None,
        classes_source: str = "the class list",
        on_error: str | None = None,
        workers: int = 1,
    ) -> None:
        self.paths, self.names, self.root = list(paths), list(names), root
        self.workers = workers  # processes listing the shards
        self.labelled, self.label_key = labelled, label_key
        self.classes_from, self.classes_source = classes_from, classes_source
        self.on_error = on_error
        self._listing: Listing | None = None

    def describe(self) -> dict[str, Any]:
        first, last, n = self.names[0], self.names[-1], len(self.names)
        shown = first if n == 1 else f"{first} .. {last} ({n} tar shards)"
        out = {
            "source": shown,
            "source_kind": "tar",
            "labels": "samples" if self.labelled else "none",
        }
        if self.label_key is not None:
            out["label_key"] = self.label_key
        if self.classes_from is not None:
            out["classes_from"] = printable_path(self.classes_source)
        return out

    def identity(self) -> dict[str, Any]:
        return {"sources": source_files(self.names, self.paths)}

    def listing(self) -> Listing:
        if self._listing is None:
            self._listing = self._list()
        return self._listing

    def _list(self) -> Listing:
        names: list[str] = []
        raw: list[int] = []
        where: list[tuple[int, int, int]] = []
        bad: dict[int, str] = {}
        scans = [(path, self.labelled, self.label_key) for path in self.paths]
        listed = map_in_processes(scan_shard, scans, workers=self.workers, names=self.paths)
        for s, (shard, found) in enumerate(zip(self.names, listed)):
            for key, image, label, reason in found:
                if reason is not None:
                    bad[len(names)] = reason
                names.append(f"{shard}:{key}" if key is not None else shard)
                raw.append(label)
                where.append((s, *image) if image else (s, 0, 0))
        if not names:
            raise SourceError(
                f"{self.root}: no samples in {len(self.paths)} tar shard"
                f"{'' if len(self.paths) == 1 else 's'} (WebDataset members key.ext)"
            )
        if self.labelled:
            classes, labels = number_labels(
                np.array(raw, dtype=np.int64),
                bad,
                names=None,
                classes_from=self.classes_from,
                classes_source=self.classes_source,
                on_error=self.on_error,
                name_of=names.__getitem__,
                unlabelled_hint="pack them without labels with --labels none",
            )
        else:
            classes, labels = [], np.full(len(names), -1)
        self._where = np.array(where, dtype=np.int64).reshape(-1, 3)
        files = list(zip(names, labels.tolist()))
        return Listing(self.root, classes, files, bad=bad)

    def feed(self, positions: Sequence[int]) -> Iterator[Any]:
        bad, where = self.listing().bad, self._where
        for p in positions:
            yield Skip(bad[p]) if p in bad else tuple(where[p].tolist())

    def fetcher(self) -> TarFetch:
        return TarFetch(tuple(self.paths))


def scan_shard(path: str, labelled: bool, label_key: str | None) -> list[tuple]:
    """One shard's samples, in tar order: (key, (offset, size) of its image or None, label
    or -1, why it gives no record or None); a damaged shard ends with (None, None, -1, why).
    Module-level: listing processes run it."""
    return list(_Shard(path, labelled, label_key).samples())


class _Shard:
    """One shard's samples, read with ``tarfile`` (see ``scan_shard``)."""

    def __init__(self, path: str, labelled: bool, label_key: str | None) -> None:
        self.path, self.labelled, self.label_key = path, labelled, label_key
        self.exts = {e[1:] for e in image_extensions()}

    def samples(self) -> Iterator[tuple[str | None, tuple[int, int] | None, int, str | None]]:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise SourceError(f"{self.path}: cannot read the shard ({exc.strerror})") from None
        with f:
            try:
                tar = tarfile.open(fileobj=f, mode="r:")
            except (tarfile.TarError, OSError, ValueError) as exc:
                raise SourceError(f"{self.path}: not a tar file ({exc})") from None
            group: list[tuple[str, tarfile.TarInfo]] = []
            key, last_key, end, member, damage = None, None, 0, None, None
            try:
                for member in tar:
                    end = member.offset_data + (-(-member.size // _BLOCK) * _BLOCK)
                    parts = split_member(member.name)
                    if not member.isreg() or parts is None or _bookkeeping(member.name):
                        continue
                    if parts[0] != key and group:
                        yield self._sample(f, key, group)
                        last_key, group = key, []
                    key = parts[0]
                    group.append((parts[1], member))
            except tarfile.TarError as exc:
                damage = f"it ends inside member {member.name!r} ({exc})" if member else str(exc)
            damage = damage or _end_damage(f, end)
            if damage is None:
                if group:
                    yield self._sample(f, key, group)
                return
            dropped = f", so sample {key} is incomplete" if group else ""
            good = f"the last good key is {last_key}" if last_key else "no sample before it"
            yield None, None, -1, f"truncated or damaged tar: {damage}{dropped}; {good}"

    def _sample(self, f, key: str, group: list[tuple[str, tarfile.TarInfo]]):
        """(key, image range, label or -1, why it is skipped or None)."""
        seen: dict[str, tarfile.TarInfo] = {}
        for ext, member in group:
            if ext.lower() in seen:
                return key, None, -1, f"member {member.name!r} appears twice in the sample"
            seen[ext.lower()] = member
        image = next((m for e, m in group if e.lower() in self.exts), None)
        label, why = self._label(f, seen) if self.labelled else (-1, None)
        if image is None:
            found = ", ".join(f".{e}" for e, _ in group)
            return key, None, label, f"no image member (found {found})"
        return key, (image.offset_data, image.size), label, why

    def _label(self, f, seen: dict[str, tarfile.TarInfo]) -> tuple[int, str | None]:
        name = self.label_key
        if name is not None:
            member = seen.get("json")
            if member is None:
                return -1, f"no .json member to read --label-key {name!r} from"
            try:
                value = json.loads(_read(f, member))
            except ValueError:
                return -1, f"{member.name} is not JSON"
            if not isinstance(value, dict) or name not in value:
                return -1, f"{member.name} has no key {name!r} (--label-key)"
            value = value[name]
            if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= 2**62:
                return -1, f"label {json.dumps(value)[:40]} in {member.name} is not an integer"
            return value, None
        member = next((seen[e] for e in _LABEL_EXTS if e in seen), None)
        if member is None:
            return -1, "no label (no .cls or .label member)"
        text = _read(f, member).decode("utf-8", "replace")
        if not _INT.fullmatch(text) or len(text.strip()) > 18:
            return -1, f"label {text[:40]!r} in {member.name} is not an integer"
        return int(text), None


def _read(f, member: tarfile.TarInfo) -> bytes:
    if member.size > _LABEL_BYTES:
        return b""
    f.seek(member.offset_data)
    return f.read(member.size)


def _bookkeeping(name: str) -> bool:
    """WebDataset's own ``__key__``-style names at the top of a shard."""
    return "/" not in name and name.startswith("__") and name.endswith("__")


def _end_damage(f, end: int) -> str | None:
    """Why the archive does not end where its last member does (None: it does). A tar ends
    with zero blocks; ``tarfile`` stops quietly at a cut header or at bytes that are no
    header, so both are looked for here."""
    f.seek(end)
    block = f.read(_BLOCK)
    if len(block) < _BLOCK:
        return f"it ends at byte {end + len(block)} without the end-of-archive blocks"
    if block.count(0) != _BLOCK:
        return f"the bytes at {end} are no tar header"
    return None


class TarFetch:
    """Reads an image's bytes from its shard (``os.pread``); shards stay open per process."""

    def __init__(self, paths: tuple[str, ...]) -> None:
        self.paths = paths
        self._open: dict[int, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self.paths, "_open": {}}

    def __call__(self, payload: tuple[int, int, int]) -> Data:
        shard, offset, size = payload
        try:
            fd = self._open.get(shard)
            if fd is None:
                if len(self._open) >= 8:  # a few shards at a time: chunks follow tar order
                    os.close(self._open.pop(next(iter(self._open))))
                fd = self._open[shard] = os.open(self.paths[shard], os.O_RDONLY)
            data = os.pread(fd, size, offset)
        except OSError as exc:
            return Skip(f"cannot read the shard ({exc.strerror})")
        if len(data) != size:
            return Skip("the shard is shorter than when it was listed (changed since?)")
        return data

    def close(self) -> None:
        while self._open:
            os.close(self._open.popitem()[1])
