"""Prepare one pack run before any decoding: samples, labels, class list, recipe.

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
from pathlib import Path
from typing import Any

from imgpack import __version__
from imgpack.errors import OutputExistsError, PackError
from imgpack.format.layout import file_bytes, layout_sections, pack_paths, record_nbytes
from imgpack.packer.discover import printable_path
from imgpack.packer.journal import Journal, nothing_to_resume
from imgpack.packer.recipe import build_recipe, recipe_digest
from imgpack.packer.settings import DecodeSettings
from imgpack.packer.sources.source import Listing, Payload, Source, stamps
from imgpack.packer.targets import targets_digest, targets_for
from imgpack.packer.writer import partial_path

__all__ = [
    "PackPlan",
    "prepare_pack",
    "check_output",
    "check_output_name",
    "shard_range",
    "shard_slice",
]


_NONE = object()
# what the index's packer field names, but the recipe compares under its own keys
_NAMED_APART = ("labels", "source", "labels_file", "classes_from")


def shard_range(total: int, num_shards: int, shard_index: int) -> tuple[int, int]:
    """The contiguous slice [start, stop) of the sorted file list that one shard packs."""
    return shard_index * total // num_shards, (shard_index + 1) * total // num_shards


def shard_slice(total: int, num_shards: int, shard_index: int, by: str = "contiguous") -> slice:
    """The files of the sorted list that one shard packs: its contiguous range, or, for
    ``interleaved``, every ``num_shards``-th file from ``shard_index`` (every class in each)."""
    if by == "interleaved":
        return slice(shard_index, total, num_shards)
    return slice(*shard_range(total, num_shards, shard_index))


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


def check_output_name(out_bin: Path) -> None:
    """Refuse an output that could never be written, before anything is made beside it."""
    if out_bin.suffix != ".bin" or out_bin.name == ".bin":
        raise PackError(f"{out_bin}: the output must be named NAME.bin (NAME.json goes beside it)")
    if printable_path(out_bin.name) != out_bin.name:  # the index names its .bin, in UTF-8
        raise PackError(
            f"{printable_path(str(out_bin))}: the output name must be valid UTF-8 "
            f"(the index stores it); rename it"
        )
    if not out_bin.parent.is_dir():
        raise PackError(f"{out_bin.parent}: output folder does not exist")


def check_output(
    out_bin: Path, journal: Journal, *, force: bool, resume: bool | None
) -> dict[str, Any] | None:
    """Refuse outputs that would lose data, under the journal's lock (``journal.created``:
    no interrupted run was here). Returns the index of a finished pack that a rerun of the
    same command may find complete, else None."""
    out_json, _ = pack_paths(out_bin)
    if force:
        return None
    if out_json.exists() and out_bin.exists() and resume is not False:
        try:
            index = json.loads(out_json.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            index = None
        if isinstance(index, dict) and isinstance(index.get("command_fingerprint"), str):
            return index  # compared with this command's once the source is listed
    publishing = out_bin.exists() and not out_json.exists() and not journal.created
    if publishing and resume is not False:
        return None  # killed between the .bin's rename and the .json: the run is redone
    for p in (out_bin, out_json):
        if p.exists():
            raise OutputExistsError(f"{p}: already exists; use --force to overwrite it")
    if resume is False and (partial_path(out_bin).exists() or not journal.created):
        raise OutputExistsError(
            f"{partial_path(out_bin)}: an interrupted pack is here; "
            f"rerun without resume=False to continue it or use --force to start over"
        )
    if resume and journal.created:
        raise nothing_to_resume(out_bin.name)
    return None
