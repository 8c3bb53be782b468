"""A folder as a source: its class sub-folders (or every image in it), or a labels file's
list of files under it. ``discover`` lists the folder; a decoding process opens each file
itself, by its path, so nothing but names travels to it, and each image file pins its own
sample for a rerun (its size and time, ``stamps``).

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
import os
import posixpath
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import SourceError
from imgpack.packer import discover
from imgpack.packer.sources.source import Listing, Source, numbered_classes, printable_path, reading
from imgpack.packer.writer import check_target
from imgpack.validate import check_rules, is_int, json_or_none

__all__ = ["FolderSource", "is_labels_file"]

_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_TEXT = {"encoding": "utf-8-sig", "newline": ""}  # a BOM is not part of the header


def is_labels_file(value: str | os.PathLike) -> bool:
    """True when ``--labels`` names a file (by its suffix) rather than a mode."""
    return os.fspath(value).lower().endswith((".csv", ".jsonl"))


def _inside(rel: str) -> bool:
    """A file path relative to SRC that stays inside it, once tidied ('' is '.')."""
    clean = posixpath.normpath(rel)
    return clean not in (".", "..") and not clean.startswith(("/", "../")) and "\0" not in clean


# What a row holds (``check_rules``: "{key} is {value} (or missing), expected {what}"),
# tested in order; an empty label or list of targets is refused with the wrong types.
_NUMBERS = "numbers: a JSON list, or in a CSV cell separated by spaces"
_ROW = (
    ("path", lambda v: isinstance(v, str) and _inside(v), "a file path inside SRC, relative to it"),
    ("label", lambda v: is_int(v) or isinstance(v, str) and v != "", "a class name or an integer"),
    ("targets", lambda v: v is None or (isinstance(v, list) and v != []), _NUMBERS),
)


def _read_rows(path: Path) -> tuple[dict[str, int], list, list, np.ndarray | None]:
    """Every row of a labels file, checked: (relpath -> its line, in row order; the labels;
    each label's integer or None for a name; the (N, K) float32 target vectors or None)."""
    name = path.name
    jsonl = name.lower().endswith(".jsonl")  # there a string is always a name
    # relpath -> its line, in row order; each row's label; every row's targets, in a row;
    # K, as the first row has it (K 0: no targets)
    seen, labels, values, dim, first = {}, [], [], None, None
    errors = (OSError, UnicodeDecodeError, csv.Error)  # not UTF-8 text, a NUL in a CSV
    with reading(path, "cannot read the labels file", errors), open(path, **_TEXT) as f:
        for line, row in _jsonl_rows(f, name) if jsonl else _csv_rows(f, name):
            check_rules(row, _ROW, f"{name}: line {line}: ", SourceError)
            clean = posixpath.normpath(row["path"])  # './a//b.jpg' -> 'a/b.jpg'
            if clean in seen:
                raise _fail(name, line, f"{clean} is already listed on line {seen[clean]}")
            seen[clean] = line
            labels.append(row["label"])
            targets = row.get("targets")  # K numbers, K the first row's (0: none): checked
            k = len(targets or ())
            dim, first = (k, line) if dim is None else (dim, first)
            if targets is not None and k != dim:  # the row to compare with named
                has = f"line {first} has {dim or 'none'}"  # (K 0: that row has no targets)
                raise _fail(name, line, f"{k} target values, {has} (same K per row)")
            values.extend(check_target(f"{name}: line {line}", targets, dim) or ())
    if not seen:
        raise SourceError(f"{name}: no rows after the header")
    numbers = [lab if isinstance(lab, int) else None if jsonl else _int(lab) for lab in labels]
    return seen, labels, numbers, np.array(values, np.float32).reshape(-1, dim) if dim else None


def _csv_rows(f, name: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, its cells by column name) of each CSV row, ``label`` stripped and
    ``targets`` split into its numbers."""
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None:
        raise SourceError(f"{name}: empty file (expected a header row with path,label)")
    cols = [h.strip() for h in header]
    missing = [c for c in ("path", "label") if c not in cols]
    if missing:
        found = ", ".join(map(repr, cols))
        raise _fail(name, 1, f"the header has no {' or '.join(missing)} column (found {found})")
    for cells in reader:
        if not cells or (len(cells) == 1 and not cells[0].strip()):
            continue
        if len(cells) != len(cols):
            raise _fail(name, reader.line_num, f"{len(cells)} fields, the header has {len(cols)}")
        row = dict(zip(cols, cells))
        row["label"] = row["label"].strip()
        if "targets" in row:  # numbers separated by spaces or semicolons
            # (a cell of none stays as written, for the refusal to show it)
            row["targets"] = row["targets"].replace(";", " ").split() or row["targets"]
        yield reader.line_num, row


def _jsonl_rows(f, name: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, its object) of each JSON line: a line that is not JSON (bad syntax, nesting
    deeper than the parser goes) is refused as any other value that is no object."""
    for line, text in enumerate(f, 1):
        if not text.strip():
            continue
        row = json_or_none(text)
        if not isinstance(row, dict):
            raise _fail(name, line, f"expected a JSON object, found {text.strip()!r:.40}")
        yield line, row


def _fail(name: str, line: int, text: str) -> SourceError:
    return SourceError(f"{name}: line {line}: {text}")


def _int(text: str) -> int | None:
    return int(text) if _INT.fullmatch(text) else None


class FolderSource(Source):
    """The images under ``src``: ``labels`` "folders", "none", or a .csv/.jsonl labels file
    (above); ``ignore``: paths never listed (the pack's own files, when they lie inside
    SRC); ``kw``: what every ``Source`` takes (``classes_from``, ``on_error``, ...).
    A payload is the image's path."""

    def __init__(
        self, src: str | os.PathLike, *, ignore: tuple[str | os.PathLike, ...] = (), **kw: Any
    ) -> None:
        root = os.path.abspath(os.fspath(src))
        super().__init__([], [printable_path(os.path.basename(root))], root, **kw)
        self.ignore = ignore
        file = {"labels": "file", "labels_file": printable_path(Path(self.labels).name)}
        self.options = file if is_labels_file(self.labels) else {"labels": str(self.labels)}

    def identity(self) -> dict[str, Any]:
        return {}  # the sorted file names with their labels, and each file's stamp

    def make_listing(self) -> Listing:
        """The folder's listing (``discover``), or its labels file's: the files it lists under
        the folder, in its order, with its target vectors; every row parsed and checked first
        (see the module docstring), then a listed file that is not there is known bad (a
        skipped entry; ``--on-error fail`` stops the run at it, as at any bad sample)."""
        if not is_labels_file(self.labels):
            kw = dict(classes=self.classes_from, on_error=self.on_error)
            kw.update(classes_source=self.classes_source)
            return discover.discover(self.root, labels=str(self.labels), ignore=self.ignore, **kw)
        name, root = Path(self.labels).name, self.root
        seen, labels, numbers, targets = _read_rows(Path(self.labels))
        classes, found = self._classes(name, labels, numbers, list(seen.values()))
        bad = {}
        for k, (rel, line) in enumerate(seen.items()):
            if not os.path.isfile(os.path.join(root, rel)):
                bad[k] = f"listed in {name} line {line}, not found"
        if len(bad) == len(seen):
            raise SourceError(f"{root}: none of the {len(seen)} files {name} lists is there")
        return Listing(root, classes, list(zip(seen, found)), bad=bad, targets=targets)

    def _classes(self, name: str, labels, numbers, lines) -> tuple[list[str], list[int]]:
        """(classes, each label's number): a label is a name of the class list or an integer
        below its length. Without a class list: all integers make classes '0'..'max', else
        the names, sorted."""
        classes, source = self.classes_from, self.classes_source
        if classes is None and all(n is not None for n in numbers):
            for n, line in zip(numbers, lines):
                if n < 0:
                    raise _fail(name, line, f"label {n} is negative (labels are 0..N-1 or names)")
            raw = np.array(numbers, dtype=object)  # Python ints: a label may pass int64
            classes = numbered_classes(raw, raw >= 0, lambda i: f"{name}: line {lines[i]}")
        elif classes is None and any(n is not None for n in numbers):
            k, named = next(i for i, n in enumerate(numbers) if n is not None), numbers.index(None)
            why = f"label {labels[k]} is a number but line {lines[named]} names a class; "
            why += "give a class list (--classes-from) to mix numbers and names"
            raise _fail(name, lines[k], why)
        elif classes is None:
            classes = sorted(set(labels))
        index = {c: i for i, c in enumerate(classes)}
        out = []
        for label, number, line in zip(labels, numbers, lines):
            k = index.get(label, number)  # a class's name, else an integer's own number
            if k is None or not 0 <= k < len(classes):
                shown = ", ".join(classes[:3]) + (", ..." if len(classes) > 3 else "")
                why = f"label {label!r} is not one of the {len(classes)} classes of {source}"
                raise _fail(name, line, f"{why} ({shown}) nor an integer 0..{len(classes) - 1}")
            out.append(k)
        return list(classes), out

    def payload(self, position: int) -> str:
        return os.path.join(self.root, self.listing().files[position][0])

    file_of = payload  # the image file: its path is what a decoding process opens
