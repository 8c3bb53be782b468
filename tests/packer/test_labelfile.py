"""--labels FILE.csv / FILE.jsonl: parsing, every bad row named by its line, targets."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import write_image

from imgpack.errors import SourceError
from imgpack.packer.pack import pack_folder
from imgpack.packer.sources.folder import FolderSource, is_labels_file


def read_labels_file(path, classes=None, classes_source="the class list"):
    """The listing of a labels file over the folder it lies in."""
    kw = dict(classes_from=classes, classes_source=classes_source)
    return FolderSource(path.parent, labels=path, **kw).listing()


def touch(folder, *names):
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"")


def csv_file(tmp_path, text, name="labels.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def jsonl_file(tmp_path, rows, name="labels.jsonl"):
    path = tmp_path / name
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows))
    return path


def test_names_give_sorted_classes_in_row_order(tmp_path):
    path = csv_file(tmp_path, "id,path,label,extra\n1,b/x.jpg,dog,?\n\n2,./a//y.png, cat ,\n")
    touch(tmp_path, "b/x.jpg")
    table = read_labels_file(path)
    assert table.classes == ["cat", "dog"]
    assert table.files == [("b/x.jpg", 1), ("a/y.png", 0)]
    assert table.bad == {1: "listed in labels.csv line 4, not found"} and table.targets is None


def test_integer_labels_are_classes_0_to_max_or_index_a_class_list(tmp_path):
    path = csv_file(tmp_path, "path,label\na.jpg,2\nb.jpg,0\n")
    touch(tmp_path, "a.jpg", "b.jpg")
    table = read_labels_file(path)
    assert table.classes == ["0", "1", "2"] and table.files == [("a.jpg", 2), ("b.jpg", 0)]
    mixed = csv_file(tmp_path, "path,label\na.jpg,2\nb.jpg,cat\n", "mixed.csv")
    table = read_labels_file(mixed, classes=["cat", "dog", "eel"])
    assert table.files == [("a.jpg", 2), ("b.jpg", 0)] and table.classes == ["cat", "dog", "eel"]
    with pytest.raises(SourceError, match=r"mixed.csv: line 2: label 2 is a number but line 3"):
        read_labels_file(mixed)


def test_jsonl_strings_are_names_numbers_are_indices(tmp_path):
    path = jsonl_file(
        tmp_path, [{"path": "a.jpg", "label": "7"}, "\n", {"path": "b.jpg", "label": "10"}]
    )
    touch(tmp_path, "a.jpg", "b.jpg")
    assert read_labels_file(path).classes == ["10", "7"]  # names, sorted as strings
    path = jsonl_file(tmp_path, [{"path": "a.jpg", "label": 1, "targets": [0.5, -2]}])
    table = read_labels_file(path)
    assert table.classes == ["0", "1"] and table.targets.shape[1] == 2
    assert table.targets.dtype == np.float32 and table.targets.tolist() == [[0.5, -2.0]]


def test_csv_targets_in_one_cell(tmp_path):
    path = csv_file(tmp_path, 'path,label,targets\na.jpg,cat,1 0;1\nb.jpg,dog,"0.25; 1e-3  7"\n')
    touch(tmp_path, "a.jpg", "b.jpg")
    table = read_labels_file(path)
    np.testing.assert_array_equal(table.targets, np.array([[1, 0, 1], [0.25, 1e-3, 7]], np.float32))


BAD_CSV = [
    ("path,lbl\na.jpg,x\n", r"line 1: the header has no label column \(found 'path', 'lbl'\)"),
    ("", "empty file"),
    ("path,label\n", "no rows after the header"),
    ("path,label\na.jpg,x\nb.jpg\n", r"line 3: 1 fields, the header has 2"),
    ("path,label\na.jpg,x\nb.jpg,\n", "line 3: label is '', expected a class name or an integer"),
    ("path,label\na.jpg,x\n./a.jpg,y\n", "line 3: a.jpg is already listed on line 2"),
    ("path,label\n/etc/a.jpg,x\n", "line 2: path is '/etc/a.jpg', expected a file path inside SRC"),
    ("path,label\nok.jpg,x\n../a.jpg,x\n", r"line 3: path is '../a.jpg', expected"),
    ("path,label\na.jpg,-1\n", "line 2: label -1 is negative"),
    ("path,label\na.jpg,99999999\n", "line 2: label 99999999 would make 100000000 classes"),
    (
        "path,label,targets\na.jpg,x,1 2\nb.jpg,x,1\n",
        r"line 3: 1 target values, line 2 has 2 \(same K per row\)",
    ),
    (
        "path,label,targets\na.jpg,x,\n",
        r"line 2: targets is '', expected numbers: a JSON list, or in a CSV cell",
    ),
    (
        "path,label,targets\na.jpg,x,1 nan\n",
        r"line 2: target vector \['1', 'nan'\]: target 'nan' is not finite",
    ),
    (
        "path,label,targets\na.jpg,x,1 1e39\n",
        r"line 2: target vector .*: target '1e39' is not finite as a float32",
    ),
    (
        "path,label,targets\na.jpg,x,1\nb.jpg,x,one\n",
        r"line 3: target vector \['one'\]: target 'one' is not a number",
    ),
]


@pytest.mark.parametrize("text, message", BAD_CSV)
def test_bad_csv_rows_are_named(tmp_path, text, message):
    with pytest.raises(SourceError, match=r"^labels.csv: " + message):
        read_labels_file(csv_file(tmp_path, text))


BAD_JSONL = [
    (['{"path": "a.jpg"}\n'], "line 1: label is missing, expected a class name or an integer"),
    (["[1, 2]\n"], "line 1: expected a JSON object"),
    (["[" * 100_000 + "\n"], r"line 1: expected a JSON object, found '\[\[\["),  # too deep
    (
        ['{"path": "a.jpg", "label": "x"}\n', "{oops\n"],
        "line 2: expected a JSON object, found '{oops'",
    ),
    ([{"path": 3, "label": "x"}], "line 1: path is 3, expected a file path"),
    (
        [{"path": "a.jpg", "label": True}],
        "line 1: label is True, expected a class name or an integer",
    ),
    ([{"path": "a.jpg", "label": 1.5}], "line 1: label is 1.5, expected a class name"),
    (
        [{"path": "a.jpg", "label": "x", "targets": "1 2"}],
        "line 1: targets is '1 2', expected numbers: a JSON list",
    ),
    (
        [{"path": "a.jpg", "label": "x", "targets": [1, True]}],
        r"line 1: target vector \[1, True\]: target 'True' is not a number",
    ),
    (
        [{"path": "a.jpg", "label": "x", "targets": [1]}, {"path": "b.jpg", "label": "x"}],
        "line 2: no target vector given \\(every record needs one\\)",
    ),  # fmt: skip
    (
        [{"path": "a.jpg", "label": "x"}, {"path": "b.jpg", "label": "x", "targets": [1]}],
        r"line 2: 1 target values, line 1 has none \(same K per row\)",
    ),  # fmt: skip
    (
        [{"path": "a.jpg", "label": "x"}, {"path": "b.jpg", "label": 0}],
        "line 2: label 0 is a number but line 1 names a class",
    ),  # fmt: skip
    (
        ['{"path": "a.jpg", "label": "x", "targets": [NaN]}\n'],
        r"line 1: target vector \[nan\]: target 'nan' is not finite",
    ),
]


@pytest.mark.parametrize("rows, message", BAD_JSONL)
def test_bad_jsonl_rows_are_named(tmp_path, rows, message):
    with pytest.raises(SourceError, match=r"^labels.jsonl: " + message):
        read_labels_file(jsonl_file(tmp_path, rows))


def test_labels_outside_the_class_list_are_named(tmp_path):
    path = csv_file(tmp_path, "path,label\na.jpg,cat\nb.jpg,emu\n")
    with pytest.raises(SourceError, match=r"line 3: label 'emu' is not one of the 2 classes "
                       r"of train.bin \(cat, dog\) nor an integer 0..1"):  # fmt: skip
        read_labels_file(path, classes=["cat", "dog"], classes_source="train.bin")
    with pytest.raises(SourceError, match="line 1: label 5 is not one of"):
        read_labels_file(jsonl_file(tmp_path, [{"path": "a", "label": 5}]), classes=["cat"])


def test_not_a_labels_file(tmp_path):
    assert (
        is_labels_file("x/Labels.CSV")
        and is_labels_file("a.jsonl")
        and not is_labels_file("folders")
    )
    with pytest.raises(
        SourceError, match="nope.csv: cannot read the labels file \\(No such file or directory\\)"
    ):
        read_labels_file(tmp_path / "nope.csv")
    (tmp_path / "bin.csv").write_bytes(b"path,label\n\xff\xfe,x\n")
    with pytest.raises(SourceError, match="cannot read the labels file .*can't decode byte"):
        read_labels_file(tmp_path / "bin.csv")


def test_listing_keeps_present_files_and_reports_missing_ones(tmp_path):
    src = tmp_path / "src"
    write_image(src / "a.jpg")
    write_image(src / "sub" / "b.png")
    path = csv_file(
        tmp_path, "path,label,targets\nsub/b.png,dog,1 2\ngone.jpg,cat,3 4\na.jpg,cat,5 6\n"
    )
    found = FolderSource(src, labels=path).listing()
    assert found.files == [("sub/b.png", 1), ("gone.jpg", 0), ("a.jpg", 0)]
    assert found.classes == ["cat", "dog"]
    assert found.bad == {1: "listed in labels.csv line 3, not found"}
    assert found.targets.tolist() == [[1, 2], [3, 4], [5, 6]]
    with pytest.raises(
        SourceError, match=r"gone.jpg: listed in labels.csv line 3, not found \(--on-error fail"
    ):
        pack_folder(src, tmp_path / "p.bin", size=8, labels=path, on_error="fail")
    assert not list(tmp_path.glob("p.*"))
    nothing = csv_file(tmp_path, "path,label\nx.jpg,a\n", "none.csv")
    with pytest.raises(SourceError, match="none of the 1 files none.csv lists is there"):
        FolderSource(src, labels=nothing).listing()
