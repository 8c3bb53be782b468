"""Class lists shared between packs: read one from anywhere, digest it, compare two.

A validation pack must number its classes exactly as its training pack does, or
every label after a missing class shifts by one and the evaluation is silently
wrong. ``pack-images --classes-from`` and ``PackedImageDataset(classes_from=)``
both read the reference list here; ``pack-images info`` prints its digest so two
packs can be compared by eye. Stdlib, the format and the manifest only: both the
packer and the reader use it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from itertools import zip_longest
from pathlib import Path
from typing import Any

from imgpack.errors import ClassMismatchError, FormatError, InvalidArgumentError
from imgpack.format.index import read_index
from imgpack.shards import is_manifest, read_manifest
from imgpack.validate import read_text

__all__ = ["read_class_list", "class_digest", "check_same_classes"]


def read_class_list(source: str | os.PathLike) -> list[str]:
    """The class names, in label order, of a pack (.bin or .json), a manifest, or a text
    file with one class per line (blank lines ignored; a name twice is an error). A text
    file's names are stripped of surrounding whitespace and a leading BOM, as editors and
    ``echo`` leave them: "cat " never matches the folder ``cat``, which would fail late."""
    path = Path(source)
    if path.suffix in (".bin", ".json"):
        try:
            if is_manifest(path):
                return read_manifest(path)["classes"]
            return list(read_index(path).classes)
        except FormatError as exc:
            raise InvalidArgumentError(f"cannot take the classes from {path}: {exc}") from None
    # utf-8-sig: a leading BOM, as some editors write, is not part of the first name
    text = read_text(path, InvalidArgumentError, what="class list", encoding="utf-8-sig")
    first: dict[str, int] = {}  # each name's line, in the order of the file
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line in first:
            raise InvalidArgumentError(
                f"{path}: line {number}: class {line!r} is already on line {first[line]}"
            )
        if line:
            first[line] = number
    if not first:
        raise InvalidArgumentError(f"{path}: no class names (one per line expected)")
    return list(first)


def class_digest(classes: Sequence[str]) -> str:
    """First 12 hex digits of the SHA-256 of the list as compact ASCII JSON: equal digests,
    equal lists (names and order)."""
    text = json.dumps(list(classes), ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:12]


def check_same_classes(classes: Sequence[str], other: Any, *, what: str = "this pack") -> None:
    """Raise ``ClassMismatchError`` (one line, the first difference) unless ``classes``
    equal those of ``other`` (a path, a dataset with ``.classes``, or a list of names)."""
    if isinstance(other, (str, os.PathLike)):
        theirs, where = read_class_list(other), Path(other).name
    elif hasattr(other, "classes"):
        theirs, where = list(other.classes), type(other).__name__
    elif isinstance(other, Sequence) and all(isinstance(c, str) for c in other):
        theirs, where = list(other), "the given class list"
    else:
        raise InvalidArgumentError(
            f"classes_from takes a pack, manifest or class-list file, a dataset or a list of "
            f"names, not {type(other).__name__}"
        )
    mine = list(classes)
    if mine == theirs:
        return
    # each label's name on both sides ("nothing" past the shorter list): the first that differs
    pairs = enumerate(zip_longest(map(repr, mine), map(repr, theirs), fillvalue="nothing"))
    k, (here, there) = next((k, pair) for k, pair in pairs if pair[0] != pair[1])
    raise ClassMismatchError(
        f"{what} has other classes than {where}: {len(mine)} here ({class_digest(mine)}), "
        f"{len(theirs)} there ({class_digest(theirs)}); label {k} is {here} here, {there} there"
    )
