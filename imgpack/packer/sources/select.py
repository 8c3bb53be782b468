"""From ``pack-images SRC... OUT.bin``'s sources to one ``Source``: expand, sort, tell the kind.

SRC is a folder, or one or more WebDataset tar shards or Parquet files: paths, shell globs
(``'shards/*.tar'``, expanded here when the shell did not) and WebDataset brace ranges
(``'train-{000000..000146}.tar'``, zero padding kept, and ``{a,b}`` lists). The files are
packed in sorted order, whatever order they were named in, so that every machine packing a
shard of them agrees on the listing. The kind comes from the extension (``.tar``,
``.parquet``) or from being a folder; one kind per pack. Every name a range makes must
exist, or, when it is a glob (``'t*/train-{000000..000009}.tar'``), match at least one
file (a missing shard is a partial download, not a smaller dataset); a pattern that
matches nothing, a file of no kind, a mix of kinds: each is one line naming the file.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from imgpack.classlist import read_class_list
from imgpack.errors import InvalidArgumentError, SourceError
from imgpack.packer.sources.folder import FolderSource, is_labels_file
from imgpack.packer.sources.parquet import ParquetSource
from imgpack.packer.sources.source import SOURCE_KINDS, Source, printable_path
from imgpack.packer.sources.tar import TarSource

__all__ = ["expand_braces", "open_source", "resolve_sources"]

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?[0-9]+)\.\.(-?[0-9]+)", re.ASCII)
_MAGIC = re.compile(r"[*?[]")
_MAX_NAMES = 10_000_000
_ONE = {"folder": "a folder", "tar": "a tar shard", "parquet": "a Parquet file"}
_MANY = {"folder": "a folder", "tar": "tar shards", "parquet": "Parquet files"}
_OPTIONS = {"image_column": "parquet", "label_column": "parquet", "label_key": "tar"}
_SOURCES = {"tar": TarSource, "parquet": ParquetSource}


def expand_braces(text: str) -> list[str]:
    """WebDataset's (and bash's) brace expansion: ``a{01..03}b`` -> a01b a02b a03b, with
    the zero padding of the written numbers; ``{x,y}`` -> x y; several braces multiply.
    Braces that hold neither stay as written."""
    parts = _BRACE.split(text)  # the text between braces, then what each brace holds
    choices = [[part] if k % 2 == 0 else _brace(text, part) for k, part in enumerate(parts)]
    return ["".join(names) for names in itertools.product(*choices)]


def _brace(text: str, body: str) -> list[str]:
    """What ``{body}`` in ``text`` stands for: a range's numbers, a list's items, or itself."""
    numbers = _RANGE.fullmatch(body)
    if numbers is None:
        return body.split(",") if "," in body else ["{" + body + "}"]
    a, b = numbers[1], numbers[2]
    lo, hi = int(a), int(b)
    if abs(hi - lo) >= _MAX_NAMES:
        raise InvalidArgumentError(f"{text}: the range {{{body}}} names too many files")
    padded = any(len(v.lstrip("-")) > 1 and v.lstrip("-")[0] == "0" for v in (a, b))
    width = max(len(a), len(b)) if padded else 0
    step = 1 if hi >= lo else -1
    return [f"{k:0{width}d}" for k in range(lo, hi + step, step)]


def resolve_sources(args: Sequence[str | os.PathLike]) -> list[str]:
    """Every file or folder ``args`` name, as absolute paths, sorted, each once. A plain
    name that is not there and has no extension is a missing folder."""
    if not args:
        raise InvalidArgumentError("no source given (a folder, .tar shards or .parquet files)")
    found: set[str] = set()
    for arg in args:
        text = os.fspath(arg)
        if os.path.lexists(text):  # a name as it is, even one with braces or brackets
            found.add(os.path.abspath(text))
            continue
        names = expand_braces(text)
        if names == [text] and not _MAGIC.search(text):  # a plain name that is not there
            if os.path.splitext(text)[1]:
                raise SourceError(f"{text}: no such file or folder")
            raise SourceError(f"{os.path.abspath(text)}: source folder does not exist")
        hits = [glob.glob(name) for name in names]
        missing = [name for name, hit in zip(names, hits) if not hit]
        if len(missing) == len(names):
            raise SourceError(f"{text}: no file matches this pattern")
        if missing:  # every name a range makes must match a file
            counted = f"missing: {len(missing)} of its {len(names)} files"
            raise SourceError(f"{missing[0]}: no such file (named by {text}; {counted})")
        found.update(os.path.abspath(h) for hit in hits for h in hit)
    return sorted(found)


def _kind(path: str) -> str:
    """A folder, or a file's kind by its extension. A compressed tar is none (shards are read
    in place): its refusal names it and the fix, as the one a user most often meets."""
    kind = "folder" if os.path.isdir(path) else SOURCE_KINDS.get(os.path.splitext(path)[1].lower())
    if kind is None:
        why = "not a source pack-images reads (a folder, WebDataset .tar shards or .parquet files)"
        if path.lower().endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")):
            why = "a compressed tar; shards are read in place, so they must be plain .tar"
            why += " (decompress the shard, e.g. gunzip, first)"
        raise SourceError(f"{path}: {why}")
    return kind


def open_source(
    src: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    labels: str | os.PathLike = "folders",
    classes_from: str | os.PathLike | None = None,
    on_error: str | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    label_key: str | None = None,
    ignore: tuple[str | os.PathLike, ...] = (),
    workers: int = 1,
) -> Source:
    """The ``Source`` for ``src`` (see the module docstring), its options checked: labels
    "folders" (for shards and Parquet: each sample's own), "none" or a labels file (folders
    only); ``image_column``/``label_column`` for Parquet, ``label_key`` for tar shards;
    ``workers``: processes that may list the files (tar shards, one per process)."""
    paths = resolve_sources([src] if isinstance(src, (str, os.PathLike)) else list(src))
    kinds = {p: _kind(p) for p in paths}
    kind = kinds[paths[0]]
    other = next((p for p in paths[1:] if kinds[p] != kind or kind == "folder"), None)
    if other is not None:  # a folder goes with nothing else, a second folder included
        mixed = f"{_ONE[kinds[other]]}, while {os.path.basename(paths[0])} is {_ONE[kind]}"
        raise SourceError(f"{other}: {mixed}; pack one folder, or .tar shards, or .parquet files")
    options = dict(image_column=image_column, label_column=label_column, label_key=label_key)
    _check_options(kind, labels, classes_from, options)
    common: dict[str, Any] = dict(labels=labels, on_error=on_error)
    if classes_from is not None:  # the class list, and the name of the file it came from
        classes = read_class_list(classes_from)
        if not classes:  # a text list cannot be empty: this is an unlabelled pack
            why = "holds no classes (packed with --labels none); use a labelled pack or class list"
            raise InvalidArgumentError(f"{classes_from}: {why}")
        common.update(classes_from=classes, classes_source=Path(classes_from).name)
    if kind == "folder":
        return FolderSource(paths[0], ignore=ignore, **common)
    root = Path(os.path.commonpath([os.path.dirname(p) for p in paths]))
    names = [printable_path(os.path.relpath(p, root).replace(os.sep, "/")) for p in paths]
    # another kind's options are None here (refused otherwise), so the source records none
    return _SOURCES[kind](paths, names, root, workers=workers, options=options, **common)


def _check_options(kind, labels, classes_from, options: dict[str, str | None]) -> None:
    """Options that say where labels are, given with one that says there are none, and
    options of one kind given with another: one line, before anything is read. The one
    place that checks them, for every kind."""
    if classes_from is not None and "none" in (labels, options["label_column"]):
        unlabelled = "a pack without labels (--labels none or --label-column none) takes none"
        raise InvalidArgumentError(f"--classes-from numbers labels; {unlabelled}")
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if labels == "none" and key != "image_column" and value not in (None, "none"):
            why = "says where the labels are, and --labels none packs none; drop one of them"
            raise InvalidArgumentError(f"{flag} {value} {why}")
        if value is not None and kind != _OPTIONS[key]:
            needs = _MANY[_OPTIONS[key]]
            raise InvalidArgumentError(f"{flag} is for {needs}, and the source is {_MANY[kind]}")
    if kind != "folder" and is_labels_file(labels):
        carry = f"{kind} sources carry their labels (pack them without labels with --labels none)"
        listed = f"--labels {Path(labels).name} lists files under a folder"
        raise InvalidArgumentError(f"{listed}; {carry}")
