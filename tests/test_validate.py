"""The shared checks: bool is never an int, counts are non-negative, messages name the file
(the index's own required-field rules: tests/test_format.py's damage table)."""

from __future__ import annotations

import json

import pytest

from imgpack.errors import FormatError
from imgpack.validate import (
    check_rules,
    is_count,
    is_int,
    is_int_list,
    is_number,
    is_str_list,
    json_or_none,
    load_json,
)


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None, [1]])
def test_only_real_integers_are_ints(value):
    assert not is_int(value) and not is_count(value)


def test_ints_counts_and_numbers():
    assert all(is_int(v) for v in (0, -3, 2**70))
    assert is_count(0) and is_count(2**70) and not is_count(-1)
    assert is_number(1) and is_number(-0.5) and is_number(float("inf"))
    assert not is_number(True) and not is_number("1.5") and not is_number(None)


def test_lists_of_given_length_and_minimum():
    assert is_int_list([1, 2, 3], 3) and is_int_list([], 0) and is_int_list([5, 6])
    assert not is_int_list([1, 2], 3) and not is_int_list([1, 2, 3, 4], 3)
    assert not is_int_list([1, True, 3], 3) and not is_int_list([1, 2.0], 2)
    assert is_int_list([1, 8], 2, minimum=1) and not is_int_list([0, 8], 2, minimum=1)
    assert not is_int_list((1, 2), 2) and not is_int_list("12", 2)
    assert is_str_list([]) and is_str_list(["a", ""]) and not is_str_list(["a", 1])
    assert not is_str_list("ab") and not is_str_list(None)


def test_load_json_refuses_in_one_line_naming_the_file(tmp_path):
    error = FormatError
    good = tmp_path / "m.json"
    good.write_text(json.dumps({"a": [1, 2]}))
    assert load_json(good, what="manifest") == {"a": [1, 2]}
    cases = {
        b"\xff\xfe{}": r"^m\.json: manifest is not UTF-8 text \(invalid start byte at byte 0\)$",
        b'{"a": 1,}': r"^m\.json: invalid JSON at line 1 column 9: ",
        b'{"a\x01": 1}': r"^m\.json: invalid JSON at line 1 column 4: Invalid control character$",
        b"[" * 100_000: r"^m\.json: JSON nested too deeply to be an imgpack manifest$",
        b"[1, 2]": r"^m\.json: manifest should be a JSON object, found list$",
        b"null": r"^m\.json: manifest should be a JSON object, found NoneType$",
    }
    for text, match in cases.items():
        good.write_bytes(text)
        with pytest.raises(error, match=match) as got:
            load_json(good, what="manifest")
        assert type(got.value) is error
    with pytest.raises(error, match=r"m\.json: invalid JSON at line 2 column 5: ") as got:
        good.write_text('{\n"a" 1}')
        load_json(good, what="manifest")
    with pytest.raises(error, match=r"absent\.json: manifest not found$"):
        load_json(tmp_path / "absent.json", what="manifest")
    with pytest.raises(error, match=r"^look elsewhere$"):
        load_json(tmp_path / "absent.json", what="manifest", missing="look elsewhere")
    (tmp_path / "dir.json").mkdir()  # not a file: one line too, for every JSON reader
    with pytest.raises(error, match=r"^dir\.json: cannot read the manifest \(Is a directory\)$"):
        load_json(tmp_path / "dir.json", what="manifest")


def test_json_or_none_never_raises_for_a_bad_line():
    assert json_or_none(b'{"i": 0}\n') == {"i": 0} and json_or_none("[1]") == [1]
    for bad in (b'{"i": 0', b"\xff", b"[" * 100_000, b"", "nan?"):
        assert json_or_none(bad) is None


def test_check_rules_names_the_first_rule_that_fails_in_order():
    rules = [("n", is_int, "an int"), ("n", lambda n: n > 0, "an int > 0")]  # the 2nd needs the 1st
    check_rules({"n": 3}, rules, "x.json: ")
    for obj, said in [
        ({"n": "3"}, "n is '3', expected an int"),
        ({}, "n is missing, expected an"),
        ({"n": None}, "n is None, expected an"),
    ]:
        with pytest.raises(FormatError, match=f"^x.json: {said}"):
            check_rules(obj, rules, "x.json: ")
    with pytest.raises(FormatError, match="n is 0, expected an int > 0"):
        check_rules({"n": 0}, rules, "")
