"""Find the images to pack and fix their order and labels, once, before any decoding.

The listing is the pack's index in embryo: record i of the pack is ``files[i]``.
So the order must be a pure function of the folder's contents (never of
``os.scandir`` order, which differs between filesystems), and class numbering
must not depend on which folders happen to hold images.

Rules (torchvision ``ImageFolder`` where it has one, stated here where it has not):

* ``labels="folders"``: the classes are the immediate sub-folders of SRC, sorted
  by name (or exactly ``classes``, in that order, when given); files lying
  directly in SRC are left out. Each class folder is walked recursively. A class
  holding no images still gets its label number, so the numbering stays stable
  and every shard of a split agrees on it (torchvision raises instead).
* ``labels="none"``: every image under SRC, recursively, with label -1.
* Images are the files whose extension (any letter case) is one Pillow
  registers for a format it can decode (``decode.image_extensions``).
* Nothing vanishes: every other file met on the walk is listed in ``excluded``
  with the reason, except hidden and system files (names starting with ``.``,
  ``Thumbs.db``, ``desktop.ini``), which are only counted (``hidden``); hidden
  folders are not entered. Symlinks are followed; a folder already entered during
  one walk is not entered again, so a symlink loop ends instead of hanging.
  Broken or looping symlinks are listed as excluded; any other unreadable folder
  is an error, never a silent gap.
* Order: by class (label), then by relative path, compared as Python strings
  (code-point order, case-sensitive) on the POSIX-style path relative to SRC.
  This differs from torchvision only for files nested at mixed depths: it sorts
  ``cat/a/x.jpg`` before ``cat/b.jpg`` where ``os.walk`` order would not.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from imgpack.errors import SourceError
from imgpack.packer.decode import check_choice, image_extensions, not_read_reason
from imgpack.packer.sources.source import SOURCE_KINDS, Listing, printable_path, reading

__all__ = ["LABEL_MODES", "NOT_REGULAR", "discover", "is_system_file", "left_out_text"]

LABEL_MODES = ("folders", "none")
_SYSTEM_FILES = frozenset({"thumbs.db", "ehthumbs.db", "desktop.ini", "icon\r"})
LOOSE = "an image directly in SRC, not in a class folder"
BROKEN = "a broken or looping symlink"
UNLISTED = "class folder not in the class list"
NOT_REGULAR = "not a regular file"


def is_system_file(name: str) -> bool:
    """Hidden (``.*``, ``._*``) and OS bookkeeping files: counted, never listed by name."""
    return name.startswith(".") or name.lower() in _SYSTEM_FILES


# the groups a summary counts left-out entries in: how the reason starts -> (many, one);
# any other entry is counted by its extension
_GROUPS = {
    LOOSE: ("images outside class folders", "image outside class folders"),
    BROKEN: ("broken symlinks", "broken symlink"),
    UNLISTED: ("class folders not in the class list", "class folder not in the class list"),
    NOT_REGULAR: ("not regular files", "not a regular file"),
}


def left_out_text(excluded: list[tuple[str, str]], most: int | None = None) -> str:
    """Excluded entries (path, reason) counted by group, the ``most`` largest groups first,
    in words: '3 .txt, 1 broken symlink'. A pack's summary and the "no images found" error
    say what was left out alike."""
    counts: Counter[tuple[str, str]] = Counter()
    for path, reason in excluded:
        group = next((g for start, g in _GROUPS.items() if reason.startswith(start)), None)
        # any other entry: its file's, or its tar member's (shard.tar:dir/name), extension
        ext = os.path.splitext(path.rsplit(":", 1)[-1])[1].lower() or "(no extension)"
        counts[group or (ext, ext)] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][0]))[:most]
    return ", ".join(f"{n} {one if n == 1 else many}" for (many, one), n in ranked)


def discover(
    src: str | os.PathLike,
    *,
    labels: str = "folders",
    classes: list[str] | None = None,
    on_error: str | None = None,
    classes_source: str = "the class list",
    ignore: tuple[str | os.PathLike, ...] = (),
) -> Listing:
    """List the images under ``src`` in canonical pack order (see the module docstring).

    ``classes``: the exact class list (``--classes-from``); a folder it lacks is an
    error, or with ``on_error="skip"`` left out. ``ignore``: paths never
    listed (the pack's own output files, when they lie inside SRC).
    """
    check_choice("labels", labels, LABEL_MODES)
    root = Path(os.path.abspath(os.fspath(src)))
    # a folder, told apart from a missing source or a file by ``sources.select``
    st = root.stat()
    walk = _Walk({os.path.abspath(os.fspath(p)) for p in ignore}, (st.st_dev, st.st_ino))

    if labels == "none":
        files = [(path, -1) for path in walk.tree(str(root), "")]
        if not files:
            raise SourceError(
                f"{root}: no images found ({_looked_for(walk)}, searched recursively)"
                f"{_as_files_hint(root, walk)}"
            )
        return Listing(root, [], files, sorted(walk.excluded), walk.hidden)

    with reading(root, "cannot list source folder"):  # a file: "Not a directory"
        loose, entries = walk.scan(str(root), "")
    walk.excluded += [(name, LOOSE) for name in loose]
    folders = sorted(entry.name for entry in entries)
    if classes is None:
        if not folders:
            hint = _as_files_hint(root, walk)
            if loose:
                hint = f"; {len(loose)} images lie directly in it, pack them with labels 'none'"
            raise SourceError(f"{root}: no class folders (expected {root}/<class>/<image>){hint}")
        for name in folders:
            if printable_path(name) != name:  # the index is UTF-8 JSON: fail now, not later
                raise SourceError(
                    f"{root}/{printable_path(name)}: a class folder name must be valid UTF-8 "
                    f"(class names are stored in the index); rename the folder"
                )
    classes = folders if classes is None else list(classes)
    for name in sorted(set(folders) - set(classes)):
        if on_error != "skip":
            name = printable_path(name)
            raise SourceError(
                f"{root}/{name}: class folder '{name}' is not in {classes_source} "
                f"({len(classes)} class{'' if len(classes) == 1 else 'es'}); "
                f"use --on-error skip to leave it out"
            )
        walk.excluded.append((name + "/", f"{UNLISTED} ({classes_source})"))
    present = set(folders) & set(classes)  # a listed class absent from SRC: no images
    files = [
        (path, label)
        for label, name in enumerate(classes)
        if name in present
        for path in walk.tree(os.path.join(root, name), name + "/")
    ]
    if not files:
        raise SourceError(
            f"{root}: no images found in {len(present)} class folders ({_looked_for(walk)})"
        )
    return Listing(root, classes, files, sorted(walk.excluded), walk.hidden)


def _as_files_hint(root: Path, walk: _Walk) -> str:
    """A folder of tar shards or Parquet files given as SRC: say how to give the files."""
    for ext in SOURCE_KINDS:
        found = sum(path.lower().endswith(ext) for path, _ in walk.excluded if "/" not in path)
        if found:
            return (
                f"; it holds {found} {ext} file{'' if found == 1 else 's'}: to pack them, "
                f"name them, e.g. with a glob: '{root}/*{ext}'"
            )
    return ""


def _looked_for(walk: _Walk) -> str:
    seen = left_out_text(walk.excluded, 5)
    found = f"; found {seen}" if seen else ""
    return (
        f"looked for the {len(image_extensions())} extensions Pillow reads, "
        f"e.g. .jpg .jpeg .png .gif .webp .tif, any letter case{found}"
    )


class _Walk:
    """What one discovery met: images, entries left out with reasons, hidden ones counted.
    ``root``: (device, inode) of SRC, never entered again from below it."""

    def __init__(self, ignore: set[str], root: tuple[int, int]) -> None:
        self.ignore, self.root = ignore, root
        self.excluded: list[tuple[str, str]] = []
        self.hidden = 0

    def scan(self, path: str, rel: str) -> tuple[list[str], list[os.DirEntry]]:
        """``rel + name`` of the images in one folder, and its visible sub-folders; every
        other entry is left out (listed with its reason, or counted if hidden)."""
        images, folders = [], []
        with os.scandir(path) as entries:
            for entry in entries:
                name = entry.name
                if self.ignore and entry.path in self.ignore:
                    continue
                if is_system_file(name):
                    self.hidden += 1
                    continue
                # is_file()/is_dir() follow symlinks; for plain entries they cost no
                # system call on Linux (the type comes from readdir)
                ext = os.path.splitext(name)[1].lower()  # '' for none, and for a hidden name
                try:
                    if ext in image_extensions() and entry.is_file():
                        images.append(rel + name)
                        continue
                    if entry.is_dir():
                        folders.append(entry)
                        continue
                    if entry.is_file():
                        self.excluded.append((rel + name, not_read_reason(ext)))
                        continue
                except OSError:
                    if not entry.is_symlink():
                        raise
                self.excluded.append((rel + name, BROKEN if entry.is_symlink() else NOT_REGULAR))
        return images, folders

    def tree(self, folder: str, prefix: str) -> list[str]:
        """``prefix + relpath`` of every image under ``folder``, sorted.

        Folders already entered in this walk (by device and inode) are not entered again,
        so symlinked folders are entered at most once and a loop ends. Iterative: deep
        trees cannot hit the recursion limit. ``folder`` is SRC or a class folder the walk
        met, so it stats as it did then.
        """
        st = os.stat(folder)
        seen = {self.root, (st.st_dev, st.st_ino)}
        images: list[str] = []
        stack = [(folder, prefix)]
        while stack:
            path, rel = stack.pop()
            with reading(path, "cannot list folder"):
                found, folders = self.scan(path, rel)
                for entry in folders:
                    sub = entry.stat()  # the target's identity for a symlink
                    if (sub.st_dev, sub.st_ino) not in seen:
                        seen.add((sub.st_dev, sub.st_ino))
                        stack.append((entry.path, rel + entry.name + "/"))
            images += found
        return sorted(images)
