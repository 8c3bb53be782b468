"""Interruption and --resume: real signals in a subprocess, torn files, changed settings."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from click.testing import CliRunner
from conftest import interrupt_after, write_image

from imgpack.errors import OutputExistsError, PackError
from imgpack.format.index import read_index
from imgpack.format.write import write_json_atomic
from imgpack.packer import writer as writer_module
from imgpack.packer.cli import main
from imgpack.packer.journal import Journal, journal_path
from imgpack.packer.pack import pack_folder
from imgpack.packer.sources.folder import FolderSource
from imgpack.packer.writer import partial_path

SIZE = (16, 12)

# pack-images with every decode slowed down, so that a test can stop it mid-way
DRIVER = """
import os, sys, time
from imgpack.packer import decode, journal
real = decode.decode_record
def slow(path, settings, **kw):
    while not os.path.exists(os.environ.get("DECODE_AFTER", "/")):  # held until it exists
        time.sleep(0.01)
    time.sleep(float(sys.argv[1]))
    return real(path, settings, **kw)
decode.decode_record = slow
if os.environ.get("SLOW_CHECK"):  # checking a kept record takes a while, as on a cold cache
    check = journal.record_checksum
    def slow_check(data):
        open(os.environ["SLOW_CHECK"], "a").close()
        time.sleep(0.02)
        return check(data)
    journal.record_checksum = slow_check
if os.environ.get("LIST_AFTER"):  # listing the source lasts until that file exists
    from imgpack.packer.sources.folder import FolderSource
    make_listing = FolderSource.make_listing
    def late_listing(self):
        while not os.path.exists(os.environ["LIST_AFTER"]):
            time.sleep(0.01)
        return make_listing(self)
    FolderSource.make_listing = late_listing
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


def command(tmp_path, src, out, *extra, delay=0.0, workers=2):
    """The pack-images command line (through the slowing driver when ``delay``)."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    return [sys.executable, str(driver), str(delay), str(src), str(out), "--size", "16x12",
            "--workers", str(workers), "--quiet", *map(str, extra)]  # fmt: skip


def start_and_stop(tmp_path, src, out, sig, *extra, delay=0.04, after=32, workers=2, checking=None):
    """Run pack-images in a subprocess, send ``sig`` once ``after`` outcomes are journalled,
    or (``checking``, a marker path) once it checks the records an earlier run kept."""
    args = command(tmp_path, src, out, *extra, delay=delay, workers=workers)
    env = {**os.environ, "SLOW_CHECK": str(checking)} if checking else None
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    started = (lambda: checking.exists()) if checking else lambda: journal_lines(out) > after
    while not started() and proc.poll() is None:
        assert time.monotonic() < deadline, "pack-images never got going"
        time.sleep(0.01)
    assert proc.poll() is None, f"finished before it could be stopped: {proc.stderr.read()}"
    workers_pids = [p.pid for p in psutil.Process(proc.pid).children()]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err, workers_pids


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_keeps_the_partial_and_says_resume(folder, tmp_path, sig, code):
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    rc, err, _ = start_and_stop(tmp_path, folder, out, sig)
    assert rc == code
    lines = err.strip().splitlines()
    said = re.fullmatch(
        r"pack-images: interrupted with (\d+) records kept; rerun the same command to continue",
        lines[0],
    )
    assert len(lines) == 1 and said, err
    assert not out.exists() and not out.with_suffix(".json").exists()
    # a graceful stop journals everything written so far, so nothing is redone
    summary = pack_folder(folder, out, size=SIZE, workers=2, resume=True)
    assert summary.resumed >= int(said[1]) >= 32  # the records, and any files skipped
    assert_same(out, fresh_pack(folder, tmp_path))


def stopped_run(folder, tmp_path, monkeypatch, n=50) -> Path:
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    restore = interrupt_after(monkeypatch, n)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(folder, out, size=SIZE, workers=1)
    restore()
    return out


def resumed_count(stderr: str) -> int:
    line = next(x for x in stderr.splitlines() if "resuming: " in x)
    return int(line.split("resuming: ")[1].split(" of ")[0].replace(",", ""))


def test_a_rerun_stopped_while_it_checks_the_kept_records_keeps_them(folder, tmp_path):
    """Killed at about half, then rerun and stopped while it checks what was kept, by
    SIGINT and SIGTERM (which kills it there, as SIGKILL would) in turn: the next rerun
    still resumes every kept record."""
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    start_and_stop(tmp_path, folder, out, signal.SIGKILL, after=40)
    kept = journal_lines(out) - 1
    for sig in (signal.SIGINT, signal.SIGTERM):
        marker = tmp_path / f"checking-{sig}"
        rc, err, _ = start_and_stop(tmp_path, folder, out, sig, checking=marker)
        assert rc in (128 + sig, -sig)
        if sig == signal.SIGINT:  # what it says is true: the next rerun continues
            assert err.strip().splitlines()[-1].endswith("rerun the same command to continue")
        assert journal_lines(out) - 1 == kept
    again = rerun(tmp_path, folder, out)
    assert again.returncode == 0, again.stderr
    assert resumed_count(again.stderr) == kept >= 32
    assert_same(out, fresh_pack(folder, tmp_path))


def test_an_image_rewritten_between_the_kill_and_the_rerun_is_packed_again(folder, tmp_path):
    """A source file is pinned by its size and modification time: one rewritten in place
    after it was packed is packed again, one not yet packed is read as it is now, and a
    finished pack whose sources changed is not called complete."""
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    start_and_stop(tmp_path, folder, out, signal.SIGKILL, after=40)
    write_image(folder / "c0" / "03.jpg", 40, 30, seed=777)  # packed before the kill
    write_image(folder / "c2" / "29.jpg", 40, 30, seed=778)  # not packed yet
    again = rerun(tmp_path, folder, out)
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines()[0] == (
        "pack-images: c0/03.jpg changed since it was packed (its size or modification time): "
        "it and the images after it are packed again"
    )
    assert resumed_count(again.stderr) == 3  # c0/00..02
    assert_same(out, fresh_pack(folder, tmp_path))
    assert rerun(tmp_path, folder, out).stderr == ""  # complete: nothing changed since
    write_image(folder / "c1" / "00.jpg", 40, 30, seed=779)
    third = rerun(tmp_path, folder, out)
    assert third.returncode == 1
    assert third.stderr == (
        f"pack-images: error: {out}: already exists; use --force to overwrite it (a source "
        "file changed since it was packed: its size or modification time)\n"
    )


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
    with pytest.raises(PackError, match=r"settings differ: --size 16x12 then, 24x24 now"):
        pack_folder(folder, out, size=(24, 24), workers=1, resume=True)
    with pytest.raises(PackError, match=r"--resize \"center-crop\" then, \"pad\" now"):
        pack_folder(folder, out, size=SIZE, resize="pad", workers=1, resume=True)
    with pytest.raises(PackError, match="--on-error"):
        pack_folder(folder, out, size=SIZE, on_error="fail", workers=1, resume=True)
    write_image(folder / "c2" / "99.jpg", 20, 20)
    with pytest.raises(PackError, match=r"source folder changed .*\(90 files then, 91 now\)"):
        pack_folder(folder, out, size=SIZE, workers=1, resume=True)
    assert (partial_path(out).read_bytes(), journal_path(out).read_bytes()) == before


def test_unknown_journal_is_refused(folder, tmp_path):
    out = tmp_path / "p.bin"
    journal_path(out).write_text(json.dumps({"something": "else"}) + "\n")
    with pytest.raises(
        PackError, match="cannot resume p.bin: .*not a resume journal.*without --resume"
    ):
        pack_folder(folder, out, size=SIZE, workers=1, resume=True)
    assert journal_path(out).exists()
    pack_folder(folder, out, size=SIZE, workers=1, force=True)
    assert not journal_path(out).exists()


def test_resume_with_nothing_to_resume_fails_and_says_what_to_run(folder, tmp_path):
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    strict = rerun(tmp_path, folder, out, "--resume")  # resume or fail
    assert strict.returncode == 1
    assert strict.stderr == (
        "pack-images: error: cannot resume p.bin: nothing to resume (no interrupted pack of "
        "it here); run the same command without --resume to pack it from the start\n"
    )
    for force in (False, True):  # --force --resume: still nothing to continue
        with pytest.raises(PackError, match="nothing to resume.*without --resume"):
            pack_folder(folder, out, size=SIZE, workers=2, resume=True, force=force)
    assert list(out.parent.iterdir()) == []  # no journal, no partial left behind
    summary = pack_folder(folder, out, size=SIZE, workers=2)
    assert summary.resumed == 0 and summary.count == 89
    before = out.read_bytes(), out.with_suffix(".json").read_bytes()
    again = pack_folder(folder, out, size=SIZE, workers=2, resume=True)  # the same command
    assert again.complete and again.processed == 0 and again.count == 89
    assert "p.bin is already complete (89 images" in again.lines()[0]
    assert (out.read_bytes(), out.with_suffix(".json").read_bytes()) == before
    with pytest.raises(OutputExistsError, match="already exists; use --force.*other settings"):
        pack_folder(folder, out, size=(8, 8), workers=2, resume=True)


def test_resume_of_an_empty_journal_fails_and_keeps_it(folder, tmp_path):
    """A run killed before its journal's first line committed: nothing to continue."""
    out = tmp_path / "p.bin"
    journal_path(out).write_bytes(b'{"imgpack_journal": 2, "fingerp')  # torn header
    with pytest.raises(PackError, match="cannot resume p.bin: nothing to resume"):
        pack_folder(folder, out, size=SIZE, workers=1, resume=True)
    assert journal_path(out).exists() and not out.exists()
    assert pack_folder(folder, out, size=SIZE, workers=1).count == 89  # a plain rerun packs


def test_a_second_run_at_one_output_says_another_holds_it(folder, tmp_path, monkeypatch):
    """Two pack-images at one OUT.bin: the second, however it is called, is refused in one
    line from the start, before it lists anything, and the first's pack stands."""
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    go = tmp_path / "go"  # the first run decodes nothing until the second has been refused
    held = {**os.environ, "DECODE_AFTER": str(go)}
    first = subprocess.Popen(command(tmp_path, folder, out), stderr=subprocess.PIPE, env=held)
    deadline = time.monotonic() + 60
    while journal_lines(out) < 1:  # its header written: it holds the lock, and waits
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.005)
    with monkeypatch.context() as patch:  # refused before it lists the source
        patch.setattr(FolderSource, "make_listing", lambda self: pytest.fail("listed"))
        for extra in ((), ("--force",)):
            second = rerun(tmp_path, folder, out, *extra)
            assert second.returncode == 1
            assert second.stderr.endswith(
                "another pack-images run is writing this output right now\n"
            )
            assert len(second.stderr.splitlines()) == 1
    go.touch()
    assert first.wait(timeout=120) == 0
    assert_same(out, fresh_pack(folder, tmp_path))


def test_two_runs_cannot_write_one_output(folder, tmp_path):
    out = tmp_path / "p.bin"
    holder = Journal(out)  # another run holds the lock
    try:
        with pytest.raises(PackError, match="another pack-images run is writing"):
            pack_folder(folder, out, size=SIZE, workers=1, force=True)
    finally:
        holder.remove()


def test_odd_file_names_resume_byte_identical(tmp_path, monkeypatch):
    """Quotes, backslashes, tabs and non-ASCII names round-trip through the journal."""
    src = tmp_path / "src"
    names = ['a "quoted"\\back\tslash.jpg', "фото 写真 été.png", "plain.jpg"]
    for c in range(2):
        for k, name in enumerate(names * 3):
            write_image(src / f"c{c}" / f"{k}{name}", 40, 30, seed=c * 10 + k)
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    restore = interrupt_after(monkeypatch, 10)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(src, out, size=SIZE, workers=1)
    restore()
    assert pack_folder(src, out, size=SIZE, workers=1, resume=True).resumed >= 9
    assert_same(out, fresh_pack(src, tmp_path))


# --- a retrying pipeline: the same command, run again ---------------------------------------


def rerun(tmp_path, src, out, *extra):
    """The same command line again, as a retry loop runs it (in this process: cheaper)."""
    args = [src, out, "--size", "16x12", "--workers", "2", "--quiet", *extra]
    result = CliRunner().invoke(main, [str(a) for a in args], prog_name="pack-images")
    return SimpleNamespace(returncode=result.exit_code, stderr=result.stderr)


def test_a_killed_run_is_finished_by_the_identical_command(folder, tmp_path):
    """SIGKILL leaves the partial file and its journal (its workers die with it); the same
    command again continues it, byte-identical to a run never stopped."""
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    rc, _, workers = start_and_stop(tmp_path, folder, out, signal.SIGKILL)
    assert rc == -signal.SIGKILL and len(workers) == 2
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "p.bin.partial",
        "p.bin.partial.journal",
    ]
    deadline = time.monotonic() + 20  # orphaned workers die with their parent
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in workers):
        assert time.monotonic() < deadline, "workers outlived their killed parent"
        time.sleep(0.05)
    again = rerun(tmp_path, folder, out)  # what a retry loop does: the same line again
    assert again.returncode == 0, again.stderr
    note = again.stderr.strip().splitlines()
    assert len(note) == 1 and note[0].startswith("pack-images: resuming: ")
    done, total = note[0].split("resuming: ")[1].split(" images")[0].split(" of ")
    assert 32 <= int(done) < 90 and total == "90"
    assert_same(out, fresh_pack(folder, tmp_path))
    assert not partial_path(out).exists() and not journal_path(out).exists()
    third = rerun(tmp_path, folder, out)  # killed after it finished: still fine
    assert third.returncode == 0 and third.stderr == ""
    assert_same(out, fresh_pack(folder, tmp_path))


def test_a_killed_run_with_target_vectors_resumes_byte_identical(folder, tmp_path):
    labels = tmp_path / "labels.csv"
    rows = [f"c{c}/{i:02d}.jpg,c{c},{i} {c} {i * c / 7}" for c in range(3) for i in range(30)]
    labels.write_text("path,label,targets\n" + "\n".join(rows) + "\n")
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    rc, _, _ = start_and_stop(tmp_path, folder, out, signal.SIGKILL, "--labels", labels)
    assert rc == -signal.SIGKILL
    again = rerun(tmp_path, folder, out, "--labels", labels)
    assert again.returncode == 0 and "resuming: " in again.stderr, again.stderr
    fresh = tmp_path / "fresh" / "p.bin"
    fresh.parent.mkdir()
    pack_folder(folder, fresh, size=SIZE, workers=1, labels=labels)
    assert_same(out, fresh)
    # record 40 is file 41 (c1/11.jpg): c1/05.jpg is broken, so it has no record
    assert read_index(out).target_vectors()[40].tolist() == pytest.approx([11, 1, 11 / 7])


def test_another_command_starts_over_and_says_why(folder, tmp_path):
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    rc, _, _ = start_and_stop(tmp_path, folder, out, signal.SIGTERM)
    assert rc == 143
    strict = rerun(tmp_path, folder, out, "--resize", "pad", "--resume")  # resume or fail
    assert (
        strict.returncode == 1 and "cannot resume p.bin: settings differ: --resize" in strict.stderr
    )
    assert len(strict.stderr.splitlines()) == 1
    assert partial_path(out).exists() and journal_path(out).exists()  # nothing lost
    other = rerun(tmp_path, folder, out, "--resize", "pad")
    assert other.returncode == 0, other.stderr
    assert other.stderr == (
        "pack-images: starting over, the interrupted pack of p.bin differs: settings differ: "
        '--resize "center-crop" then, "pad" now\n'
    )
    fresh = tmp_path / "fresh" / "p.bin"
    fresh.parent.mkdir()
    pack_folder(folder, fresh, size=SIZE, resize="pad", workers=1)
    assert_same(out, fresh)


def test_force_discards_an_interrupted_run(folder, tmp_path, monkeypatch):
    out = stopped_run(folder, tmp_path, monkeypatch, n=50)
    notes = []
    summary = pack_folder(folder, out, size=SIZE, workers=1, force=True, notify=notes.append)
    assert summary.resumed == 0 and summary.processed == 90 and notes == []
    assert_same(out, fresh_pack(folder, tmp_path))


def test_a_changed_class_list_is_named(folder, tmp_path, monkeypatch):
    out = stopped_run(folder, tmp_path, monkeypatch, n=50)
    names = tmp_path / "classes.txt"
    names.write_text("c0\nc1\nc2\nc3\n")
    notes = []
    pack_folder(folder, out, size=SIZE, workers=1, classes_from=names, notify=notes.append)
    assert notes == [
        "starting over, the interrupted pack of p.bin differs: the class list changed since the "
        "interrupted run (3 classes then, 4 now: --classes-from or the class folders)"
    ]


def test_killed_while_publishing_the_same_command_still_finishes(folder, tmp_path, monkeypatch):
    fresh = fresh_pack(folder, tmp_path)
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    real = write_json_atomic

    def killed(path, obj):  # the .bin is renamed into place, then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(writer_module.fmt, "write_json_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(folder, out, size=SIZE, workers=1)
    assert out.exists() and not out.with_suffix(".json").exists() and journal_path(out).exists()
    monkeypatch.setattr(writer_module.fmt, "write_json_atomic", real)
    pack_folder(folder, out, size=SIZE, workers=1)
    assert_same(out, fresh)
    journal_path(out).write_text("left by a run killed after its .json appeared\n")
    assert pack_folder(folder, out, size=SIZE, workers=1).complete
    assert not journal_path(out).exists()


def test_ctrl_c_while_publishing_leaves_the_whole_pack(folder, tmp_path, monkeypatch):
    """A real Ctrl-C between the .bin's rename and its .json waits for the .json: the run stops
    with the pack whole and nothing of it left to resume, never with a .bin alone."""
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    real = write_json_atomic

    def ctrl_c_then_write(path, obj):
        signal.raise_signal(signal.SIGINT)  # Python's handler runs in this call, undeferred
        real(path, obj)

    monkeypatch.setattr(writer_module.fmt, "write_json_atomic", ctrl_c_then_write)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(folder, out, size=SIZE, workers=1)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    monkeypatch.setattr(writer_module.fmt, "write_json_atomic", real)
    assert sorted(p.name for p in out.parent.iterdir()) == ["p.bin", "p.json"]
    assert_same(out, fresh_pack(folder, tmp_path))


def test_edited_target_vectors_start_over(folder, tmp_path, monkeypatch):
    labels = tmp_path / "labels.csv"
    rows = [f"c{c}/{i:02d}.jpg,c{c},{i}" for c in range(3) for i in range(30)]
    labels.write_text("path,label,targets\n" + "\n".join(rows) + "\n")
    out = tmp_path / "p.bin"
    restore = interrupt_after(monkeypatch, 20)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(folder, out, size=SIZE, workers=1, labels=labels)
    restore()
    labels.write_text(labels.read_text().replace("c0/03.jpg,c0,3", "c0/03.jpg,c0,3.5"))
    notes = []
    pack_folder(folder, out, size=SIZE, workers=1, labels=labels, notify=notes.append)
    assert len(notes) == 1 and "settings differ: the target vectors " in notes[0]
    assert read_index(out).target_vectors()[3].tolist() == [3.5]


def test_a_killed_force_rerun_leaves_no_partial_beside_the_finished_pack(folder, tmp_path):
    """pack, pack --force (killed), pack: the pack is complete and the dead run's partial goes."""
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    assert rerun(tmp_path, folder, out).returncode == 0
    rc, _, _ = start_and_stop(tmp_path, folder, out, signal.SIGKILL, "--force")
    assert rc == -signal.SIGKILL and partial_path(out).exists()
    again = rerun(tmp_path, folder, out)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert not partial_path(out).exists() and not journal_path(out).exists()
    assert_same(out, fresh_pack(folder, tmp_path))


def test_a_killed_run_of_another_command_stays_beside_the_finished_pack(folder, tmp_path):
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    assert rerun(tmp_path, folder, out).returncode == 0
    rc, _, _ = start_and_stop(tmp_path, folder, out, signal.SIGKILL, "--force", "--filter", "box")
    assert rc == -signal.SIGKILL
    kept = partial_path(out).read_bytes()
    assert rerun(tmp_path, folder, out).returncode == 0  # the finished pack: nothing to do
    assert partial_path(out).read_bytes() == kept and journal_path(out).exists()
    resumed = rerun(tmp_path, folder, out, "--force", "--resume", "--filter", "box")
    assert resumed.returncode == 0 and "resuming: " in resumed.stderr, resumed.stderr


def test_disk_full_writing_the_index_resumes_every_record(folder, tmp_path, monkeypatch):
    """The .bin was complete when the .json hit a full disk: the retry redoes no image."""
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    real = write_json_atomic

    def full(path, obj):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer_module.fmt, "write_json_atomic", full)
    with pytest.raises(PackError, match="kept at p.bin: free space and rerun the same"):
        pack_folder(folder, out, size=SIZE, workers=1)
    monkeypatch.setattr(writer_module.fmt, "write_json_atomic", real)
    notes = []
    summary = pack_folder(folder, out, size=SIZE, workers=1, notify=notes.append)
    assert notes == [
        "resuming: 90 of 90 images already packed (an interrupted run of the same command)"
    ]
    assert summary.processed == 0 and summary.count == 89
    assert_same(out, fresh_pack(folder, tmp_path))
    assert not partial_path(out).exists() and not journal_path(out).exists()


def test_a_folder_packs_recipe_is_the_one_earlier_packs_recorded(tmp_path):
    """A folder pack's index says what format.md shows (labels, source: no source_kind),
    so its command_fingerprint is the one packs written before 'one describe for every
    kind' recorded: rerunning their command finds them complete (and resumes their
    interrupted runs) rather than refusing them as packed with other settings."""
    src = tmp_path / "src"
    write_image(src / "a" / "0.png", 20, 10, seed=1)
    pack_folder(src, tmp_path / "o.bin", size=SIZE, workers=1)
    packer = json.loads((tmp_path / "o.json").read_text())["packer"]
    assert {k: packer.get(k, "-") for k in ("labels", "source", "source_kind")} == {
        "labels": "folders",
        "source": "src",
        "source_kind": "-",
    }
    labels_file = tmp_path / "l.csv"
    labels_file.write_text("path,label\na/0.png,x\n")
    about = FolderSource(src, labels=str(labels_file)).describe()
    assert about == {"labels": "file", "labels_file": "l.csv", "source": "src"}
