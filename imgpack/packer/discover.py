"""Find the images to pack and fix their order and labels, once, before any decoding.

The listing is the pack's index in embryo: record i of the pack is ``files[i]``.
So the order must be a pure function of the folder's contents (never of
``os.scandir`` order, which differs between filesystems), and class numbering
must not depend on which folders happen to hold images.

Rules (torchvision ``ImageFolder`` where it has one, stated here where it has not):

* ``labels="folders"``: the classes are the immediate sub-folders of SRC, sorted
  by name; files lying directly in SRC are ignored. Each class folder is walked
  recursively. A class folder holding no images still gets its label number, so
  the numbering stays stable and every shard of a split agrees on it
  (torchvision raises instead).
* ``labels="none"``: every image under SRC, recursively, with label -1.
* Only names ending in ``IMAGE_EXTENSIONS`` (any letter case) count. Names
  starting with ``.`` (files and folders) are skipped. Symlinks are followed;
  a folder already entered during one walk is not entered again, so a symlink
  loop ends instead of hanging. Broken or looping symlinks are skipped (nothing
  to read); any other unreadable folder is an error, never a silent gap.
* Order: by class (label), then by relative path, compared as Python strings
  (code-point order, case-sensitive) on the POSIX-style path relative to SRC.
  This differs from torchvision only for files nested at mixed depths: it sorts
  ``cat/a/x.jpg`` before ``cat/b.jpg`` where ``os.walk`` order would not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from imgpack.errors import SourceError

__all__ = ["IMAGE_EXTENSIONS", "LABEL_MODES", "Listing", "discover"]

# torchvision.datasets.folder.IMG_EXTENSIONS, matched case-insensitively.
IMAGE_EXTENSIONS: tuple[str, ...] = (
    ".jpg",
    ".jpeg",
    ".png",
    ".ppm",
    ".bmp",
    ".pgm",
    ".tif",
    ".tiff",
    ".webp",
)

LABEL_MODES = ("folders", "none")


@dataclass(frozen=True)
class Listing:
    """What to pack: ``files[i]`` is (relpath under ``root``, label) of record i."""

    root: Path
    classes: list[str]
    files: list[tuple[str, int]]


def discover(src: str | os.PathLike, *, labels: str = "folders") -> Listing:
    """List the images under ``src`` in canonical pack order (see the module docstring)."""
    if labels not in LABEL_MODES:
        raise ValueError(f"labels must be one of {', '.join(LABEL_MODES)}, got {labels!r}")
    root = Path(os.path.abspath(os.fspath(src)))
    try:
        st = root.stat()
    except FileNotFoundError:
        raise SourceError(f"{root}: source folder does not exist") from None
    except OSError as exc:
        raise SourceError(f"{root}: cannot read source folder ({exc.strerror})") from None
    if not os.path.isdir(root):
        raise SourceError(f"{root}: source is not a folder")
    root_id = (st.st_dev, st.st_ino)

    if labels == "none":
        found: list[str] = []
        _walk(str(root), "", {root_id}, found)
        if not found:
            raise SourceError(f"{root}: no images found ({_looked_for()}, searched recursively)")
        found.sort()
        return Listing(root=root, classes=[], files=[(path, -1) for path in found])

    classes, loose = _class_folders(root)
    if not classes:
        hint = f"; {loose} images lie directly in it, pack them with labels 'none'" if loose else ""
        raise SourceError(f"{root}: no class folders (expected {root}/<class>/<image>){hint}")
    files: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        found = []
        _walk(os.path.join(root, name), name + "/", {root_id}, found)
        found.sort()
        files.extend([(path, label) for path in found])
    if not files:
        raise SourceError(
            f"{root}: no images found in {len(classes)} class folders ({_looked_for()})"
        )
    return Listing(root=root, classes=classes, files=files)


def _looked_for() -> str:
    return "looked for " + " ".join(IMAGE_EXTENSIONS) + ", any letter case"


def _class_folders(root: Path) -> tuple[list[str], int]:
    """Sorted visible sub-folders of ``root``, and how many images lie loose beside them."""
    classes, loose = [], 0
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir():
                    classes.append(entry.name)
                elif entry.name.lower().endswith(IMAGE_EXTENSIONS):
                    loose += 1
    except OSError as exc:
        raise SourceError(f"{root}: cannot list source folder ({exc.strerror})") from None
    classes.sort()
    return classes, loose


def _walk(folder: str, prefix: str, seen: set[tuple[int, int]], out: list[str]) -> None:
    """Append ``prefix + relpath`` of every image under ``folder`` to ``out`` (unsorted).

    ``seen`` holds (device, inode) of folders already entered, so symlinked
    folders are entered at most once per walk. Iterative: deep trees cannot
    hit the recursion limit.
    """
    try:
        st = os.stat(folder)
    except OSError as exc:
        raise SourceError(f"{folder}: cannot read folder ({exc.strerror})") from None
    seen.add((st.st_dev, st.st_ino))
    stack = [(folder, prefix)]
    while stack:
        path, rel = stack.pop()
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    name = entry.name
                    if name.startswith("."):
                        continue
                    # is_file()/is_dir() follow symlinks; for plain entries they
                    # cost no system call on Linux (the type comes from readdir).
                    try:
                        if name.lower().endswith(IMAGE_EXTENSIONS) and entry.is_file():
                            out.append(rel + name)
                        elif entry.is_dir():
                            sub = entry.stat()  # the target's identity for a symlink
                            key = (sub.st_dev, sub.st_ino)
                            if key not in seen:
                                seen.add(key)
                                stack.append((entry.path, rel + name + "/"))
                    except OSError:
                        if entry.is_symlink():
                            continue  # a link that loops or dangles: nothing to read
                        raise
        except OSError as exc:
            where = getattr(exc, "filename", None) or path
            raise SourceError(f"{where}: cannot list folder ({exc.strerror})") from None
