"""The checks every reader of a user's file shares: the index, the manifest, the resume
journal, a class list.

JSON gives Python ``bool`` for ``true``, and ``bool`` is an ``int``: a count of
``true`` must never pass. Every predicate here says so once; ``read_text`` and
``check_rules`` raise the caller's error class (a class list's and a labels file's are not
FormatErrors; the index's and the manifest's are) and ``load_json`` a ``FormatError``,
each in one line that starts with the file's name, so each reader keeps only the rules
that are its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from imgpack.errors import FormatError

__all__ = [
    "is_int",
    "is_count",
    "is_number",
    "is_str_list",
    "is_int_list",
    "check_rules",
    "stated",
    "read_text",
    "load_json",
    "json_or_none",
]


def is_int(value: Any) -> bool:
    """A JSON integer (``true``/``false`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    """A non-negative JSON integer."""
    return is_int(value) and value >= 0


def is_number(value: Any) -> bool:
    """A JSON integer or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def is_int_list(value: Any, length: int | None = None, *, minimum: int | None = None) -> bool:
    """A list of JSON integers, of ``length`` items if given, each >= ``minimum`` if given."""
    return (
        isinstance(value, list)
        and (length is None or len(value) == length)
        and all(is_int(v) and (minimum is None or v >= minimum) for v in value)
    )


def check_rules(
    obj: dict[str, Any], rules: Sequence[tuple], where: str, error: type = FormatError
) -> None:
    """Raise ``error`` (a ``FormatError`` unless the caller's file is another kind: a labels
    file's rows are a ``SourceError``) for the first rule ``(key, test, what it expects)`` that
    ``obj[key]`` fails, in one line: ``{where}{key} is {value!r} (or missing), expected ...``.
    The rules are tested in order, so a test may rely on those before it: one table of
    rules says what a document holds, and every message has the same shape."""
    for key, ok, expected in rules:
        if not ok(obj.get(key)):
            raise error(f"{where}{key} is {stated(obj, key)}, expected {expected}")


def stated(obj: dict[str, Any], key: str) -> str:
    """What a document says of ``key`` in a message: its value, or 'missing' when the key is
    absent (the user looks for a field to fix, not for a Python None they never wrote)."""
    return repr(obj[key]) if key in obj else "missing"


def read_text(
    path: str | os.PathLike,
    error: Callable[[str], Exception],
    *,
    what: str,
    missing: str | None = None,
    encoding: str = "utf-8",
) -> str:
    """``path``'s text, or ``error`` with one line naming the file: not found, not UTF-8, or
    not readable (a folder, no permission, a name too long).

    ``what`` names the document in messages ("index", "class list"); ``missing``
    replaces the not-found message.
    """
    path = Path(path)
    try:
        return path.read_text(encoding=encoding)
    except FileNotFoundError:
        raise error(missing or f"{path}: {what} not found") from None
    except UnicodeDecodeError as e:
        raise error(
            f"{path.name}: {what} is not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None
    except OSError as e:
        raise error(f"{path.name}: cannot read the {what} ({e.strerror or e})") from None


def load_json(path: str | os.PathLike, *, what: str, missing: str | None = None) -> dict:
    """Read ``path`` (``read_text``) as one JSON object, or raise ``FormatError`` with one
    line naming the file (the index, a manifest)."""
    name = Path(path).name
    text = read_text(path, FormatError, what=what, missing=missing)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        why = e.msg.removesuffix(" at")  # json's "Invalid control character at"
        raise FormatError(
            f"{name}: invalid JSON at line {e.lineno} column {e.colno}: {why}"
        ) from None
    except RecursionError:
        raise FormatError(f"{name}: JSON nested too deeply to be an imgpack {what}") from None
    if not isinstance(raw, dict):
        raise FormatError(f"{name}: {what} should be a JSON object, found {type(raw).__name__}")
    return raw


def json_or_none(data: str | bytes) -> Any:
    """``data`` parsed as JSON, or None when it is not JSON (bad bytes, syntax, nesting).

    For line-by-line formats (the resume journal) where a line that does not parse
    is a torn write to skip, not a file to refuse.
    """
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
