"""Interruption and --resume: real signals in a subprocess, torn files, changed settings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import write_image

from imgpack.errors import OutputExistsError, PackError, ResumeError
from imgpack.packer.journal import Journal, journal_path
from imgpack.packer.pack import pack_folder
from imgpack.packer.writer import PackWriter, partial_path

SIZE = (16, 12)

# pack-images with every decode slowed down, so that a test can stop it mid-way
DRIVER = """
import sys, time
from imgpack.packer import decode
real = decode.decode_record
def slow(path, settings, **kw):
    time.sleep(float(sys.argv[1]))
    return real(path, settings, **kw)
decode.decode_record = slow
from imgpack.packer.cli import main
main(sys.argv[2:], prog_name="pack-images")
"""


@pytest.fixture
def folder(tmp_path):
    src = tmp_path / "src"
    for c in range(3):
        for i in range(30):
            write_image(src / f"c{c}" / f"{i:02d}.jpg", 40, 30, seed=c * 100 + i)
    (src / "c1" / "05.jpg").write_bytes(b"broken")  # skips must survive a resume too
    return src


def fresh_pack(src, tmp_path, **kw) -> Path:
    out = tmp_path / "fresh" / "p.bin"
    out.parent.mkdir(exist_ok=True)
    if not out.exists():
        pack_folder(src, out, size=SIZE, workers=3, **kw)
    return out


def assert_same(a: Path, b: Path) -> None:
    assert a.read_bytes() == b.read_bytes()
    assert a.with_suffix(".json").read_bytes() == b.with_suffix(".json").read_bytes()


def journal_lines(out: Path) -> int:
    try:
        return journal_path(out).read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def start_and_stop(tmp_path, src, out, sig, *, delay=0.04, after=32, workers=2):
    """Run pack-images in a subprocess, send ``sig`` once ``after`` outcomes are journalled."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    args = [sys.executable, str(driver), str(delay), str(src), str(out), "--size", "16x12",
            "--workers", str(workers), "--quiet"]  # fmt: skip
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while journal_lines(out) < after + 1 and proc.poll() is None:
        assert time.monotonic() < deadline, "pack-images never got going"
        time.sleep(0.01)
    assert proc.poll() is None, f"finished before it could be stopped: {proc.stderr.read()}"
    workers_pids = [p.pid for p in psutil.Process(proc.pid).children()]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err, workers_pids


def test_sigkill_then_resume_is_byte_identical(folder, tmp_path):
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    rc, _, workers = start_and_stop(tmp_path, folder, out, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "p.bin.partial",
        "p.bin.partial.journal",
    ]
    assert len(workers) == 2
    deadline = time.monotonic() + 20  # orphaned workers die with their parent
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in workers):
        assert time.monotonic() < deadline, "workers outlived their killed parent"
        time.sleep(0.05)
    summary = pack_folder(folder, out, size=SIZE, workers=1, resume=True)
    assert 32 <= summary.resumed < 90 and summary.resumed + summary.processed == 90
    assert_same(out, fresh_pack(folder, tmp_path))
    assert not partial_path(out).exists() and not journal_path(out).exists()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_keeps_the_partial_and_says_resume(folder, tmp_path, sig, code):
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    rc, err, _ = start_and_stop(tmp_path, folder, out, sig)
    assert rc == code
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "p.bin.partial is kept" in lines[0] and "--resume" in lines[0]
    assert "Traceback" not in err
    assert not out.exists() and not out.with_suffix(".json").exists()
    # a graceful stop journals everything written so far, so nothing is redone
    summary = pack_folder(folder, out, size=SIZE, workers=2, resume=True)
    assert summary.resumed >= 32
    assert_same(out, fresh_pack(folder, tmp_path))


def interrupt_after(monkeypatch, n):
    """Make the n-th PackWriter.append raise KeyboardInterrupt, as Ctrl-C would."""
    real, calls = PackWriter.append, []

    def append(self, *a, **kw):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(self, *a, **kw)

    monkeypatch.setattr(PackWriter, "append", append)
    return lambda: monkeypatch.setattr(PackWriter, "append", real)


def stopped_run(folder, tmp_path, monkeypatch, n=50) -> Path:
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    restore = interrupt_after(monkeypatch, n)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(folder, out, size=SIZE, workers=1)
    restore()
    return out


def test_resume_redoes_nothing_that_was_finished(folder, tmp_path, monkeypatch):
    out = stopped_run(folder, tmp_path, monkeypatch, n=50)
    summary = pack_folder(folder, out, size=SIZE, workers=2, resume=True)
    assert summary.resumed == 50  # 49 records and the broken file
    assert_same(out, fresh_pack(folder, tmp_path))


def test_torn_journal_line_and_torn_record_are_redone(folder, tmp_path, monkeypatch):
    out = stopped_run(folder, tmp_path, monkeypatch, n=50)
    part = partial_path(out)
    with open(part, "r+b") as f:  # cut the last record in half, as a crash mid-write would
        f.truncate(part.stat().st_size - 16 * 12 * 3 // 2)
    with open(journal_path(out), "ab") as f:
        f.write(b'{"i": 50, "path": "c1/2')
    summary = pack_folder(folder, out, size=SIZE, workers=1, resume=True)
    assert summary.resumed == 49
    assert_same(out, fresh_pack(folder, tmp_path))


def test_a_damaged_kept_record_is_redone_not_trusted(folder, tmp_path, monkeypatch):
    out = stopped_run(folder, tmp_path, monkeypatch, n=50)
    with open(partial_path(out), "r+b") as f:
        f.seek(4096 + 20 * 16 * 12 * 3 + 7)  # inside record 20
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    summary = pack_folder(folder, out, size=SIZE, workers=1, resume=True)
    assert summary.resumed == 20
    assert_same(out, fresh_pack(folder, tmp_path))


def test_resume_with_other_settings_is_refused_and_loses_nothing(folder, tmp_path, monkeypatch):
    out = stopped_run(folder, tmp_path, monkeypatch)
    before = (partial_path(out).read_bytes(), journal_path(out).read_bytes())
    with pytest.raises(ResumeError, match=r"settings differ: --size 16x12 then, 24x24 now"):
        pack_folder(folder, out, size=(24, 24), workers=1, resume=True)
    with pytest.raises(ResumeError, match=r"--resize \"center-crop\" then, \"pad\" now"):
        pack_folder(folder, out, size=SIZE, resize="pad", workers=1, resume=True)
    with pytest.raises(ResumeError, match="--on-error"):
        pack_folder(folder, out, size=SIZE, on_error="fail", workers=1, resume=True)
    write_image(folder / "c2" / "99.jpg", 20, 20)
    with pytest.raises(ResumeError, match=r"source folder changed .*\(90 files then, 91 now\)"):
        pack_folder(folder, out, size=SIZE, workers=1, resume=True)
    assert (partial_path(out).read_bytes(), journal_path(out).read_bytes()) == before


def test_unknown_journal_is_refused(folder, tmp_path):
    out = tmp_path / "p.bin"
    journal_path(out).write_text(json.dumps({"something": "else"}) + "\n")
    with pytest.raises(ResumeError, match="not a resume journal.*--force"):
        pack_folder(folder, out, size=SIZE, workers=1, resume=True)
    assert journal_path(out).exists()
    pack_folder(folder, out, size=SIZE, workers=1, force=True)
    assert not journal_path(out).exists()


def test_resume_with_nothing_to_resume_packs_afresh(folder, tmp_path):
    out = tmp_path / "p.bin"
    summary = pack_folder(folder, out, size=SIZE, workers=2, resume=True)
    assert summary.resumed == 0 and summary.count == 89
    with pytest.raises(OutputExistsError, match="already exists"):
        pack_folder(folder, out, size=SIZE, workers=2, resume=True)


def test_two_runs_cannot_write_one_output(folder, tmp_path):
    out = tmp_path / "p.bin"
    holder = Journal(out)  # another run holds the lock
    try:
        with pytest.raises(PackError, match="another pack-images run is writing"):
            pack_folder(folder, out, size=SIZE, workers=1, force=True)
    finally:
        holder.remove()


@pytest.mark.parametrize("path", ["c0/01.jpg", 'a "quoted"\\back\tslash.jpg', "фото/写真 été.png"])
def test_journal_record_lines_are_json_dumps_of_the_entry(tmp_path, path):
    journal = Journal(tmp_path / "p.bin")
    try:
        digest = (4294967295, (1, 2, 3), (10**12, 5, 0))
        journal.add_record(7, path, digest)
        entry = {"i": 7, "path": path, "crc": digest[0], "sum": [1, 2, 3], "sum_sq": [10**12, 5, 0]}
        assert journal._pending == [json.dumps(entry) + "\n"]
        geometry = ((4000, 3000), (500.0, 0.0, 3500.0, 3000.0), (0.0, 1 / 3, 224.0, 223.5))
        journal.add_record(8, path, (9, (1,), (2,)), geometry)  # one channel, with geometry
        entry = {"i": 8, "path": path, "crc": 9, "sum": [1], "sum_sq": [2]}
        entry["geo"] = [4000, 3000, 500.0, 0.0, 3500.0, 3000.0, 0.0, 1 / 3, 224.0, 223.5]
        assert journal._pending[1] == json.dumps(entry) + "\n"
    finally:
        journal.remove()
