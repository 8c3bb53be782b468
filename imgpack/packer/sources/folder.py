"""A folder as a source: its class sub-folders (or every image in it), or a labels file's
list of files under it. ``discover`` and ``labelfile`` do the listing; a decoding process
opens each file itself, by its path, so nothing but names travels to it."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from imgpack.packer import discover, labelfile
from imgpack.packer.sources.source import Data, Listing, Skip, Source, printable_path

__all__ = ["FolderFetch", "FolderSource"]


class FolderSource(Source):
    """The images under ``src``: ``labels`` "folders", "none", or a .csv/.jsonl labels file
    (``labelfile``); ``classes`` the exact class list (``--classes-from``), or None;
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
        self.by_file = labelfile.is_labels_file(labels)
        if not self.by_file and labels not in discover.LABEL_MODES:
            raise ValueError(
                f"labels must be one of {', '.join(discover.LABEL_MODES)} or a .csv/.jsonl "
                f"file, got {os.fspath(labels)!r}"
            )
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
            table = labelfile.read_labels_file(
                self.labels, classes=self.classes, classes_source=self.classes_source
            )
            return labelfile.listing(table, self.src, on_error=self.on_error or "skip")
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
