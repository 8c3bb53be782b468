"""A folder as a source: its class sub-folders (or every image in it), or a labels file's
list of files under it. ``discover`` lists the folder; a decoding process opens each file
itself, by its path, so nothing but names travels to it.

A labels file (``--labels FILE.csv`` / ``FILE.jsonl``) gives labels, and optional target
vectors, from a file list: labelling tools export a table, not a folder tree. Its rules
(docs: README, "Labels from a file"):

* CSV: a header row naming the columns ``path`` and ``label`` (others are ignored);
  JSONL: one JSON object per line with keys ``path`` and ``label``. Blank lines are
  skipped; the error for a bad row names its line number in the file.
* ``path`` is relative to SRC (POSIX separators; ``./`` and ``a//b`` are tidied; an
  absolute path or one leaving SRC with ``..`` is an error; a path twice is an error).
  Only the listed files are packed, in the file's row order; a listed file that is not
  there is skipped and reported (``--on-error fail``: an error).
* ``label`` is a class name or an integer. With a class list (``--classes-from``) a
  name must be in it and an integer must be below its length. Without one, integer
  labels number the classes 0..max, named "0".."max", and names give the classes,
  sorted; mixing the two needs a class list. In JSONL a string is always a name and
  a number always an index.
* Optional target vectors (multi-hot or regression): a column ``targets`` holding K
  numbers separated by spaces or semicolons in one cell (CSV), or a JSON list of K
  numbers (JSONL). Every row must have the same K >= 1; every number must be finite
  as a float32.
"""

from __future__ import annotations

import csv
import json
import math
import os
import posixpath
import re
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import SourceError
from imgpack.packer import discover
from imgpack.packer.sources.source import Data, Listing, Skip, Source, printable_path

__all__ = ["FolderSource", "LabelTable", "is_labels_file", "listing", "read_labels_file"]

LABEL_FILE_SUFFIXES = (".csv", ".jsonl")
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_SPLIT = re.compile(r"[\s;]+")
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def is_labels_file(value: str | os.PathLike) -> bool:
    """True when ``--labels`` names a file (by its suffix) rather than a mode."""
    return os.fspath(value).lower().endswith(LABEL_FILE_SUFFIXES)


@dataclass(frozen=True)
class LabelTable:
    """A parsed labels file: ``rows[i]`` = (relpath, label), from line ``lines[i]``;
    ``targets`` float32 (rows, K) or None."""

    path: Path
    rows: list[tuple[str, int]]
    lines: list[int]
    classes: list[str]
    targets: np.ndarray | None


def read_labels_file(
    path: str | os.PathLike,
    *,
    classes: list[str] | None = None,
    classes_source: str = "the class list",
) -> LabelTable:
    """Parse and validate every row of a labels file (see the module docstring)."""
    path = Path(path)
    name = path.name
    if not is_labels_file(path):
        raise SourceError(f"{name}: a labels file must be .csv or .jsonl")
    try:
        f = open(path, encoding="utf-8-sig", newline="")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise SourceError(f"{path}: labels file not found") from None
    except OSError as exc:
        raise SourceError(f"{path}: cannot read the labels file ({exc.strerror})") from None
    parser = _Parser(name)
    try:
        with f:
            rows = _csv_rows(f, name) if name.lower().endswith(".csv") else _jsonl_rows(f, name)
            for line, rel, label, targets in rows:
                parser.add(line, rel, label, targets)
    except UnicodeDecodeError as exc:
        raise SourceError(f"{name}: not UTF-8 text (byte {exc.start})") from None
    return parser.finish(path, classes, classes_source)


def _csv_rows(f, name: str):
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None:
        raise SourceError(f"{name}: empty file (expected a header row with path,label)")
    cols = [h.strip() for h in header]
    missing = [c for c in ("path", "label") if c not in cols]
    if missing:
        raise SourceError(
            f"{name}: line 1: the header has no {' or '.join(missing)} column "
            f"(found {', '.join(map(repr, cols))})"
        )
    ip, il = cols.index("path"), cols.index("label")
    it = cols.index("targets") if "targets" in cols else None
    for row in reader:
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        line = reader.line_num
        if len(row) != len(cols):
            raise SourceError(f"{name}: line {line}: {len(row)} fields, the header has {len(cols)}")
        targets = None
        if it is not None:
            cell = row[it].strip()
            targets = _SPLIT.split(cell) if cell else []
        yield line, row[ip], row[il].strip(), targets


def _jsonl_rows(f, name: str):
    for line, text in enumerate(f, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise SourceError(f"{name}: line {line}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise SourceError(f"{name}: line {line}: expected a JSON object, found {obj!r:.40}")
        for key in ("path", "label"):
            if key not in obj:
                raise SourceError(f"{name}: line {line}: no {key!r} key")
        if not isinstance(obj["path"], str):
            raise SourceError(f"{name}: line {line}: path should be a string")
        label = obj["label"]
        if isinstance(label, bool) or not isinstance(label, (str, int)):
            raise SourceError(
                f"{name}: line {line}: label should be a class name or an integer, "
                f"found {json.dumps(label):.40}"
            )
        targets = obj.get("targets")
        if targets is not None and not isinstance(targets, list):
            raise SourceError(f"{name}: line {line}: targets should be a list of numbers")
        yield line, obj["path"], label, targets


class _Parser:
    """Collects validated rows; labels are resolved once every row is known."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: list[tuple[str, str | int]] = []
        self.lines: list[int] = []
        self.seen: dict[str, int] = {}
        self.values = array("d")
        self.dim: int | None = None  # K, set by the first row; 0 = no targets
        self.first_line = 0
        self.jsonl = name.lower().endswith(".jsonl")  # there a string is always a name

    def fail(self, line: int, text: str) -> SourceError:
        return SourceError(f"{self.name}: line {line}: {text}")

    def add(self, line: int, rel: str, label: str | int, targets: list[Any] | None) -> None:
        clean = _clean_path(rel)
        if clean is None:
            raise self.fail(line, f"path {rel!r} must be a file path relative to SRC, inside it")
        if clean in self.seen:
            raise self.fail(line, f"{clean} is already listed on line {self.seen[clean]}")
        if label == "":
            raise self.fail(line, "empty label")
        self.seen[clean] = line
        self.rows.append((clean, label))
        self.lines.append(line)
        k = 0 if targets is None else len(targets)
        if self.dim is None:
            self.dim, self.first_line = k, line
            if targets is not None and k == 0:
                raise self.fail(line, "targets holds no numbers")
        elif k != self.dim:
            raise self.fail(
                line, f"{k} target values, line {self.first_line} has {self.dim} (same K per row)"
            )
        for v in targets or ():
            self.values.append(self._number(line, v))

    def _number(self, line: int, v: Any) -> float:
        try:
            if isinstance(v, bool):
                raise TypeError
            x = float(v)
        except (TypeError, ValueError, OverflowError):
            raise self.fail(line, f"target {str(v)[:40]!r} is not a number") from None
        if not math.isfinite(x) or abs(x) > _FLOAT32_MAX:
            raise self.fail(line, f"target {str(v)[:40]!r} is not finite as a float32")
        return x

    def finish(self, path: Path, classes: list[str] | None, source: str) -> LabelTable:
        if not self.rows:
            raise SourceError(f"{self.name}: no rows after the header")
        if classes is None:
            classes, labels = self._own_classes()
        else:
            index = {c: i for i, c in enumerate(classes)}
            labels = [self._resolve(ln, lab, classes, index, source) for (_, lab), ln in self._rl()]
        targets = None
        if self.dim:
            targets = np.frombuffer(self.values, np.float64).reshape(-1, self.dim)
            targets = targets.astype(np.float32)
        rows = [(rel, label) for (rel, _), label in zip(self.rows, labels)]
        return LabelTable(path, rows, self.lines, list(classes), targets)

    def _number_of(self, label: str | int) -> int | None:
        if isinstance(label, int):
            return label
        return None if self.jsonl else _int(label)

    def _rl(self):
        return zip(self.rows, self.lines)

    def _resolve(
        self, line: int, label: str | int, classes: list[str], index: dict[str, int], source: str
    ) -> int:
        if isinstance(label, str) and label in index:
            return index[label]
        number = self._number_of(label)
        if number is not None and 0 <= number < len(classes):
            return number
        shown = ", ".join(classes[:3]) + (", ..." if len(classes) > 3 else "")
        raise self.fail(
            line,
            f"label {label!r} is not one of the {len(classes)} classes of {source} ({shown}) "
            f"nor an integer 0..{len(classes) - 1}",
        )

    def _own_classes(self) -> tuple[list[str], list[int]]:
        """Without a class list: all integers -> classes '0'..'max'; else names, sorted."""
        numbers = [self._number_of(lab) for _, lab in self.rows]
        if all(n is not None for n in numbers):
            limit = max(1 << 16, 4 * len(numbers))
            for n, line in zip(numbers, self.lines):
                if n < 0:
                    raise self.fail(line, f"label {n} is negative (labels are 0..N-1 or names)")
                if n >= limit:
                    raise self.fail(
                        line,
                        f"label {n} would make {n + 1} classes from {len(numbers)} rows; "
                        f"give the class list with --classes-from",
                    )
            return [str(i) for i in range(max(numbers) + 1)], numbers
        for (_, lab), line in self._rl():
            if isinstance(lab, int) or (not self.jsonl and _int(lab) is not None):
                first = next(ln for (_, x), ln in self._rl() if self._number_of(x) is None)
                raise self.fail(
                    line,
                    f"label {lab} is a number but line {first} names a class; "
                    f"give a class list (--classes-from) to mix numbers and names",
                )
        names = sorted({lab for _, lab in self.rows})
        index = {c: i for i, c in enumerate(names)}
        return names, [index[lab] for _, lab in self.rows]


def _int(text: str) -> int | None:
    return int(text) if _INT.fullmatch(text) else None


def _clean_path(rel: str) -> str | None:
    """'./a//b.jpg' -> 'a/b.jpg'; None for '', absolute paths, and paths leaving SRC."""
    if not rel or rel.startswith("/") or "\0" in rel:
        return None
    clean = posixpath.normpath(rel)
    if clean in (".", "..") or clean.startswith("../"):
        return None
    return clean


def listing(table: LabelTable, src: str | os.PathLike, *, on_error: str = "skip") -> Listing:
    """The files of ``table`` as a ``Listing``, those not under ``src`` known bad (listed once,
    by the shard that holds them), with their target vectors (``Listing.targets``) when the
    table has them."""
    root = Path(os.path.abspath(os.fspath(src)))
    if not root.is_dir():
        raise SourceError(f"{root}: source folder does not exist or is not a folder")
    bad = {}
    for k, ((rel, _), line) in enumerate(zip(table.rows, table.lines)):
        if not os.path.isfile(os.path.join(root, rel)):
            why = f"listed in {table.path.name} line {line}, not found"
            if on_error == "fail":
                raise SourceError(f"{rel}: {why} (--on-error fail: nothing written)")
            bad[k] = why
    if len(bad) == len(table.rows):
        raise SourceError(
            f"{root}: none of the {len(table.rows)} files {table.path.name} lists is there"
        )
    targets = None if table.targets is None else np.ascontiguousarray(table.targets)
    return Listing(root, table.classes, list(table.rows), bad=bad, targets=targets)


class FolderSource(Source):
    """The images under ``src``: ``labels`` "folders", "none", or a .csv/.jsonl labels file
    (above); ``classes`` the exact class list (``--classes-from``), or None;
    ``ignore``: paths never listed (the pack's own files, when they lie inside SRC)."""

    unit_size = 1  # each file is opened alone

    def __init__(
        self,
        src: str | os.PathLike,
        *,
        labels: str | os.PathLike = "folders",
        classes: list[str] | None = None,
        classes_source: str = "the class list",
        on_error: str | None = None,
        ignore: tuple[str | os.PathLike, ...] = (),
    ) -> None:
        self.src, self.labels, self.ignore = src, labels, ignore
        self.classes, self.classes_source, self.on_error = classes, classes_source, on_error
        self.by_file = is_labels_file(labels)
        self.kind = "labels file" if self.by_file else "folder"

    def describe(self) -> dict[str, Any]:
        out = {
            "labels": "file" if self.by_file else str(self.labels),
            "source": printable_path(self.listing().root.name),
        }
        if self.by_file:
            out["labels_file"] = printable_path(Path(self.labels).name)
        if self.classes is not None:
            out["classes_from"] = printable_path(self.classes_source)
        return out

    def identity(self) -> dict[str, Any]:
        return {}  # the sorted file names with their labels, as always

    def make_listing(self) -> Listing:
        if self.by_file:
            table = read_labels_file(
                self.labels, classes=self.classes, classes_source=self.classes_source
            )
            return listing(table, self.src, on_error=self.on_error or "skip")
        return discover.discover(
            self.src,
            labels=str(self.labels),
            classes=self.classes,
            unlisted="skip" if self.on_error == "skip" else "error",
            classes_source=self.classes_source,
            ignore=self.ignore,
        )

    def feed(self, positions: Sequence[int]) -> Iterator[str | Skip]:
        files, bad = self.listing().files, self.listing().bad
        for p in positions:
            yield Skip(bad[p]) if p in bad else files[p][0]

    def file_of(self, position: int) -> str:
        listing = self.listing()
        return os.path.join(listing.root, listing.files[position][0])

    def fetcher(self) -> FolderFetch:
        return FolderFetch(str(self.listing().root))


class FolderFetch:
    """A name is a path under the root: the decoding process opens it itself."""

    def __init__(self, root: str) -> None:
        self.root = root

    def __call__(self, payload: str) -> Data:
        return os.path.join(self.root, payload)

    def close(self) -> None:
        pass
