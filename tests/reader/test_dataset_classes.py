"""PackedImageDataset(classes_from=...): refuse a pack numbered differently, in one line."""

from __future__ import annotations

import pytest

from imgpack import PackedImageDataset
from imgpack.errors import ClassMismatchError


def test_classes_from_accepts_equal_lists_and_refuses_others(make_pack, tmp_path):
    train, _, _ = make_pack(classes=("a", "b", "c"), name="train")
    val, _, _ = make_pack(classes=("a", "c"), name="val")
    same, _, _ = make_pack(classes=("a", "b", "c"), name="same")
    ds = PackedImageDataset(same, classes_from=train)
    assert len(PackedImageDataset(same, classes_from=ds)) == len(ds)
    assert PackedImageDataset(same, classes_from=["a", "b", "c"]).classes == ["a", "b", "c"]
    with pytest.raises(ClassMismatchError, match=r"^val.bin has other classes than train.bin: "
                       r"2 here .*label 1 is 'c' here, 'b' there$") as err:  # fmt: skip
        PackedImageDataset(val, classes_from=train)
    assert "\n" not in str(err.value)
    names = tmp_path / "classes.txt"
    names.write_text("a\nc\n")
    PackedImageDataset(val, classes_from=names)


def test_a_list_of_packs_is_checked_against_classes_from_too(make_pack):
    train, _, _ = make_pack(classes=("a", "b", "c"), name="train")
    one, _, _ = make_pack(count=7, classes=("a", "b", "c"), name="one")
    two, _, _ = make_pack(classes=("a", "b", "c"), name="two")
    ds = PackedImageDataset([one, two], classes_from=train)
    assert ds.classes == ["a", "b", "c"] and len(ds.indexes) == 2
    with pytest.raises(ClassMismatchError, match=r"^one.bin has other classes"):
        PackedImageDataset([one, two], classes_from=["a", "c", "b"])
