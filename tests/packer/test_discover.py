"""discover(): which files a pack holds, in which order, with which labels."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import write_image

from imgpack.errors import SourceError
from imgpack.packer.decode import image_extensions
from imgpack.packer.discover import discover, left_out_text
from imgpack.packer.sources.source import Listing


def touch(root: Path, *relpaths: str) -> None:
    """discover never reads file contents, so empty files stand in for images."""
    for rel in relpaths:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


def test_image_folder_fixture(image_folder):
    src = image_folder(classes=("dog", "cat"), per_class=2)
    listing = discover(src)
    assert isinstance(listing, Listing)
    assert listing.root == src and listing.root.is_absolute()
    assert listing.classes == ["cat", "dog"]
    assert listing.files == [
        ("cat/000.jpg", 0),
        ("cat/001.jpg", 0),
        ("dog/000.jpg", 1),
        ("dog/001.jpg", 1),
    ]


def test_canonical_order_is_by_class_then_relpath_string(tmp_path):
    src = tmp_path / "src"
    # created out of order, nested at mixed depths, mixed letter case
    touch(src, "b/z.jpg", "b/a/x.jpg", "b/B.jpg", "b/a.jpg", "a/sub/deep/1.png", "a/0.png")
    listing = discover(src)
    assert listing.classes == ["a", "b"]
    assert listing.files == [
        ("a/0.png", 0),
        ("a/sub/deep/1.png", 0),
        ("b/B.jpg", 1),  # code-point order: upper case first
        ("b/a.jpg", 1),  # '.' sorts before '/'
        ("b/a/x.jpg", 1),
        ("b/z.jpg", 1),
    ]


def test_extensions_any_case_and_others_left_out(tmp_path):
    src = tmp_path / "src"
    names = [f"c/img{i}{ext}" for i, ext in enumerate(sorted(image_extensions()))]
    names += ["c/UPPER.JPG", "c/Mixed.PnG", "c/x.TIFF", "c/anim.GIF", "c/a.apng"]
    others = ["c/notes.txt", "c/a.jpg.bak", "c/jpg", "c/raw.heic", "c/doc.eps", "c/clip.mpg"]
    touch(src, *names, *others)
    listing = discover(src)
    assert [rel for rel, _ in listing.files] == sorted(names)
    assert [rel for rel, _ in listing.excluded] == sorted(others)
    reasons = dict(listing.excluded)
    assert reasons["c/notes.txt"] == ".txt is not an image format Pillow reads"
    assert reasons["c/jpg"].startswith("no file extension")
    assert "Ghostscript" in reasons["c/doc.eps"] and "video" in reasons["c/clip.mpg"]


def test_hidden_entries_counted_and_loose_files_listed(tmp_path):
    src = tmp_path / "src"
    touch(src, "c/ok.jpg", "c/.hidden.jpg", "c/.cache/x.jpg", ".trash/x.jpg", "loose.jpg",
          "c/.DS_Store", "c/._ok.jpg", "c/Thumbs.db", "c/sub/desktop.ini", "README.md")  # fmt: skip
    listing = discover(src)
    assert listing.classes == ["c"]
    assert listing.files == [("c/ok.jpg", 0)]
    assert listing.hidden == 7  # .trash, .hidden.jpg, .cache, .DS_Store, ._ok.jpg, Thumbs, ini
    assert listing.excluded == [
        ("README.md", ".md is not an image format Pillow reads"),
        ("loose.jpg", "an image directly in SRC, not in a class folder"),
    ]
    assert left_out_text(listing.excluded) == "1 .md, 1 image outside class folders"


def test_empty_class_keeps_its_label(tmp_path):
    src = tmp_path / "src"
    touch(src, "a/1.jpg", "c/1.jpg", "b/readme.txt")
    (src / "d").mkdir()
    listing = discover(src)
    assert listing.classes == ["a", "b", "c", "d"]
    assert listing.files == [("a/1.jpg", 0), ("c/1.jpg", 2)]


def test_real_images_and_unicode_names(tmp_path):
    src = tmp_path / "src"
    write_image(src / "chat noir" / "été 1.jpg")
    write_image(src / "犬" / "写真.png")
    listing = discover(src)
    assert listing.classes == ["chat noir", "犬"]
    assert listing.files == [("chat noir/été 1.jpg", 0), ("犬/写真.png", 1)]
    for rel, _ in listing.files:
        assert (listing.root / rel).is_file()


def test_symlinked_files_and_folders_are_followed(tmp_path):
    src, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    touch(src, "a/1.jpg")
    touch(elsewhere, "pics/p.jpg", "pics/inner/q.png", "one.jpg", "cls/c.jpg")
    os.symlink(elsewhere / "one.jpg", src / "a" / "linked.jpg")
    os.symlink(elsewhere / "pics", src / "a" / "pics")
    os.symlink(elsewhere / "cls", src / "b")  # a class folder that is a symlink
    os.symlink(tmp_path / "nowhere.jpg", src / "a" / "broken.jpg")  # nothing to read
    listing = discover(src)
    assert listing.excluded == [("a/broken.jpg", "a broken or looping symlink")]
    assert listing.classes == ["a", "b"]
    assert listing.files == [
        ("a/1.jpg", 0),
        ("a/linked.jpg", 0),
        ("a/pics/inner/q.png", 0),
        ("a/pics/p.jpg", 0),
        ("b/c.jpg", 1),
    ]


def test_symlink_loops_end(tmp_path):
    src = tmp_path / "src"
    touch(src, "a/1.jpg", "a/sub/2.jpg", "b/3.jpg")
    os.symlink(src / "a", src / "a" / "sub" / "up")  # back to the class folder
    os.symlink(".", src / "a" / "self")  # to itself
    os.symlink(src, src / "b" / "root")  # to SRC
    os.symlink(src / "b" / "x", src / "b" / "y")  # two links pointing at each other
    os.symlink(src / "b" / "y", src / "b" / "x")
    assert discover(src).files == [("a/1.jpg", 0), ("a/sub/2.jpg", 0), ("b/3.jpg", 1)]
    assert discover(src, labels="none").files == [
        ("a/1.jpg", -1),
        ("a/sub/2.jpg", -1),
        ("b/3.jpg", -1),
    ]


def test_labels_none_takes_everything(tmp_path):
    src = tmp_path / "src"
    touch(src, "top.jpg", "x/1.jpg", "x/y/2.PNG", ".hidden/3.jpg", "x/skip.txt")
    listing = discover(src, labels="none")
    assert listing.classes == []
    assert listing.files == [("top.jpg", -1), ("x/1.jpg", -1), ("x/y/2.PNG", -1)]


def test_many_files(tmp_path):
    src = tmp_path / "src"
    names = [f"c{c}/d{i % 7}/{i:05d}.jpg" for c in range(3) for i in range(300)]
    touch(src, *reversed(names))
    listing = discover(src)
    assert listing.files == [(n, int(n[1])) for n in sorted(names)]


def test_missing_source(tmp_path):
    from imgpack.packer.pack import pack_folder

    with pytest.raises(SourceError, match="nope: source folder does not exist"):
        pack_folder(tmp_path / "nope", tmp_path / "p.bin")


def test_source_is_a_file(tmp_path):
    path = write_image(tmp_path / "one.jpg")
    with pytest.raises(
        SourceError, match=r"one.jpg: cannot list source folder \(Not a directory\)"
    ):
        discover(path)


def test_no_class_folders(tmp_path):
    src = tmp_path / "src"
    touch(src, "a.jpg", "b.png", "note.txt", ".hidden/c.jpg")
    with pytest.raises(SourceError, match=r"no class folders .*2 images lie directly in it"):
        discover(src)
    assert len(discover(src, labels="none").files) == 2


def test_no_images_says_what_was_looked_for(tmp_path):
    src = tmp_path / "src"
    touch(src, "a/readme.txt", "b/raw.heic")
    with pytest.raises(SourceError) as err:
        discover(src)
    msg = str(err.value)
    assert "no images found in 2 class folders" in msg and ".jpeg" in msg and ".webp" in msg
    assert "found 1 .heic, 1 .txt" in msg
    assert "\n" not in msg
    with pytest.raises(SourceError, match="no images found"):
        discover(src, labels="none")


def test_empty_source(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(SourceError, match="no class folders"):
        discover(tmp_path / "src")


def test_unreadable_folder_is_an_error_not_a_silent_gap(tmp_path, monkeypatch):
    src = tmp_path / "src"
    touch(src, "a/1.jpg", "a/locked/2.jpg")
    real_scandir = os.scandir

    def scandir(path):  # chmod 0 does not stop root, so refuse the way the kernel would
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(SourceError, match=r"locked: cannot list folder \(Permission denied\)"):
        discover(src)


def test_bad_labels_mode(tmp_path):
    with pytest.raises(ValueError, match="labels must be one of folders, none"):
        discover(tmp_path, labels="files")


def test_a_given_class_list_fixes_order_and_keeps_absent_classes(tmp_path):
    src = tmp_path / "src"
    touch(src, "dog/1.jpg", "cat/1.jpg", "cat/2.jpg")
    listing = discover(src, classes=["zebra", "dog", "cat", "eel"])
    assert listing.classes == ["zebra", "dog", "cat", "eel"]
    assert listing.files == [("dog/1.jpg", 1), ("cat/1.jpg", 2), ("cat/2.jpg", 2)]
    assert listing.empty_classes == ["zebra", "eel"]


def test_a_folder_missing_from_the_class_list_is_an_error_or_left_out(tmp_path):
    src = tmp_path / "src"
    touch(src, "dog/1.jpg", "cat/1.jpg", "owl/1.jpg")
    with pytest.raises(SourceError, match=r"class folder 'owl' is not in train.bin \(2 classes\)"):
        discover(src, classes=["cat", "dog"], classes_source="train.bin")
    listing = discover(src, classes=["cat", "dog"], on_error="skip", classes_source="train.bin")
    assert listing.files == [("cat/1.jpg", 0), ("dog/1.jpg", 1)]
    assert listing.excluded == [("owl/", "class folder not in the class list (train.bin)")]
    with pytest.raises(SourceError, match="no images found in 0 class folders"):
        discover(src, classes=["emu"], on_error="skip")


def test_the_packs_own_files_are_never_listed(tmp_path):
    src = tmp_path / "src"
    touch(src, "a/1.jpg", "a/out.bin", "a/out.bin.partial", "a/notes.txt", "out.json")
    ignore = (src / "a" / "out.bin", src / "a" / "out.bin.partial", src / "out.json")
    assert discover(src, ignore=ignore).excluded == [
        ("a/notes.txt", ".txt is not an image format Pillow reads")
    ]
    assert discover(src, labels="none", ignore=ignore).files == [("a/1.jpg", -1)]
