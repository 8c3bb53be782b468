"""What a pack run tells people when it ends: totals, and everything that did not go in."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgpack.packer.discover import left_out_counts
from imgpack.packer.inspect import human_bytes, source_unit

__all__ = ["PackSummary", "progress_bar"]


@dataclass
class PackSummary:
    """What one ``pack_folder`` run did; ``index`` is the JSON index as written, which the
    totals are read from.

    ``excluded``/``hidden``: what the walk of SRC left out (listed / only counted);
    ``empty_classes``: classes that kept their label with no image; ``restarted``:
    why an interrupted run was discarded; ``complete``: the pack was already there,
    made by the same command, and nothing was done.
    """

    out_bin: Path
    index: dict[str, Any]
    seconds: float
    processed: int
    resumed: int
    empty_classes: list[str] = field(default_factory=list)
    restarted: str | None = None
    complete: bool = False

    @property
    def out_json(self) -> Path:
        return self.out_bin.with_suffix(".json")

    @property
    def count(self) -> int:
        return self.index["count"]

    @property
    def skipped(self) -> list[dict[str, str]]:
        return self.index["skipped"]

    @property
    def bytes(self) -> int:
        return self.index["data_file_bytes"]

    @property
    def images_per_s(self) -> float:
        return self.processed / self.seconds if self.seconds > 0 else 0.0

    @property
    def excluded(self) -> list[dict[str, str]]:
        return self.index.get("excluded", [])

    @property
    def hidden(self) -> int:
        return self.index.get("excluded_hidden", 0)

    def lines(self, *, show_skipped: int = 5) -> list[str]:
        """A closing summary for people: totals, then what did not go in, and why."""
        if self.complete:
            out = [
                f"{self.out_bin.name} is already complete ({_n(self.count, 'image')}, "
                f"{human_bytes(self.bytes)}; same source and settings): nothing to do"
            ]
        else:
            out = [
                f"packed {_n(self.count, 'image')} into {self.out_bin.name} "
                f"({human_bytes(self.bytes)}), skipped {len(self.skipped)}; "
                f"{_n(self.processed, source_unit(self.index.get('packer') or {}))} "
                f"in {self.seconds:.1f} s, "
                f"{self.images_per_s:.1f} images/s"
                + (f" (resumed after {self.resumed})" if self.resumed else "")
            ]
        jpeg = self.index.get("jpeg")
        if isinstance(jpeg, dict):
            kept = jpeg.get("stored_as_is", 0)
            out.append(
                f"jpeg quality {jpeg.get('quality')}: {_n(kept, 'record')} stored as they came "
                f"(the source's own JPEG), {_n(self.count - kept, 'record')} encoded"
            )
        if self.skipped:
            shown = _some([f"{s['path']} ({s['reason']})" for s in self.skipped], show_skipped)
            out.append(f"skipped: {shown}; see {self.out_json.name} 'skipped'")
        counts = left_out_counts([(e["path"], e["reason"]) for e in self.excluded])
        parts = [f"{n} {_ONE.get(what, what) if n == 1 else what}" for what, n in counts.items()]
        if parts:
            out.append(f"left out: {', '.join(parts)}; see {self.out_json.name} 'excluded'")
        if self.hidden:
            hidden = _n(self.hidden, "hidden or system file")
            out.append(f"left out: {hidden} (.*, Thumbs.db, ...)")
        if self.empty_classes:
            shown = _some(self.empty_classes, 10)
            out.append(f"classes with no images (their labels are kept): {shown}")
        return out


def _some(items: list[str], shown: int) -> str:
    """The first ``shown`` items, and how many more: a long list in one line."""
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def _n(count: int, noun: str) -> str:
    """'1 image', '2 images': a summary line reads as English at any count."""
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


# the groups of left_out_counts, as one of them reads
_ONE = {
    "images outside class folders": "image outside class folders",
    "broken symlinks": "broken symlink",
    "class folders not in the class list": "class folder not in the class list",
    "not regular files": "not a regular file",
}


def progress_bar(progress: bool | None, total: int, *, initial: int = 0, unit: str, desc=None):
    """A tqdm bar on stderr, drawn when ``progress`` is True (None: when stderr is a
    terminal); not drawn, it is a no-op with the same methods, and starts no thread."""
    from tqdm import tqdm  # when a run starts: keeps `import imgpack.packer.pack` light

    shown = sys.stderr.isatty() if progress is None else progress
    return tqdm(
        total=total,
        initial=initial,
        unit=unit,
        desc=desc,
        file=sys.stderr,
        smoothing=0.05,
        dynamic_ncols=True,
        disable=not shown,
    )
