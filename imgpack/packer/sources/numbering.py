"""Class numbers carried by the samples themselves (tar ``.cls``, a Parquet label column).

A folder's classes are its sub-folders; shards and Parquet files carry an integer per
sample instead, and sometimes the names those integers stand for (a Hugging Face
``ClassLabel``). The rules, the same for every such source:

* No label (none found, null, or negative: the Hub's test splits say -1): the sample is
  skipped and listed. When no sample has one, that is an error saying how to pack them
  unlabelled, rather than a pack of nothing.
* With names: the classes are the names, in the dataset's own order; a number past them is
  a bad sample. Without names: the classes are "0".."max", or, with ``--classes-from``, the
  numbers index that list.
* ``--classes-from`` with names maps each name to its place in the list. A class the list
  lacks (a name it does not hold, a number past its end) is an error naming it, or with
  ``--on-error skip`` its samples are skipped and listed, as a class folder is left out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from imgpack.errors import SourceError

__all__ = ["number_labels"]


def number_labels(
    raw: np.ndarray,
    bad: dict[int, str],
    *,
    names: list[str] | None,
    classes_from: list[str] | None,
    classes_source: str,
    on_error: str | None,
    name_of: Callable[[int], str],
    unlabelled_hint: str,
) -> tuple[list[str], np.ndarray]:
    """(classes, labels): ``raw`` int64 class numbers, one per sample, with ``bad`` holding
    the samples that already give no record; ``bad`` gains the ones these rules skip (their
    label becomes -1). ``name_of(i)`` names sample i in errors."""
    raw = np.asarray(raw, dtype=np.int64)
    good = np.ones(len(raw), dtype=bool)
    if bad:
        good[np.fromiter(bad, dtype=np.int64, count=len(bad))] = False
    if len(raw) and not (raw >= 0).any():
        why = bad.get(0, f"label {int(raw[0])}")
        raise SourceError(
            f"{name_of(0)}: no sample has a label (this one: {why}); {unlabelled_hint}"
        )
    for i in np.flatnonzero(good & (raw < 0)).tolist():
        bad[i] = f"no label (label {int(raw[i])})"
    good &= raw >= 0
    if names is not None:
        past = good & (raw >= len(names))
        for i in np.flatnonzero(past).tolist():
            bad[i] = f"label {int(raw[i])} is not one of the {len(names)} class names"
        good &= ~past
    labels = np.where(good, raw, -1)
    if classes_from is None:
        return (names if names is not None else _numbered(raw, good, name_of)), labels
    if names is not None:  # by name: the list's own numbering
        index = {c: k for k, c in enumerate(classes_from)}
        remap = np.array([index.get(n, -1) for n in names] or [-1], dtype=np.int64)
        labels = np.where(good, remap[np.where(good, raw, 0)], -1)
    lacking = good & ((labels < 0) | (labels >= len(classes_from)))
    if lacking.any():
        first = int(np.flatnonzero(lacking)[0])
        what = (
            f"class {names[raw[first]]!r} (label {int(raw[first])})"
            if names is not None
            else f"label {int(raw[first])}"
        )
        if on_error != "skip":
            raise SourceError(
                f"{name_of(first)}: {what} is not in {classes_source} "
                f"({len(classes_from)} classes); use --on-error skip to leave its samples out"
            )
        for i in np.flatnonzero(lacking).tolist():
            shown = f"class {names[raw[i]]!r}" if names is not None else f"label {int(raw[i])}"
            bad[i] = f"{shown} is not in {classes_source}"
        labels = np.where(lacking, -1, labels)
    return list(classes_from), labels


def _numbered(raw: np.ndarray, good: np.ndarray, name_of: Callable[[int], str]) -> list[str]:
    """Classes "0".."max" for numbers without names; a wild number is an error, not a
    pack of a billion empty classes."""
    if not good.any():
        return []
    top = int(raw[good].max())
    count = int(good.sum())
    if top >= max(1 << 16, 4 * count):
        first = int(np.flatnonzero(good & (raw == top))[0])
        raise SourceError(
            f"{name_of(first)}: label {top} would make {top + 1} classes from {count} "
            f"samples; give the class list with --classes-from"
        )
    return [str(k) for k in range(top + 1)]
