"""The resume journal's own rules, found by the fuzzer: lines it must not believe."""

from __future__ import annotations

import json

import pytest
from conftest import interrupt_after, write_image

from imgpack.packer.journal import journal_path
from imgpack.packer.pack import pack_folder

SIZE = (8, 6)


@pytest.fixture
def interrupted(tmp_path, monkeypatch):
    """(src, out, fresh): a pack stopped after 4 records, and the same pack made in one go."""
    src = tmp_path / "src"
    for k in range(6):
        write_image(src / "ab"[k % 2] / f"{k}.png", 8, 6, seed=k)
    fresh = tmp_path / "fresh" / "p.bin"
    fresh.parent.mkdir()
    pack_folder(src, fresh, size=SIZE, workers=1, progress=False)
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    restore = interrupt_after(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(src, out, size=SIZE, workers=1, progress=False)
    restore()
    return src, out, fresh


def edit_line(out, k, change):
    """Apply ``change`` to the dict on journal line ``k`` (0 is the header)."""
    path = journal_path(out)
    lines = path.read_bytes().splitlines(keepends=True)
    entry = json.loads(lines[k])
    change(entry)
    lines[k] = json.dumps(entry).encode() + b"\n"
    path.write_bytes(b"".join(lines))


@pytest.mark.parametrize(
    "change",
    [
        lambda e: e["sum"].__setitem__(0, 10**400),  # once an OverflowError in finish()
        lambda e: e["sum"].__setitem__(1, -5),
        lambda e: e["sum_sq"].__setitem__(2, e["sum_sq"][2] * 1000),
        lambda e: e["sum_sq"].__setitem__(0, 0),
        lambda e: e.update(sum=[0, 0, 0]),
    ],
)  # fmt: skip
def test_impossible_channel_sums_are_redone_not_believed(interrupted, change):
    src, out, fresh = interrupted
    edit_line(out, 2, change)  # the second record
    summary = pack_folder(src, out, size=SIZE, workers=1, progress=False, resume=True)
    assert summary.resumed == 1
    assert out.read_bytes() == fresh.read_bytes()
    assert out.with_suffix(".json").read_bytes() == fresh.with_suffix(".json").read_bytes()


@pytest.mark.parametrize(
    "change",
    [
        lambda e: e.update(i=True),  # line 1 is file 1: true == 1, but a bool is no index
        lambda e: e.update(crc=float(e["crc"])),
        lambda e: e["sum"].append(0),
        lambda e: e.update(sum_sq=[True, 0, 0]),
    ],
)
def test_lines_with_bools_or_wrong_lengths_end_the_kept_run(interrupted, change):
    src, out, fresh = interrupted
    edit_line(out, 2, change)
    assert pack_folder(src, out, size=SIZE, workers=1, progress=False, resume=True).resumed == 1
    assert out.read_bytes() == fresh.read_bytes()


def test_a_header_or_line_nested_too_deep_is_refused_or_redone(interrupted):
    src, out, fresh = interrupted
    path = journal_path(out)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:2] + [b"[" * 100_000 + b"\n"] + lines[2:]))
    assert pack_folder(src, out, size=SIZE, workers=1, progress=False, resume=True).resumed == 1
    assert out.read_bytes() == fresh.read_bytes()
