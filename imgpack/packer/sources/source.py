"""The source stage of the packer: what every kind of input does, written once.

A record comes from a sample: a stable name (stored as the record's source path), a label
and the encoded image. Each kind of input (a folder, a labels file over a folder,
WebDataset tar shards, Parquet files) is one ``Source`` subclass. It lists its samples once,
before anything is decoded, in an order that depends on the sources alone: that listing
fixes the pack's record order, its shards and what a rerun must match to resume. A run then
asks it for the payloads of the positions it packs (``feed``), in order, and every decoding
process turns a payload into a path or the encoded bytes by calling the source itself
(``source(payload)``; it travels to a process without its listing). Past ``feed`` and that
call nothing in the packer asks which kind it packs. A kind read from files (tar shards,
Parquet files, and so a further one: TFRecords, a list of URLs fetched by the user's own
tool) writes only how to list one file (``scan``: each sample's key, label and place in
the file) and how to read the image at a place (``__call__``).

What the base holds for every kind: the listing kept once, built from every file's scan
(names ``file:key``, the samples known bad, what was left out, the no-samples error), the
options every kind takes (``--classes-from``, ``--on-error``, ``--labels``), how the index
describes a source and what pins its files for a rerun (each file's digest, made by its
scan), the file each sample lies in, the payloads of the samples known bad (a ``Skip``),
the rules that number the class numbers samples carry (``numbered``), and the one wording
of a source file that does not read (``reading``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from imgpack.errors import SourceError

__all__ = [
    "SOURCE_KINDS",
    "Fetch",
    "Listing",
    "Part",
    "Payload",
    "Scan",
    "Skip",
    "Source",
    "numbered_classes",
    "printable_path",
    "reading",
    "reason",
    "span",
    "stamps",
]

# the kinds of source file, by extension: a folder holding such files is no class folder
SOURCE_KINDS = {".tar": "tar", ".parquet": "parquet"}


class Skip(NamedTuple):
    """A sample that gives no record, and why: found when listing (a tar sample with no
    image member, a label that does not parse, a truncated shard) or when fetching (a null
    Parquet image). It becomes a ``skipped`` entry named by the sample, like a bad file."""

    reason: str


class Scan(NamedTuple):
    """One file's samples in the order they lie in it (``Source.scan``), by column: their
    keys (None: the file itself, for what a damaged file lost); their class numbers (int64,
    -1 for none); where each image lies in the file, (a, b) as its kind reads it (int64,
    N x 2); why a sample gives no record, by its index here. Then the members of the file
    that can be no sample's, (name, why); how many hidden or system ones were counted; the
    digest of what listing read, which pins the file for a rerun (``Source.identity``)."""

    keys: Sequence[str | None]
    labels: np.ndarray
    places: np.ndarray
    bad: dict[int, str]
    excluded: list[tuple[str, str]]
    hidden: int
    digest: str


class Part(NamedTuple):
    """A payload that is sample ``index`` of a unit read whole (a Parquet row group, named
    by ``unit``): no chunk of the decoder holds two units, and one holds a whole unit where
    it fits (``Source.unit_size``), so that a process reads the unit once per chunk of it,
    once where the chunk is the whole unit."""

    unit: tuple
    index: int


# What a source's feed yields for one sample and sends to a decoding process: small
# (a name, a byte range, a Part, a Skip) or, where the parent reads the data, the bytes.
Payload = Any


@dataclass(frozen=True)
class Listing:
    """What to pack: ``files[i]`` is (name, label) of the sample at position i.

    ``root``: the folder the names are relative to (SRC, or the folder the shards or
    Parquet files lie in). ``excluded``: (relpath, reason) of every file or folder left out,
    by path; ``hidden``: how many hidden/system entries were left out uncounted by name;
    ``bad``:
    position -> why that sample gives no record, known already (a tar sample with no image,
    a file a labels file lists that is not there); ``targets``: float32
    (N, K) target vectors aligned with ``files`` (a labels file's column), or None.
    """

    root: Path
    classes: list[str]
    files: list[tuple[str, int]]
    excluded: list[tuple[str, str]] = field(default_factory=list)
    hidden: int = 0
    bad: dict[int, str] = field(default_factory=dict)
    targets: np.ndarray | None = None

    @property
    def empty_classes(self) -> list[str]:
        """Classes that keep their label but hold no file of this listing."""
        used = {label for _, label in self.files}
        return [name for i, name in enumerate(self.classes) if i not in used]


@dataclass(eq=False)  # one source is one object: no comparison of its fields
class Source:
    """One kind of input, opened (its arguments checked), listed at most once.

    ``paths``: the source files read in place (tar shards, Parquet files; a folder has
    none: each image is its own file), sorted, ``names`` their names relative to ``root``.
    ``labels`` "none": every sample gets label -1 (``labelled`` False), else it is "folders"
    (a sample's own label) or a folder's labels file; ``classes_from``: the exact class list
    (``--classes-from``, read from ``classes_source``); ``on_error``: "skip" leaves out
    what the class list lacks, anything else refuses it; ``workers``: processes that may
    list the files (tar shards, one per process); ``options``: the kind's own settings
    (``label_key``, ``image_column``, ...: None where not given), the ones given recorded
    by ``describe`` (a kind that finds a setting records what it found).

    The attributes whose names start with ``_`` are this process's own (the listing, open
    files, a row group held): a decoding process gets the rest (``__getstate__``)."""

    # the arguments, stored as given (``__post_init__`` tidies them)
    paths: list[str]
    names: list[str]
    root: Path
    labels: str | os.PathLike = "folders"
    classes_from: list[str] | None = None
    classes_source: str = "the class list"
    on_error: str | None = None
    workers: int = 1  # processes that may list the files (``scans``)
    options: dict[str, Any] | None = None
    # what a kind says of itself (class attributes, not arguments)
    kind: ClassVar[str]  # "tar", "parquet": the index's source_kind (a folder's says none)
    noun: ClassVar[str] = "files"  # "tar shards", "Parquet files": for ``span``
    hint: ClassVar[str] = "pack them without labels with --labels none"  # no sample labelled
    unit_size = 1  # the most samples read as one unit (Part); 1: each is read alone
    class_names = None  # the names the class numbers stand for, if given (list[str])
    # this process's own, so never sent (``__getstate__``): a process starts from these
    _listing = None  # made once, by ``listing`` (a Listing)
    _held = {}  # what reading keeps open between samples (a dict: rebound, never changed)

    def __post_init__(self) -> None:
        self.paths, self.names, self.root = list(self.paths), list(self.names), Path(self.root)
        self.labelled = self.labels != "none"
        self.options = {k: v for k, v in (self.options or {}).items() if v is not None}
        # made by ``make_listing``: ``_places`` (position -> (index into ``paths``, where
        # in it)) and ``_digests`` (one per file of ``paths``)

    # -- listing, once

    def listing(self) -> Listing:
        """Every sample, in pack order: made on the first call, then kept."""
        if self._listing is None:
            self._listing = self.make_listing()
        return self._listing

    def scans(self) -> list[Scan]:
        """Every file's ``scan``, in the order of ``paths``."""
        return [self.scan(k) for k in range(len(self.paths))]

    def scan(self, k: int) -> Scan:
        """The samples of file ``k`` of ``paths``, in the order they lie in it."""
        raise NotImplementedError

    def make_listing(self) -> Listing:
        """Every file's samples, in file order, named ``name:key`` (``listing`` calls it
        once); ``_places[i]`` is (file, where in it) of sample i, what ``payload`` sends."""
        samples, bad, excluded = [], {}, []
        scans = self.scans()
        for name, scan in zip(self.names, scans):
            bad.update((len(samples) + i, why) for i, why in scan.bad.items())
            samples += [name if key is None else f"{name}:{key}" for key in scan.keys]
            excluded += [(f"{name}:{member}", why) for member, why in scan.excluded]
        if not samples:
            met = f"; left out: {excluded[0][0]} ({excluded[0][1]})" if excluded else ""
            files = span(self.names[0], self.names[-1], len(self.names), self.noun)
            raise SourceError(f"{self.root}: no samples in {files}{met}")
        self._digests = [scan.digest for scan in scans]
        places = [np.insert(scan.places, 0, k, axis=1) for k, scan in enumerate(scans)]
        self._places = np.concatenate(places)
        raw = np.concatenate([scan.labels for scan in scans])
        hidden = sum(scan.hidden for scan in scans)
        # unlabelled, a scan gives every sample -1: no classes, no labels
        classes, labels = self.numbered(samples, raw, bad) if self.labelled else ([], raw.tolist())
        return Listing(self.root, classes, list(zip(samples, labels)), excluded, hidden, bad=bad)

    # -- what the index and a rerun know of it

    def describe(self) -> dict[str, Any]:
        """What the index's ``packer`` field says about the source (``source``, ``labels``
        and the kind's own options); the run's recipe pins it too. A folder's says no
        ``source_kind``: the recipe (and so the ``command_fingerprint``) folder packs have
        always recorded, so that rerunning the command of an older pack finds it complete
        or resumes it."""
        return {
            "source": span(self.names[0], self.names[-1], len(self.names), self.noun),
            **({"source_kind": self.kind} if self.paths else {}),
            "labels": "samples" if self.labelled else "none",
            **self.options,
            **({"classes_from": printable_path(self.classes_source)} if self.classes_from else {}),
        }

    def identity(self) -> dict[str, Any]:
        """What pins the source files beyond the listing's names and labels: [name, size,
        digest] of each, so that a shard downloaded again, changed, since an interrupted run
        starts the pack over instead of mixing two versions of it; the index keeps it too,
        so that a finished pack's rerun can say which file changed. The digests come from
        what listing read anyway (a shard's headers, a Parquet file's footer): with the
        size they catch a changed file at no further read, and never a modification time,
        which a copy or a second download of the same bytes changes."""
        self.listing()
        pinned = zip(self.names, self.paths, self._digests)
        return {"sources": [[n, os.stat(p).st_size, d] for n, p, d in pinned]}

    def file_of(self, position: int) -> str:
        """The file that holds the sample at ``position`` (an image file, a tar shard, a
        Parquet file): its size and modification time pin the sample (``stamps``, once the
        source is listed)."""
        return self.paths[int(self._places[position, 0])]

    # -- reading

    def feed(self, positions: Sequence[int]) -> Iterator[Payload]:
        """One payload per position, in the order given (ascending): a Skip for a sample
        the listing knows is bad, else what ``payload`` says."""
        bad = self.listing().bad
        return (Skip(bad[p]) if p in bad else self.payload(p) for p in positions)

    def payload(self, position: int) -> Payload:
        """What a decoding process needs to read the sample at ``position`` (small): its
        place, (file, where in it)."""
        return tuple(self._places[position].tolist())

    def __call__(self, payload: Payload) -> str | bytes | Skip:
        """The image a payload stands for: a path to open, the encoded bytes, or why there
        are none (a ``Skip``: it never raises for a bad sample). Here:
        a payload that already is it (an image file's path, bytes read by the parent)."""
        return payload

    def close(self) -> None:
        """Let go of whatever reading kept open between samples."""
        self._held = {}

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    # -- class numbers carried by the samples themselves (tar ``.cls``, a Parquet column)
    #
    # A folder's classes are its sub-folders; shards and Parquet files carry an integer per
    # sample instead, and sometimes the names those integers stand for (a Hugging Face
    # ``ClassLabel``). The rules, the same for every such source:
    #
    # * No label (none found, null, or negative: the Hub's test splits say -1): the sample
    #   is skipped and listed. When no sample has one, that is an error saying how to pack
    #   them unlabelled, rather than a pack of nothing.
    # * With names: the classes are the names, in the dataset's own order; a number past
    #   them is a bad sample. Without names: the classes are "0".."max", or, with
    #   ``--classes-from``, the numbers index that list.
    # * ``--classes-from`` with names maps each name to its place in the list. A class the
    #   list lacks (a name it does not hold, a number past its end) is an error naming it,
    #   or with ``--on-error skip`` its samples are skipped and listed, as a class folder
    #   is left out.

    def numbered(
        self, samples: list[str], raw: np.ndarray, bad: dict[int, str]
    ) -> tuple[list[str], list[int]]:
        """(classes, the label of each sample) of ``samples`` (their names) from ``raw``,
        their class numbers (-1: none), by the rules above, with ``class_names`` where the
        samples carry them. ``bad`` holds the samples known to give no record and gains
        the ones these rules skip (label -1)."""
        names = self.class_names
        if len(raw) and not (raw >= 0).any():
            why = bad.get(0, f"label {raw[0]}")
            raise SourceError(f"{samples[0]}: no sample has a label (this one: {why}); {self.hint}")
        for i in np.flatnonzero(raw < 0).tolist():  # a sample known bad keeps its reason
            bad.setdefault(i, f"no label (label {raw[i]})")
        if names is not None:
            for i in np.flatnonzero(raw >= len(names)).tolist():
                bad.setdefault(i, f"label {raw[i]} is not one of the {len(names)} class names")
        good = ~np.isin(np.arange(len(raw)), list(bad))  # neither known bad nor marked so
        labels = np.where(good, raw, -1)
        classes = self.classes_from
        if classes is None:  # no names ([] included): every number is bad or a class
            classes = names or numbered_classes(raw, good, samples.__getitem__)
        elif names is not None:  # by name: the list's own numbering
            index = {c: k for k, c in enumerate(classes)}
            remap = np.array([index.get(n, -1) for n in names] or [-1], dtype=np.int64)
            labels = np.where(good, remap[np.where(good, raw, 0)], -1)
        lacking = good & ((labels < 0) | (labels >= len(classes)))
        for i in np.flatnonzero(lacking).tolist():  # none without a class list
            shown = f"class {names[raw[i]]!r}" if names is not None else f"label {raw[i]}"
            why = f"{shown} is not in {self.classes_source}"
            if self.on_error != "skip":
                skip = "use --on-error skip to leave its samples out"
                raise SourceError(f"{samples[i]}: {why} ({len(classes)} classes); {skip}")
            bad[i] = why
            labels[i] = -1
        return list(classes), labels.tolist()


def numbered_classes(raw: np.ndarray, good: np.ndarray, name_of: Callable[[int], str]) -> list[str]:
    """Classes "0".."max" for class numbers without names (``raw[good]``, each >= 0), for
    every source whose samples carry numbers (a labels file's too); a wild number is an
    error naming (``name_of``) the first sample that holds it, not a pack of a billion empty
    classes."""
    top, count = int(raw[good].max(initial=-1)), int(good.sum())  # none good: no classes
    if top >= max(1 << 16, 4 * count):
        first = int(np.flatnonzero(good & (raw == top))[0])
        why = f"label {top} would make {top + 1} classes from {count} samples"
        raise SourceError(f"{name_of(first)}: {why}; give the class list with --classes-from")
    return [str(k) for k in range(top + 1)]


# What decoding processes read payloads with: a source, sent without its listing.
Fetch = Source


def reason(exc: BaseException) -> str:
    """Why a read failed, in one line: the operating system's words for a file that does
    not read (``No such file or directory``), else the library's message, its lines joined."""
    return getattr(exc, "strerror", None) or " ".join(str(exc).split())[:200] or type(exc).__name__


@contextmanager
def reading(path: str | os.PathLike, what: str, errors: tuple = (OSError,)) -> Iterator[None]:
    """A source file that does not read, as every kind words it: ``path: what (reason)``,
    one line, where ``errors`` are what the reading library raises for a bad file."""
    try:
        yield
    except errors as exc:
        raise SourceError(f"{path}: {what} ({reason(exc)})") from None


def printable_path(rel: str) -> str:
    """A file name as JSON text can hold it (a non-UTF-8 name keeps its bytes as \\x escapes)."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def span(first: str, last: str, count: int, noun: str) -> str:
    """``first``, or ``first .. last (count nouns)``: many names in one line."""
    return first if count == 1 else f"{first} .. {last} ({count} {noun})"


def stamps(source: Source, positions: Sequence[int]) -> list[tuple[int, int]]:
    """(size, modification time in ns) of the file holding each sample, (0, 0) where there
    is none: a sample whose stamp changed since it was packed is packed again (``Journal.begin``),
    and a finished pack whose stamps changed is not complete."""

    @functools.cache  # each file once: a shard holds many samples
    def stamp(path: str) -> tuple[int, int]:
        with suppress(OSError):
            st = os.stat(path)
            return (st.st_size, st.st_mtime_ns)
        return (0, 0)

    return [stamp(source.file_of(p)) for p in positions]
