"""Damage for the fuzzer: one ``Mutation`` names a file of a pack and what to do to it.

A mutation is plain data (a role, a kind and two integers taken modulo whatever the
file has), so every run of the Hypothesis tests (tests/test_fuzz.py) draws the same
damage, a failure prints as a reproducer, and Hypothesis shrinks integers.

Kinds on bytes (any file): ``flip`` (xor one byte, in the zone ``value`` picks: header
fields, header padding, pixels, the sections after them, or anywhere), ``truncate``,
``extend``. Kinds on JSON (the index, a manifest, the journal's lines): ``delete`` a
field or item, ``retype`` it (bools, negatives, huge, floats, NaN, strings, lists,
objects, nesting too deep to parse), ``revalue`` it within its type (ints moved,
strings made unsafe, lists shortened or lengthened, objects emptied), ``cut`` the text,
``section`` (an index section's offset or nbytes moved), and on JSON lines ``drop``,
``dup`` or ``swap`` lines.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BYTE_KINDS",
    "JSON_KINDS",
    "LINE_KINDS",
    "Mutation",
    "random_mutations",
    "strategy",
    "apply",
]

BYTE_KINDS = ("flip", "truncate", "extend")
JSON_KINDS = ("delete", "retype", "revalue", "cut", "section")
LINE_KINDS = ("drop", "dup", "swap")
ZONES = ("fields", "padding", "pixels", "tail", "any")
SECTIONS = ("pixels", "labels", "checksums", "path_offsets", "paths")
_DEEP = "\x00deep\x00"  # stands for a value nested too deep to parse, written as text
REPLACEMENTS = (True, False, None, 0, -1, 1, 2**31, 2**63, 2**64, 10**400, -(2**63), 1.5,
                0.0, -0.5, 1e308, float("nan"), float("inf"), "", "x", "imgpack", "uint8", [],
                [0], [0, 0, 0], [1, 2, 3, 4], {}, {"a": 1}, {"offset": 0, "nbytes": 0},
                _DEEP)  # fmt: skip
DELTAS = (1, -1, 8, -8, 64, -64, 144, -144, 4096, -4096, "zero", "double", 2**40)


@dataclass(frozen=True)
class Mutation:
    """Damage to the file of ``role``; ``where`` and ``value`` are taken modulo what it has."""

    role: str
    kind: str
    where: int
    value: int

    def __str__(self) -> str:
        return f"Mutation({self.role!r}, {self.kind!r}, {self.where}, {self.value})"


# --- drawing mutations ------------------------------------------------------------------


def _kinds(json_like: bool, lines: bool) -> tuple[str, ...]:
    return BYTE_KINDS + (JSON_KINDS if json_like else ()) + (LINE_KINDS if lines else ())


def random_mutations(rng: random.Random, roles: dict[str, str], most: int = 3) -> list[Mutation]:
    """1..``most`` mutations of files in ``roles`` (role -> "bin" | "json" | "lines")."""
    out = []
    for _ in range(rng.randint(1, most)):
        role = rng.choice(sorted(roles))
        kind = rng.choice(_kinds(roles[role] != "bin", roles[role] == "lines"))
        out.append(Mutation(role, kind, rng.getrandbits(32), rng.getrandbits(32)))
    return out


def strategy(roles: dict[str, str], most: int = 3):
    """The Hypothesis strategy for what ``random_mutations`` draws (imports hypothesis)."""
    from hypothesis import strategies as st

    ints = st.integers(0, 2**32 - 1)

    def one(role: str):
        kinds = _kinds(roles[role] != "bin", roles[role] == "lines")
        return st.builds(Mutation, st.just(role), st.sampled_from(kinds), ints, ints)

    # one strategy per role, made once: a flatmap would build one per draw, which cost more
    # than running the case
    return st.lists(st.one_of([one(role) for role in sorted(roles)]), min_size=1, max_size=most)


# --- applying them ----------------------------------------------------------------------


def apply(m: Mutation, path: Path, form: str, zones: dict[str, tuple[int, int]]) -> None:
    """Damage ``path`` (of ``form`` "bin" | "json" | "lines") as ``m`` says, in place.

    ``zones`` gives the byte ranges of a data file's parts (``ZONES``) for ``flip``.
    """
    data = path.read_bytes()
    if m.kind in BYTE_KINDS or (m.kind == "cut"):
        data = _bytes(m, data, zones)
    elif form == "lines":
        data = _lines(m, data)
    else:
        doc = _json_or_none(data)
        data = _text(_json_edit(m, doc)) if doc is not None else _bytes(m, data, zones)
    path.write_bytes(data)


def _bytes(m: Mutation, data: bytes, zones: dict[str, tuple[int, int]]) -> bytes:
    if not data:
        return bytes([m.value & 0xFF]) if m.kind == "extend" else data
    if m.kind in ("truncate", "cut"):
        return data[: m.where % len(data)]
    if m.kind == "extend":
        return data + bytes([m.value & 0xFF]) * (m.value % 4096 + 1)
    zone = ZONES[m.value % len(ZONES)]
    lo, hi = zones.get(zone, (0, len(data)))
    hi = min(hi, len(data))
    lo, hi = (lo, hi) if lo < hi else (0, len(data))
    pos = lo + m.where % (hi - lo)
    flipped = bytearray(data)
    flipped[pos] ^= (m.value >> 8) % 255 + 1
    return bytes(flipped)


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _text(doc: Any, indent: int | None = 1) -> bytes:
    text = json.dumps(doc, indent=indent)  # ASCII: a lone surrogate survives as \ud800
    deep = '"\\u0000deep\\u0000"'
    return text.replace(deep, "[" * 5000 + "]" * 5000).encode("ascii")


def _nodes(doc: Any, at: tuple = ()) -> list[tuple]:
    """Every path below the root, depth first."""
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    out = []
    for key, value in items:
        out.append((*at, key))
        out.extend(_nodes(value, (*at, key)))
    return out


def _json_edit(m: Mutation, doc: Any) -> Any:
    if m.kind == "section" and isinstance(doc, dict) and isinstance(doc.get("sections"), dict):
        return _section(m, doc)
    nodes = _nodes(doc)
    if not nodes:
        return REPLACEMENTS[m.value % len(REPLACEMENTS)]
    at = nodes[m.where % len(nodes)]
    parent = doc
    for key in at[:-1]:
        parent = parent[key]
    key = at[-1]
    if m.kind == "delete":
        del parent[key]
    elif m.kind == "retype":
        parent[key] = REPLACEMENTS[m.value % len(REPLACEMENTS)]
    else:  # revalue (and section on a document without sections)
        parent[key] = _revalue(parent[key], m.value)
    return doc


def _section(m: Mutation, doc: dict) -> dict:
    entry = doc["sections"].get(SECTIONS[m.where % len(SECTIONS)])
    if not isinstance(entry, dict):
        return doc
    key = ("offset", "nbytes")[m.value % 2]
    old = entry.get(key, 0) if isinstance(entry.get(key), int) else 0
    delta = DELTAS[(m.value // 2) % len(DELTAS)]
    entry[key] = 0 if delta == "zero" else old * 2 if delta == "double" else old + delta
    return doc


def _revalue(v: Any, pick: int) -> Any:
    if isinstance(v, bool):
        choices: tuple = (not v, int(v), str(v).lower())
    elif isinstance(v, int):
        choices = (v + 1, v - 1, -v - 1, v * 2, v + 64, v - 64, v + 4096, 0, 2**62, 2**64 + v,
                   10**20, -1, 10**400)  # fmt: skip
    elif isinstance(v, float):
        choices = (
            v * 2,
            -v,
            0.0,
            float("nan"),
            float("inf"),
            1e300,
            int(v) if math.isfinite(v) else 0,
        )
    elif isinstance(v, str):
        choices = ("", v + "x", v[:-1], "..", ".", "/etc/passwd", "a/../b", "a\x00b", "a\\b",
                   "\u00e9" + v, "\ud800", "x" * 300, v.upper())  # fmt: skip
    elif isinstance(v, list):
        choices = (v[:-1], v + [v[-1] if v else 0], [], v[::-1], v * 2, [v])
    elif isinstance(v, dict):
        first = next(iter(v), None)
        choices = ({}, {k: x for k, x in v.items() if k != first}, dict.fromkeys(v), {**v, "x": 1})
    else:
        choices = (0, "", {}, [])
    return choices[pick % len(choices)]


def _lines(m: Mutation, data: bytes) -> bytes:
    lines = data.splitlines(keepends=True)
    if not lines:
        return data
    k = m.where % len(lines)
    if m.kind == "drop":
        del lines[k]
    elif m.kind == "dup":
        lines.insert(k, lines[k])
    elif m.kind == "swap":
        j = m.value % len(lines)
        lines[k], lines[j] = lines[j], lines[k]
    else:  # a JSON edit of one line, keeping its newline
        doc = _json_or_none(lines[k])
        if doc is not None:
            edited = _text(_json_edit(Mutation(m.role, m.kind, m.value, m.value >> 5), doc), None)
            lines[k] = edited + (b"\n" if lines[k].endswith(b"\n") else b"")
    return b"".join(lines)
