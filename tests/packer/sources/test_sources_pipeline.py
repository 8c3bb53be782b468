"""Tar shards and Parquet files the way a pipeline uses them: the command run twice, the pack
in a plain DataLoader; Ctrl-C mid-shard, then the same command finishing the same bytes; a
shard changed in between, and the run starting over saying which."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from click.testing import CliRunner
from conftest import interrupt_after
from make_sources import samples, shard, write_parquet

from imgpack.errors import OutputExistsError
from imgpack.format.layout import HEADER_BYTES
from imgpack.packer.cli import main
from imgpack.packer.journal import journal_path
from imgpack.packer.pack import pack_folder
from imgpack.packer.writer import partial_path
from imgpack.reader.dataset import PackedImageDataset

pytest.importorskip("pyarrow")

# pack-images whose decoding workers hold the samples a file names (one a line) until the
# test's Ctrl-C stops the run, so that it cannot finish before the signal however late it comes;
# each record is handed to the OS as it is written, so that the partial file shows how far the
# run got (the journal keeps its batches: the stopped run's last flush must keep the rest)
DRIVER = """
import sys, time
from imgpack.packer import parallel, writer
append = writer.PackWriter.append
def append_and_flush(self, *args, **kwargs):
    append(self, *args, **kwargs)
    self.flush()
writer.PackWriter.append = append_and_flush
decode = parallel.decode_sample
held = set(open(sys.argv[1], encoding="utf-8").read().splitlines())
def hold(fetch, name, payload, settings):
    if name in held:
        time.sleep(120)  # the stopped run terminates its workers long before
    return decode(fetch, name, payload, settings)
parallel.decode_sample = hold
from imgpack.packer.cli import main
main(sys.argv[2:], prog_name="pack-images")
"""
RECORD = 16 * 12 * 3  # bytes of one record at --size 16x12
HELD = 40  # samples 40.. are held: the run stops in the third shard (or file) of 16


def written(partial) -> int:
    """Records on disk in a partial pack."""
    try:
        return max(0, partial.stat().st_size - HEADER_BYTES) // RECORD
    except FileNotFoundError:
        return 0


def journalled(journal) -> int:
    """Records a run's journal holds (its first line is the run's recipe)."""
    return journal.read_bytes().count(b"\n") - 1


def pack_images() -> list[str]:
    """The installed console script, as a pipeline runs it (or the same entry point)."""
    exe = shutil.which("pack-images")
    if exe is not None:
        return [exe]
    return [sys.executable, "-c", "import sys; from imgpack.packer.cli import main; "
            "main(sys.argv[1:], prog_name='pack-images')"]  # fmt: skip


def sources(tmp_path, kind: str) -> str:
    """48 samples in 3 shards (or Parquet files): the argument a user would type."""
    for s in range(3):
        rows = samples(16, first=16 * s)
        if kind == "tar":
            shard(tmp_path / "src" / f"train-{s:06d}.tar", rows)
        else:
            write_parquet(
                tmp_path / "src" / f"train-{s:05d}-of-00003.parquet", rows, names=list("abc")
            )
    if kind == "tar":
        return str(tmp_path / "src" / "train-{000000..000002}.tar")
    return str(tmp_path / "src" / "train-*-of-00003.parquet")


def test_the_command_twice_then_a_plain_dataloader(tmp_path):
    src = sources(tmp_path, "tar")
    out = tmp_path / "train.bin"
    args = [src, str(out), "--size", "16x12", "--workers", "2"]
    first = subprocess.run([*pack_images(), *args], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "packed 48 images into train.bin" in first.stderr
    again = CliRunner().invoke(main, args)  # the rest in this process: the same entry point
    assert again.exit_code == 0 and "train.bin is already complete (48 images" in again.stderr
    ds = PackedImageDataset(out)
    assert ds.classes == ["0", "1", "2"] and len(ds) == 48
    assert ds.samples[17] == ("train-000001.tar:s0017", 17 % 3)
    for sub, said in [("info", "train.bin: 48 records of 12x16x3"), ("verify", "OK, 48 records")]:
        shown = CliRunner().invoke(main, [sub, str(out)])
        assert shown.exit_code == 0 and said in shown.stdout, shown.output
    loader = torch.utils.data.DataLoader(ds, batch_size=10, shuffle=False, num_workers=2)
    labels = []
    for images, targets in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 12, 16)
        labels += targets.tolist()
    assert labels == [k % 3 for k in range(48)]


@pytest.mark.parametrize("kind", ["tar", "parquet"])
def test_ctrl_c_mid_shard_then_the_same_command_writes_the_same_bytes(tmp_path, kind):
    src = sources(tmp_path, kind)
    fresh = tmp_path / "fresh" / "p.bin"
    fresh.parent.mkdir()
    pack_folder(src, fresh, size=(16, 12), workers=1)
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    held = tmp_path / "held.txt"
    names = [name for name, _ in PackedImageDataset(fresh).samples]
    held.write_text("\n".join(names[HELD:]) + "\n", encoding="utf-8")
    args = [src, str(out), "--size", "16x12", "--workers", "2", "--quiet"]
    partial = partial_path(out)
    proc = subprocess.Popen([sys.executable, str(driver), str(held), *args],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        # two records into the third shard: the signal may cut the last one between its
        # write and its journal line, and the journal still holds one past the shard's start
        while proc.poll() is None and written(partial) <= 33:
            assert time.monotonic() < deadline, "pack-images never got going"
            time.sleep(0.01)
        assert proc.poll() is None, f"finished before it could be stopped: {proc.stderr.read()}"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err
    assert not out.exists() and partial.exists()
    kept = journalled(journal_path(out))  # every record written, the last batch's too,
    # but the one the signal may cut between its write and its journal line (a rerun drops it)
    assert 0 <= partial.stat().st_size - HEADER_BYTES - kept * RECORD <= RECORD
    rerun = CliRunner().invoke(main, args[:-1])  # the same command, in this process
    assert rerun.exit_code == 0, rerun.output
    done = int(rerun.stderr.split("resuming: ")[1].split(" of 48")[0])
    assert done == kept and 32 < kept <= HELD  # inside the third shard (or file), none redone
    assert err.strip().splitlines() == [
        f"pack-images: interrupted with {kept} records kept; rerun the same command to continue"
    ]
    assert out.read_bytes() == fresh.read_bytes()
    assert out.with_suffix(".json").read_bytes() == fresh.with_suffix(".json").read_bytes()


def test_a_changed_shard_starts_over_and_says_which(tmp_path, monkeypatch):
    src = sources(tmp_path, "tar")
    out = tmp_path / "p.bin"
    restore = interrupt_after(monkeypatch, 20)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(src, out, size=(16, 12), workers=1)
    restore()
    redownloaded = tmp_path / "src" / "train-000002.tar"
    before = redownloaded.stat().st_size
    shard(redownloaded, samples(30, first=32))  # another version of the shard
    notes = []
    summary = pack_folder(src, out, size=(16, 12), workers=1, notify=notes.append)
    after = redownloaded.stat().st_size
    assert notes == [
        "starting over, the interrupted pack of p.bin differs: the source files changed since "
        f"the interrupted run (train-000002.tar: {before:,} bytes then, {after:,} now)"
    ]
    assert summary.count == 62 and summary.resumed == 0
    restore = interrupt_after(monkeypatch, 20)
    other = tmp_path / "q.bin"
    with pytest.raises(KeyboardInterrupt):
        pack_folder(src, other, size=(16, 12), workers=1)
    restore()
    stat = redownloaded.stat()  # the same bytes, touched: nothing changed, it resumes
    os.utime(redownloaded, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    notes.clear()
    pack_folder(src, other, size=(16, 12), workers=1, notify=notes.append)
    assert notes[0].startswith("resuming: 19 of 62 images already packed")
    renamed = redownloaded.read_bytes().replace(b"s0061.", b"x0061.")  # the same size
    redownloaded.write_bytes(renamed)
    with pytest.raises(OutputExistsError) as err:
        pack_folder(src, other, size=(16, 12), workers=1)
    assert str(err.value) == (
        f"{other}: already exists; use --force to overwrite it (it was packed from other "
        f"source files: train-000002.tar: the same size, other contents)"
    )


@pytest.mark.parametrize("kind", ["tar", "parquet"])
def test_the_same_sources_copied_or_touched_give_the_same_pack(tmp_path, kind):
    src = sources(tmp_path, kind)
    first = tmp_path / "a.bin"
    pack_folder(src, first, size=(16, 12), workers=2)
    time.sleep(0.01)
    shutil.copytree(tmp_path / "src", tmp_path / "copy" / "src")  # new times, same bytes
    copied = src.replace(str(tmp_path), str(tmp_path / "copy"))
    second = tmp_path / "copy" / "a.bin"
    pack_folder(copied, second, size=(16, 12), workers=1)
    assert second.read_bytes() == first.read_bytes()
    assert second.with_suffix(".json").read_bytes() == first.with_suffix(".json").read_bytes()
    assert pack_folder(src, first, size=(16, 12), workers=1).complete
    for path in (tmp_path / "src").iterdir():  # touched: a file is pinned by its time too
        os.utime(path, ns=(10**18, 10**18))
    with pytest.raises(OutputExistsError, match="a source file changed since it was packed"):
        pack_folder(src, first, size=(16, 12), workers=1)


@pytest.mark.parametrize("kind", ["tar", "parquet"])
def test_bytes_changed_in_place_after_they_were_packed_are_packed_again(tmp_path, kind):
    """The same size, the same tar headers (Parquet footer): the file's time tells."""
    src = sources(tmp_path, kind)
    out = tmp_path / "run" / "p.bin"
    out.parent.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        interrupt_after(mp, 40)
        with pytest.raises(KeyboardInterrupt):
            pack_folder(src, out, size=(16, 12), workers=1)
    first = sorted((tmp_path / "src").iterdir())[1]  # its samples 16..31 were packed
    data = bytearray(first.read_bytes())
    at = data.index(samples(16, first=16)[3][2][-600:])  # inside sample 19's image
    data[at : at + 8] = bytes(255 - b for b in data[at : at + 8])
    time.sleep(0.01)
    first.write_bytes(data)
    notes = []
    pack_folder(src, out, size=(16, 12), workers=1, notify=notes.append)
    assert notes[0].endswith("changed since it was packed (its size or modification time): "
                             "it and the images after it are packed again")  # fmt: skip
    assert notes[1].startswith("resuming: 16 of 48 images")
    fresh = tmp_path / "fresh" / "p.bin"
    fresh.parent.mkdir()
    pack_folder(src, fresh, size=(16, 12), workers=2)
    assert out.read_bytes() == fresh.read_bytes()


def test_the_reason_names_the_shard_that_is_new_gone_or_changed():
    from imgpack.packer.journal import recipe_diff

    base = {"files": 2, "files_sha256": "x", "classes": "c", "class_count": 1}
    then = {**base, "sources": [["a.tar", 10, 1], ["b.tar", 20, 2]]}
    cases = {
        (("a.tar", 10, 1), ("b.tar", 20, 2), ("c.tar", 5, 3)): "c.tar is new",
        (("a.tar", 10, 1),): "b.tar is gone",
        (("a.tar", 10, 1), ("b.tar", 21, 2)): "b.tar: 20 bytes then, 21 now",
        (("a.tar", 10, 1), ("b.tar", 20, 9)): "b.tar: the same size, other contents",
    }
    for sources, why in cases.items():
        now = {**base, "sources": [list(s) for s in sources]}
        assert (
            recipe_diff(then, now) == f"the source files changed since the interrupted run ({why})"
        )
    assert recipe_diff(then, dict(then)) is None
