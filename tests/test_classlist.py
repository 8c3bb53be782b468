"""Class lists: read from packs, manifests and text files; digest; compare two."""

from __future__ import annotations

import re

import pytest

from imgpack.classlist import check_same_classes, class_digest, read_class_list
from imgpack.errors import ClassMismatchError, InvalidArgumentError


def test_read_from_a_pack_its_index_and_a_text_file(make_pack, tmp_path):
    out, _, _ = make_pack(classes=("b", "a", "c"))
    assert read_class_list(out) == ["b", "a", "c"]
    assert read_class_list(out.with_suffix(".json")) == ["b", "a", "c"]
    text = tmp_path / "classes.txt"
    text.write_text("zebra\n\nant\r\nchat noir\n", encoding="utf-8")
    assert read_class_list(text) == ["zebra", "ant", "chat noir"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("a\nb\na\n", "line 3: class 'a' is already on line 1"),
        ("\n \n", "no class names"),
        (b"\xff\n", "not UTF-8"),
    ],  # fmt: skip
)
def test_bad_text_lists(tmp_path, content, message):
    path = tmp_path / "c.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InvalidArgumentError, match=message):
        read_class_list(path)


def test_missing_or_broken_sources(tmp_path):
    with pytest.raises(InvalidArgumentError, match="nope.txt: class list not found"):
        read_class_list(tmp_path / "nope.txt")
    with pytest.raises(
        InvalidArgumentError, match=r"cannot take the classes from .*nope.bin: .*not found"
    ):
        read_class_list(tmp_path / "nope.bin")


def test_digest_depends_on_names_and_order():
    assert class_digest(["a", "b"]) == class_digest(("a", "b"))
    assert len({class_digest(c) for c in (["a", "b"], ["b", "a"], ["a"], ["a\nb"], [])}) == 5
    assert re.fullmatch(r"[0-9a-f]{12}", class_digest(["a"]))


def test_check_names_the_first_difference(make_pack, tmp_path):
    out, _, _ = make_pack(classes=("cat", "dog", "eel"))
    check_same_classes(["cat", "dog", "eel"], out)
    message = (
        r"^val.bin has other classes than pack.bin: "
        r"2 here \(\w{12}\), 3 there \(\w{12}\); label 1 is 'eel' here, 'dog' there$"
    )
    with pytest.raises(ClassMismatchError, match=message):
        check_same_classes(["cat", "eel"], out, what="val.bin")
    with pytest.raises(ClassMismatchError, match="label 2 is nothing here, 'eel' there"):
        check_same_classes(["cat", "dog"], ["cat", "dog", "eel"])
    with pytest.raises(InvalidArgumentError, match="not int"):
        check_same_classes(["a"], 3)


def test_read_from_a_manifest(image_folder, tmp_path):
    from imgpack.packer.merge import merge_packs
    from imgpack.packer.pack import pack_folder

    src = image_folder(classes=("b", "a"), per_class=2)
    shards = []
    for i in range(2):
        shards.append(tmp_path / f"s{i}.bin")
        pack_folder(src, shards[-1], size=(4, 4), workers=1, num_shards=2, shard_index=i)
    merge_packs(tmp_path / "all.manifest.json", shards)
    assert read_class_list(tmp_path / "all.manifest.json") == ["a", "b"]
