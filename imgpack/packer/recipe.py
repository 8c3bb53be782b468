"""A run's recipe: everything that decides a pack's bytes, and how two differ, in the user's words.

A resumed run must have the interrupted one's recipe (the journal's first line holds it,
under the on-disk key ``"fingerprint"``); a finished pack records its ``recipe_digest``
(the index's ``"command_fingerprint"``) so that a rerun can find it complete.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["build_recipe", "recipe_diff", "recipe_digest", "sources_diff"]

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
