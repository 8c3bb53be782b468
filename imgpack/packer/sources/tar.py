"""WebDataset tar shards as a source: samples grouped by key, read in place, never extracted.

Listing reads every shard's headers with the standard library's ``tarfile`` (seeking past
the image data, reading only the small label members), one shard per process on every core
(``parallel.map_in_processes``), and keeps, per sample, where its image's bytes lie in the
shard. A decoding process then reads those bytes itself with one ``pread`` on the shard,
so no image travels through the parent and nothing is written to disk but the
pack.
WebDataset's rules, as its ``tariterators`` apply them, but for the grouping:

* A member's key is its name up to the first dot of its base name, the rest its extension
  (``n01440764/10026.seg.png``: key ``n01440764/10026``, extension ``seg.png``).
* The members of one key are one sample wherever they lie in the shard: plain ``tar cf``
  writes a folder's files in directory order, not next to each other. Samples come in the
  order their keys first appear (tar order for a shard written key by key, as
  WebDataset's writers do). A key that has one extension twice (``a.jpg a.cls ... a.jpg``)
  is a duplicate: skipped and listed, never two records of one name.
* The image is the first member whose extension is one image extension Pillow reads
  (``jpg``, ``png``, ``webp``, ...; not ``seg.png``). The label is the integer text of
  ``.cls`` (or ``.label``), or with ``--label-key K`` the integer ``K`` of ``.json``.
* A sample with no image, no label, a label that does not parse (or a label member over
  1 MB) is skipped and listed as ``shard.tar:key``. A member that can be no sample's (a
  symlink or other non-regular file, a name with no extension) is listed in ``excluded``
  as ``shard.tar:name``; folders of the tar are passed over, hidden and system names and
  WebDataset's ``__x__`` bookkeeping names counted (``excluded_hidden``), as a folder's are.
* A shard cut short (a partial download) or damaged keeps the samples before the damage
  but the last key met, which may have more members past it; the shard itself is listed
  with what was dropped, as one more skipped entry, so that nothing is lost silently.

Listing also digests every header it reads (name, type, size, offset): with the shard's
size, that pins it for a rerun (``identity``) without a modification time, which a copy or
a second download changes although the bytes are the same.
"""

from __future__ import annotations

import hashlib
import os
import re
import tarfile

import numpy as np

from imgpack.packer.decode import image_extensions
from imgpack.packer.discover import NOT_REGULAR, is_system_file
from imgpack.packer.parallel import map_in_processes
from imgpack.packer.sources.source import Scan, Skip, Source, reading, reason
from imgpack.validate import is_int, json_or_none

__all__ = ["TarSource", "scan_shard"]

_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$", re.DOTALL)  # WebDataset's base_plus_ext
_LABEL_EXTS = ("cls", "label")
_LABEL_BYTES = 1 << 20  # a label member larger than this is no label
_NO_LABEL_JSON = "no label (no .cls or .label member; name its .json's key with --label-key)"
_NO_KEY = "no extension, so no sample's member (WebDataset names them key.ext)"
_LINKS = {tarfile.SYMTYPE: "a symlink", tarfile.LNKTYPE: "a hard link"}


class TarSource(Source):
    """Samples of WebDataset shards (``paths``, sorted), named ``name:key`` with ``names``
    the shards' names relative to ``root`` (``options``: ``label_key``, the .json key of a
    label); a payload is (shard, offset, size) of the image's bytes, which a decoding
    process reads with one ``os.pread``."""

    kind = "tar"
    noun = "tar shards"

    def scans(self) -> list[Scan]:
        """Every shard's ``scan_shard``, one shard per process."""
        scans = [(path, self.labelled, self.options.get("label_key")) for path in self.paths]
        return list(map_in_processes(scan_shard, scans, workers=self.workers, names=self.paths))

    def __call__(self, payload: tuple[int, int, int]) -> bytes | Skip:
        shard, offset, size = payload
        try:  # an open per image costs microseconds beside its decode
            with open(self.paths[shard], "rb", buffering=0) as f:
                data = os.pread(f.fileno(), size, offset)
        except OSError as exc:
            return Skip(f"cannot read the shard ({reason(exc)})")
        if len(data) != size:
            return Skip("the shard is shorter than when it was listed (changed since?)")
        return data


def scan_shard(path: str, labelled: bool, label_key: str | None) -> Scan:
    """One shard's samples, by key in the order keys first appear, each image's place
    (offset, size), (0, 0) where there is none; a damaged shard ends with (None, -1, why,
    (0, 0)).
    The digest is of every header listed. Module-level: listing processes run it."""
    errors = (tarfile.TarError, OSError, ValueError)  # what tarfile and the file may raise
    with reading(path, "not a readable tar file", errors), open(path, "rb") as f:
        shard = _Shard(labelled, label_key)
        damage = shard.members(f, tarfile.open(fileobj=f, mode="r:"))
    # the last key met (None: no sample member came before the damage), cut or complete as
    # far as it goes: more of its members may lie past the damage, so it is not trusted
    dropped = shard.last_key if damage else None
    samples = [shard.sample(k, group) for k, group in shard.keys.items() if k != dropped]
    if damage is not None:  # what is wrong and what it cost, as one more skipped entry
        lost = "" if dropped is None else f"; sample {dropped} is dropped with it"
        kept = f"the last key kept is {samples[-1][0]}" if samples else "no sample is kept"
        samples.append((None, -1, f"truncated or damaged tar: {damage}{lost}; {kept}", (0, 0)))
    keys, labels, whys, places = zip(*samples) if samples else ((), (), (), ())
    bad = {i: why for i, why in enumerate(whys) if why is not None}
    labels, places = np.array(labels, np.int64), np.array(places, np.int64).reshape(-1, 2)
    return Scan(keys, labels, places, bad, shard.excluded, shard.hidden, shard.digest.hexdigest())


class _Shard:
    """One shard's members, read with ``tarfile`` and grouped by key (``scan_shard``)."""

    def __init__(self, labelled: bool, label_key: str | None) -> None:
        self.labelled, self.label_key = labelled, label_key
        self.exts = {e[1:] for e in image_extensions()}
        self.read_exts = set() if not labelled else {"json"} if label_key else set(_LABEL_EXTS)
        self.keys: dict[str, list[tuple[str, tarfile.TarInfo, bytes | None]]] = {}
        self.excluded: list[tuple[str, str]] = []
        self.hidden = 0
        self.digest = hashlib.blake2b(digest_size=16)
        self.last_key: str | None = None  # the key of the last sample member met

    def members(self, f, tar: tarfile.TarFile) -> str | None:
        """Group every member by key (``keys``) or leave it out; why the shard ends before
        its end-of-archive blocks, or None. ``tarfile.open`` has read the first header, so
        an error comes after a member."""
        try:
            for member in tar:
                self.add(tar, member)
        except tarfile.TarError as exc:
            if os.fstat(f.fileno()).st_size < member.offset_data + member.size:
                return f"it ends inside member {member.name!r} ({exc})"
            return f"the header after member {member.name!r} does not read ({exc})"
        # a tar ends with zero blocks; ``tarfile`` stops quietly at a cut header or at bytes
        # that are no header, so both are looked for where it stopped (past the last member)
        block = os.pread(f.fileno(), tarfile.BLOCKSIZE, tar.offset)
        if len(block) < tarfile.BLOCKSIZE:
            return f"it ends at byte {tar.offset + len(block)} without the end-of-archive blocks"
        return f"the bytes at {tar.offset} are no tar header" if any(block) else None

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        name = member.name
        header = f"{name}\0{member.type!r}\0{member.size}\0{member.offset_data}\n"
        self.digest.update(header.encode("utf-8", "surrogateescape"))
        if member.isdir():
            return  # a folder of the tar, not a file in it
        bookkeeping = "/" not in name and name.startswith("__") and name.endswith("__")
        if is_system_file(name.rsplit("/", 1)[-1]) or bookkeeping:  # WebDataset's __key__
            self.hidden += 1
            return
        parts = _KEY.match(name)  # (key, extension), by WebDataset's rule; None: no extension
        if member.issparse() or not member.isreg():  # a sparse file's bytes are not in one piece
            other = "a device or FIFO" if member.isdev() else f"type {member.type!r}"
            kind = "a sparse file" if member.issparse() else _LINKS.get(member.type, other)
            self.excluded.append((name, f"{NOT_REGULAR} ({kind})"))
        elif parts is None:
            self.excluded.append((name, _NO_KEY))
        else:
            key, ext = parts[1], parts[2]
            data = None  # a label's bytes (tarfile seeks to its next header itself)
            if ext.lower() in self.read_exts and member.size <= _LABEL_BYTES:
                data = tar.extractfile(member).read()
            self.keys.setdefault(key, []).append((ext, member, data))
            self.last_key = key

    def sample(self, key: str, group: list[tuple[str, tarfile.TarInfo, bytes | None]]):
        """(key, label or -1, why it is skipped or None, (offset, size) of its image)."""
        # each extension's first member, with its bytes (read in reverse: the first is kept)
        seen = {ext.lower(): (member, data) for ext, member, data in reversed(group)}
        if len(seen) < len(group):  # an extension twice: name its second member
            twice = next(m for e, m, _ in group if seen[e.lower()][0] is not m)
            why = f"a duplicate key: member {twice.name!r} appears twice in the shard"
            return key, -1, why, (0, 0)
        image = next((m for e, m, _ in group if e.lower() in self.exts), None)
        label, why = self.label(seen) if self.labelled else (-1, None)
        if image is None:
            found = ", ".join(f".{e}" for e, _, _ in group)
            return key, label, f"no image member (found {found})", (0, 0)
        return key, label, why, (image.offset_data, image.size)

    def label(self, seen: dict[str, tuple[tarfile.TarInfo, bytes | None]]):
        """(label or -1, why there is none or None): the integer text of ``.cls`` (or
        ``.label``), or with ``--label-key`` that key's integer in ``.json``."""
        key = self.label_key
        ext = "json" if key is not None else next((e for e in _LABEL_EXTS if e in seen), None)
        if ext not in seen:
            if key is not None:
                return -1, f"no .json member to read --label-key {key!r} from"
            return -1, _NO_LABEL_JSON if "json" in seen else "no label (no .cls or .label member)"
        member, data = seen[ext]
        if data is None:
            size = f"{member.size:,} bytes; at most 1 MB"
            return -1, f"label member {member.name!r} too large ({size})"
        try:  # int() takes the text of a .cls as WebDataset's decoder does
            value = int(data) if key is None else json_or_none(data)[key]
        except (ValueError, TypeError, KeyError):  # no integer text, no JSON object, no such key
            value = None
        if not is_int(value) or abs(value) >= 2**62:
            if key is None:
                text = data.decode("utf-8", "replace")
                return -1, f"label {text[:40]!r} in {member.name} is not an integer"
            return -1, f"{member.name} has no integer under key {key!r} (--label-key)"
        return value, None
