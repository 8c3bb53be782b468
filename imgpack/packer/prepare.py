"""Prepare one pack run before any decoding: samples, labels, class list, target vectors,
and the recipe that pins them.

The listing comes from the run's source (``sources``: a folder, a labels file, tar
shards, Parquet files), numbered by the class list of ``--classes-from`` when given; a
shard takes its cut of it. The recipe pins everything that decides the pack's bytes
(the source's own identity included), so a rerun of the same command can tell
"continue" (or "already done") from "start over", and say which setting changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from imgpack import __version__
from imgpack.errors import PackError, SourceError
from imgpack.format.layout import file_bytes, layout_sections, record_nbytes
from imgpack.packer.decode import DecodeSettings
from imgpack.packer.sources.source import Listing, Payload, Source, printable_path, stamps
from imgpack.shards import shard_slice

__all__ = [
    "PackPlan",
    "prepare_pack",
    "build_recipe",
    "recipe_diff",
    "recipe_digest",
    "sources_diff",
    "targets_for",
    "targets_digest",
]


_NONE = object()
# what the index's packer field names, but the recipe compares under its own keys
_NAMED_APART = ("labels", "source", "labels_file", "classes_from")


@dataclass
class PackPlan:
    """This shard's samples: ``files[i]`` (name, label) is the listing's ``positions[i]``,
    ``targets`` their vectors (K floats each, or None); what the index and the journal
    record about them; and the ``source`` whose ``feed`` gives their payloads."""

    source: Source
    settings: DecodeSettings
    listing: Listing
    positions: range
    files: list[tuple[str, int]]
    targets: list[tuple[float, ...]] | None
    packer: dict[str, Any]
    extra: dict[str, Any]
    recipe: dict[str, Any]
    needed: int  # bytes the finished pack takes, with a margin
    stamps: list[tuple[int, int]]  # (size, mtime) of the file holding each sample

    @property
    def target_dim(self) -> int:
        return len(self.targets[0]) if self.targets else 0

    @property
    def recipe_digest(self) -> str:
        return self.extra["command_fingerprint"]

    def samples(self, start: int = 0) -> Iterator[tuple[int, str, int, Payload]]:
        """(i, name, label, payload) of ``files[start:]``, the payloads read as they are
        asked for."""
        payloads = iter(self.source.feed(self.positions[start:]))
        for i in range(start, len(self.files)):
            payload = next(payloads, _NONE)
            if payload is _NONE:  # a source's bug, never silently a shorter pack
                raise PackError(f"{self.files[i][0]}: the {self.source.kind} source gave no data")
            yield (i, *self.files[i], payload)


def prepare_pack(
    source: Source,
    settings: DecodeSettings,
    *,
    on_error: str | None = None,
    num_shards: int = 1,
    shard_index: int = 0,
    shard_by: str = "contiguous",
    targets: Mapping[str, Sequence[float]] | None = None,
) -> PackPlan:
    """List what to pack and pin it (see the module docstring). ``on_error`` is pinned
    only: a sample known to be bad from the listing (``listing.bad``) comes to the loop as
    a Skip, so that "fail" stops at the first bad sample in pack order, whether the listing
    or its decoding found it. ``targets``: name -> target vector (``pack_folder(targets=)``),
    or a labels file's column."""
    listing = source.listing()
    total = len(listing.files)
    cut = shard_slice(total, num_shards, shard_index, shard_by)
    positions = range(total)[cut]
    files = listing.files[cut]
    about = source.describe()
    if listing.targets is not None:
        if targets is not None:
            table = about.get("labels_file", "the labels file")
            raise ValueError(f"{table} has a targets column: pass no targets=")
        file_targets = [tuple(row) for row in listing.targets[cut].tolist()]
    else:
        file_targets = targets_for(files, targets)
    packer: dict[str, Any] = {"imgpack_version": __version__, **settings.to_json(), **about}
    shard: dict[str, Any] = {"index": shard_index, "count": num_shards, "source_files": total}
    if shard_by == "contiguous":  # as before --shard-by existed: a missing "by" means this
        shard["source_range"] = [cut.start, cut.stop]
    else:
        shard.update(by=shard_by, source_stride=[shard_index, num_shards])
    more: dict[str, Any] = {"class_count": len(listing.classes)}
    more.update({k: v for k, v in about.items() if k not in _NAMED_APART})
    identity = source.identity()
    more.update(identity)
    recipe = build_recipe(
        settings=settings.to_json(),
        labels=about["labels"],
        on_error=on_error or "skip",
        shard=(shard_index, num_shards),
        shard_by=shard_by,
        classes=listing.classes,
        files=files,
        version=__version__,
        targets=targets_digest(file_targets),
        extra=more,
    )
    file_stamps = stamps(source, positions)
    extra = {
        "source_stamps": hashlib.sha256(json.dumps(file_stamps).encode()).hexdigest(),
        "shard": shard,
        "excluded": [{"path": printable_path(p), "reason": r} for p, r in listing.excluded],
        "excluded_hidden": listing.hidden,
        "command_fingerprint": recipe_digest(recipe),
        **identity,  # a finished pack's rerun names the source file that changed
    }
    paths_bytes = sum(len(rel.encode("utf-8", "surrogateescape")) for rel, _ in files)
    # at most: records of fit packs may be smaller than the bound; jpeg records have no
    # fixed size, and photographs at any quality up to 95 take well under raw's
    codec = "raw" if settings.codec == "jpeg" else settings.codec
    record_bytes = record_nbytes(codec, settings.width, settings.height, settings.channels)
    target_dim = len(file_targets[0]) if file_targets else 0
    needed = (
        file_bytes(layout_sections(len(files), len(files) * record_bytes, paths_bytes))
        + len(files) * (48 + 4 * target_dim)  # the record fields
        + 65536
        + 200 * len(listing.classes)
    )
    return PackPlan(
        source,
        settings,
        listing,
        positions,
        files,
        file_targets,
        packer,
        extra,
        recipe,
        needed,
        file_stamps,
    )


# -- the recipe: everything that decides a pack's bytes, and how two differ, in the
# user's words. A resumed run must have the interrupted one's (the journal's first line holds
# it, under the on-disk key "fingerprint"); a finished pack records its digest (the index's
# "command_fingerprint") so that a rerun can find it complete.

# recipe key -> how the user spells it, for "settings differ" messages
_FLAGS = {
    "size": "--size",
    "resize": "--resize",
    "filter": "--filter",
    "labels": "--labels",
    "on_error": "--on-error",
    "shard": "--shard-index/--num-shards",
    "shard_by": "--shard-by",
    "channels": "--channels",
    "crop_ratio": "--crop-ratio",
    "targets": "the target vectors",
    "pillow": "Pillow version",
    "imgpack_version": "imgpack version",
    "source_kind": "the kind of source",
    "label_key": "--label-key",
    "image_column": "--image-column",
    "label_column": "--label-column",
}
# keys that choose which source files are packed: compared before the file list, so that
# a changed option is named as such rather than reported as a changed source folder
_SELECTING = ("labels", "shard_by", "shard")
# what a key missing from an older journal meant
_DEFAULTS = {"shard_by": "contiguous"}


def build_recipe(
    *,
    settings: dict[str, Any],
    labels: str,
    on_error: str,
    shard: tuple[int, int],
    shard_by: str = "contiguous",
    classes: list[str],
    files: list[tuple[str, int]],
    version: str,
    targets: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything that decides the pack's bytes, except the worker count (which never does).

    ``targets`` is a digest of the files' target vectors (None: the pack has none);
    ``extra``: more such facts (the class count), compared like the rest.
    """
    h = hashlib.sha256()
    for rel, label in files:
        h.update(f"{label}\t{rel}\n".encode("utf-8", "surrogateescape"))
    return {
        **settings,
        "labels": labels,
        "on_error": on_error,
        "shard": list(shard),
        "shard_by": shard_by,
        "classes": hashlib.sha256(
            "\n".join(classes).encode("utf-8", "surrogateescape")
        ).hexdigest(),
        "files": len(files),
        "files_sha256": h.hexdigest(),
        "targets": targets,
        "imgpack_version": version,
        **(extra or {}),
    }


def _show(key: str, value: Any) -> str:
    if key == "size" and isinstance(value, list) and len(value) == 2:
        return f"{value[0]}x{value[1]}"
    if key == "targets":  # a digest: its first digits tell two apart
        return value[:12] if isinstance(value, str) else "none"
    if key == "shard" and isinstance(value, list) and len(value) == 2:
        return f"{value[0]} of {value[1]}"
    return json.dumps(value)


def recipe_diff(then: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The first difference between two recipes, worded for the user; None if equal."""
    then = {**_DEFAULTS, **then}
    for key in _SELECTING:
        if key in now and then.get(key) != now[key]:
            return _differ(key, then.get(key), now[key])
    changed = sources_diff(then.get("sources"), now.get("sources"))
    if changed is not None:
        return f"the source files changed since the interrupted run ({changed})"
    if then.get("classes") != now["classes"] and "class_count" in now:
        return (
            f"the class list changed since the interrupted run ({then.get('class_count')} "
            f"classes then, {now['class_count']} now: --classes-from or the class folders)"
        )
    what, unit = (
        ("the source files", "samples") if "sources" in now else ("the source folder", "files")
    )
    if then.get("files") != now["files"] or then.get("classes") != now["classes"]:
        return (
            f"{what} changed since the interrupted run "
            f"({then.get('files')} {unit} then, {now['files']} now)"
        )
    if then.get("files_sha256") != now["files_sha256"]:
        return f"{what} changed since the interrupted run (same count, other {unit})"
    for key in now:
        if then.get(key) != now[key]:
            return _differ(key, then.get(key), now[key])
    return None


def sources_diff(then: list | None, now: list | None) -> str | None:
    """Which source file (a tar shard, a Parquet file) is new, gone, or changed, from two
    lists of [name, size, digest] (``sources.source.source_files``); None if they agree."""
    if then == now:
        return None
    before = {n: tuple(rest) for n, *rest in then or []}
    after = {n: tuple(rest) for n, *rest in now or []}
    new = [n for n in after if n not in before]
    gone = [n for n in before if n not in after]
    changed = [n for n in after if n in before and before[n] != after[n]]
    if new:
        return f"{new[0]} is new"
    if gone:
        return f"{gone[0]} is gone"
    if changed and before[changed[0]][0] != after[changed[0]][0]:
        n = changed[0]
        return f"{n}: {before[n][0]:,} bytes then, {after[n][0]:,} now"
    if changed:
        return f"{changed[0]}: the same size, other contents"
    return "the same files in another order"


def _differ(key: str, then: Any, now: Any) -> str:
    return f"settings differ: {_FLAGS.get(key, key)} {_show(key, then)} then, {_show(key, now)} now"


def recipe_digest(recipe: dict[str, Any]) -> str:
    """SHA-256 of a recipe: the index's ``command_fingerprint``."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode("ascii")).hexdigest()


# -- per-record target vectors handed to pack_folder: checked once, in pack order. Paths
# the mapping names but the pack does not hold (other shards, other splits) are ignored;
# the vectors are stored as float32 (the targets record field).

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def targets_for(
    files: list[tuple[str, int]], targets: Mapping[str, Sequence[float]] | None
) -> list[tuple[float, ...]] | None:
    """Each file's target vector, in pack order, as K floats; SourceError names a bad one."""
    if targets is None:
        return None
    out, k = [], None
    for rel, _ in files:
        t = targets.get(rel)
        if t is None:
            raise SourceError(f"{rel}: no target vector given (every file packed needs one)")
        try:
            values = tuple(float(v) for v in t)
        except (TypeError, ValueError):
            raise SourceError(f"{rel}: target vector {t!r} is not a sequence of numbers") from None
        k = len(values) if k is None else k
        if len(values) != k or not values:
            raise SourceError(
                f"{rel}: target vector has {len(values)} values, the first file's has {k}"
            )
        if not all(abs(v) <= _FLOAT32_MAX for v in values):  # False for NaN too
            raise SourceError(f"{rel}: target vector {t!r:.60} is not finite as float32")
        out.append(values)
    return out


def targets_digest(targets: list[tuple[float, ...]] | None) -> str | None:
    """What the run's recipe pins about the target vectors: their float32 bytes."""
    if targets is None:
        return None
    return hashlib.sha256(np.asarray(targets, dtype="<f4").tobytes()).hexdigest()
