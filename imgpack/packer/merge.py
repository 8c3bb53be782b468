"""``pack-images merge OUT.manifest.json SHARD.bin ...``: many packs as one dataset, no copy.

Shards are usually packed on many machines at once (``--num-shards N --shard-index I``);
merging only reads their indexes, checks that they belong together (``imgpack.shards``)
and writes a small manifest that ``PackedImageDataset`` opens like a pack. The order on
the command line is the dataset's global record order (a shell glob sorts by name:
zero-pad shard numbers); for ``--shard-by interleaved`` shards that is not the source
order (files 0, N, 2N, ... of shard 0 come first), which only a sequential reader notices.
The manifest is written atomically and names the shards relative to its own folder.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from imgpack.errors import OutputExistsError, PackError
from imgpack.format.index import read_index
from imgpack.format.write import write_json_atomic
from imgpack.shards import MANIFEST_FORMAT, build_manifest, check_shards
from imgpack.validate import json_or_none

__all__ = ["merge_packs"]


def merge_packs(
    out: str | os.PathLike,
    shards: Sequence[str | os.PathLike],
    *,
    allow_partial: bool = False,
    force: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """Check ``shards`` (packs, by .bin or .json) belong together; write the manifest ``out``
    and return it, with the warnings.

    Missing slices of a sharded source are refused unless ``allow_partial`` (then they
    are returned as warnings and the manifest says ``"partial": true``).
    """
    out = Path(out)
    # refuse a manifest that could not be written, or would replace anything but an older
    # manifest (``--force``): a shard's own index among them
    if out.suffix != ".json" or out.name == ".json":
        raise PackError(f"{out}: the manifest must be named NAME.json (NAME.manifest.json)")
    if not out.parent.is_dir():
        raise PackError(f"{out.parent}: output folder does not exist")
    if out.exists():
        raw = json_or_none(out.read_bytes()) if out.is_file() else None
        if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
            raise OutputExistsError(
                f"{out}: exists and is not a manifest; refusing to overwrite it"
            )
        if not force:
            raise OutputExistsError(f"{out}: already exists; use --force to overwrite it")
    indexes = [read_index(p) for p in shards]
    hint = "merge every shard, or pass --allow-partial"  # what a missing shard's error says
    warnings = check_shards(indexes, list(map(str, shards)), allow_partial=allow_partial, hint=hint)
    manifest = build_manifest(out, indexes, partial=bool(warnings))
    write_json_atomic(out, manifest)
    return manifest, warnings
