"""pack_folder(): records equal decode_image output, bad files, workers, outputs, shards."""

from __future__ import annotations

import errno
import os
import shutil
import time
import warnings
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
from conftest import records, write_image
from decoded import decode_image
from PIL import Image

from imgpack.errors import OutputExistsError, PackError, SourceError
from imgpack.format.index import read_index
from imgpack.format.write import record_checksum
from imgpack.packer import decode, parallel
from imgpack.packer.decode import DecodeSettings
from imgpack.packer.pack import pack_folder
from imgpack.packer.writer import PackWriter, digest_stored, partial_path
from imgpack.shards import shard_slice


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file())


@pytest.fixture
def mixed(tmp_path):
    """Two classes, JPEG + PNG, a nested folder, a unicode name, and three bad files."""
    src = tmp_path / "src"
    for i in range(4):
        write_image(src / "cat" / f"{i}.jpg", 80, 60, seed=i)
    write_image(src / "cat" / "deep" / "inner.png", 50, 70, seed=9)
    write_image(src / "dog" / "ü-ñ.jpeg", 64, 64, seed=11)
    write_image(src / "dog" / "wide.png", 120, 10, seed=12)
    (src / "dog" / "empty.jpg").write_bytes(b"")
    (src / "dog" / "notes.png").write_bytes(b"this is not a png")
    good = (src / "cat" / "0.jpg").read_bytes()
    (src / "dog" / "cut.jpg").write_bytes(good[: len(good) // 3])
    return src


def test_records_are_decode_image_output_in_order(mixed, tmp_path):
    out = tmp_path / "out" / "p.bin"
    out.parent.mkdir()
    summary = pack_folder(mixed, out, size=(24, 16), resize="pad", workers=1, progress=False)
    pix, labels, paths, crcs, index = records(out)
    settings = DecodeSettings(24, 16, resize="pad")
    skipped = {s["path"] for s in index.raw["skipped"]}
    expect = [
        ("cat/0.jpg", 0), ("cat/1.jpg", 0), ("cat/2.jpg", 0), ("cat/3.jpg", 0),
        ("cat/deep/inner.png", 0), ("dog/wide.png", 1), ("dog/ü-ñ.jpeg", 1),
    ]  # fmt: skip
    assert list(zip(paths, labels.tolist())) == expect
    assert index.shape == (16, 24, 3) and index.classes == ("cat", "dog")
    for i, (rel, _) in enumerate(expect):
        want = decode_image(mixed / rel, settings)
        np.testing.assert_array_equal(pix[i], want, err_msg=rel)
        assert int(crcs[i]) == record_checksum(want)
    assert skipped == {"dog/empty.jpg", "dog/notes.png", "dog/cut.jpg"}
    assert summary.count == 7 and len(summary.skipped) == 3 and summary.processed == 10
    assert summary.bytes == out.stat().st_size and summary.index == index.raw
    # stats are exact over the packed pixels
    flat = pix.reshape(-1, 3).astype(np.float64) / 255
    np.testing.assert_allclose(index.mean, flat.mean(0), rtol=1e-9)
    np.testing.assert_allclose(index.std, flat.std(0), rtol=1e-9)
    packer = index.raw["packer"]
    assert packer["size"] == [24, 16] and packer["resize"] == "pad"
    assert packer["labels"] == "folders" and packer["source"] == "src"
    assert index.raw["shard"] == {"index": 0, "count": 1, "source_files": 10,
                                  "source_range": [0, 10]}  # fmt: skip
    assert str(tmp_path) not in out.with_suffix(".json").read_text()  # no absolute paths
    lines = summary.lines()
    assert "packed 7 images" in lines[0] and "skipped 3" in lines[0]
    assert "dog/empty.jpg (empty file" in lines[1] and "see p.json 'skipped'" in lines[1]
    assert leftovers(out.parent) == ["p.bin", "p.json"]


@pytest.mark.parametrize(
    ("workers", "kw"),
    [(3, {}), (3, {"resize": "fit", "codec": "yuv420"}), (2, {"resize": "fit"})],
)
def test_output_is_byte_identical_whatever_the_workers(mixed, tmp_path, workers, kw):
    outs = {}
    for w in (1, workers):
        out = tmp_path / f"w{w}" / "p.bin"
        out.parent.mkdir()
        pack_folder(mixed, out, size=(20, 20), workers=w, progress=False, **kw)
        outs[w] = out
    for suffix in (".bin", ".json"):
        a = outs[1].with_suffix(suffix).read_bytes()
        assert a == outs[workers].with_suffix(suffix).read_bytes(), suffix


def test_spawned_workers_give_the_same_bytes(image_folder, tmp_path):
    src = image_folder(per_class=4)
    a, b = tmp_path / "a" / "p.bin", tmp_path / "b" / "p.bin"
    for out, kw in ((a, {"workers": 1}), (b, {"workers": 2, "start_method": "spawn"})):
        out.parent.mkdir()  # fit + yuv420: records of their own sizes, pickled, not in a ring
        pack_folder(src, out, size=(16, 16), progress=False, resize="fit", codec="yuv420", **kw)
    assert a.read_bytes() == b.read_bytes()
    assert a.with_suffix(".json").read_bytes() == b.with_suffix(".json").read_bytes()


def test_on_error_fail_stops_and_leaves_nothing(mixed, tmp_path):
    out = tmp_path / "out" / "p.bin"
    out.parent.mkdir()
    for workers in (1, 2):
        with pytest.raises(SourceError, match=r"dog/cut\.jpg: .*[Tt]runcated.*nothing written"):
            pack_folder(mixed, out, size=(16, 16), on_error="fail", workers=workers)
        assert leftovers(out.parent) == []


def test_existing_output_is_refused_and_force_overwrites(image_folder, tmp_path):
    src = image_folder()
    out = tmp_path / "p.bin"
    pack_folder(src, out, size=(8, 8), workers=1)
    before = out.read_bytes()
    with pytest.raises(OutputExistsError, match="p.bin: already exists; use --force"):
        pack_folder(src, out, size=(12, 12), workers=1)
    out.unlink()  # the index alone also counts
    with pytest.raises(OutputExistsError, match="p.json: already exists"):
        pack_folder(src, out, size=(12, 12), workers=1)
    pack_folder(src, out, size=(12, 12), workers=1, force=True)
    assert out.read_bytes() != before and read_index(out).shape == (12, 12, 3)


def test_an_interrupted_run_is_refused_only_with_resume_false(image_folder, tmp_path):
    src = image_folder()
    out = tmp_path / "p.bin"
    partial_path(out).write_bytes(b"x" * 100)
    with pytest.raises(OutputExistsError, match="an interrupted pack is here;.* or use --force"):
        pack_folder(src, out, size=(8, 8), workers=1, resume=False)
    notes = []
    summary = pack_folder(src, out, size=(8, 8), workers=1, notify=notes.append)
    assert summary.resumed == 0 and summary.count == 6 and notes == []  # no journal: afresh
    assert leftovers(tmp_path) == ["p.bin", "p.json"]


def test_bad_output_paths(image_folder, tmp_path):
    src = image_folder()
    with pytest.raises(PackError, match="nowhere: output folder does not exist"):
        pack_folder(src, tmp_path / "nowhere" / "p.bin")
    with pytest.raises(PackError, match="must be named NAME.bin"):
        pack_folder(src, tmp_path / "p.pack")
    with pytest.raises(SourceError, match="does not exist"):
        pack_folder(tmp_path / "missing", tmp_path / "p.bin")
    assert leftovers(tmp_path) == []


def test_free_space_is_checked_before_anything_is_written(image_folder, tmp_path, monkeypatch):
    src = image_folder(per_class=5)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 5000, 5000))
    with pytest.raises(
        PackError, match=r"pack of 10 images needs [0-9.]+ kB but only 5.0 kB is free$"
    ):
        pack_folder(src, tmp_path / "p.bin", size=(32, 32))
    assert leftovers(tmp_path) == []


def test_full_disk_mid_write_keeps_the_partial_for_resume(image_folder, tmp_path, monkeypatch):
    src = image_folder(per_class=5)
    out = tmp_path / "p.bin"
    real_append, calls = PackWriter.append, []

    def append(self, *a, **kw):
        calls.append(1)
        if len(calls) == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(self, *a, **kw)

    monkeypatch.setattr(PackWriter, "append", append)
    full = "disk full after 3 records.*rerun the same command to continue"
    with pytest.raises(PackError, match=full):
        pack_folder(src, out, size=(16, 16), workers=1)
    assert leftovers(tmp_path) == ["p.bin.partial", "p.bin.partial.journal"]
    monkeypatch.setattr(PackWriter, "append", real_append)
    notes = []
    summary = pack_folder(src, out, size=(16, 16), workers=1, notify=notes.append)  # the same
    assert summary.resumed == 3 and summary.processed == 7
    assert notes == [
        "resuming: 3 of 10 images already packed (an interrupted run of the same command)"
    ]
    fresh = tmp_path / "fresh" / "p.bin"
    fresh.parent.mkdir()
    pack_folder(src, fresh, size=(16, 16), workers=2)
    assert out.read_bytes() == fresh.read_bytes()
    assert out.with_suffix(".json").read_bytes() == fresh.with_suffix(".json").read_bytes()


def _fail_on(name, action):
    real = decode.decode_record  # what workers call

    def fake(path, settings, **kw):
        if Path(path).name == name:
            action()
        return real(path, settings, **kw)

    return fake


def test_unexpected_worker_error_names_the_file(image_folder, tmp_path, monkeypatch):
    src = image_folder(per_class=6)

    def boom():
        raise RuntimeError("decoder bug")

    # forked workers see it
    monkeypatch.setattr(decode, "decode_record", _fail_on("002.jpg", boom))
    with pytest.raises(PackError, match=r"cat/002.jpg: unexpected RuntimeError.*decoder bug"):
        pack_folder(src, tmp_path / "p.bin", size=(8, 8), workers=2)
    assert not (tmp_path / "p.bin").exists()


def test_a_dying_worker_is_reported_not_waited_for(image_folder, tmp_path, monkeypatch):
    src = image_folder(per_class=6)
    monkeypatch.setattr(decode, "decode_record", _fail_on("003.jpg", lambda: os._exit(9)))
    with pytest.raises(PackError, match="a worker process died"):
        pack_folder(src, tmp_path / "p.bin", size=(8, 8), workers=2)


def test_a_hung_worker_times_out_and_is_killed(image_folder, tmp_path, monkeypatch):
    src = image_folder(per_class=4)
    monkeypatch.setattr(decode, "decode_record", _fail_on("001.jpg", lambda: time.sleep(60)))
    monkeypatch.setattr(parallel, "WORKER_TIMEOUT_S", 0.5)
    t0 = time.monotonic()
    with pytest.raises(PackError, match=r"cat/001.jpg.*no result from a worker in 0.5 s"):
        pack_folder(src, tmp_path / "p.bin", size=(8, 8), workers=2)
    assert time.monotonic() - t0 < 30  # the sleeping worker was terminated, not awaited


@pytest.mark.parametrize("side", [8, 224, 1024, 4096, 8192, 20000])
@pytest.mark.parametrize("workers", [1, 2, 16, 64, 256])
def test_the_records_in_flight_stay_within_the_stated_bound(side, workers):
    """At most max(256 MiB, 2 records) decoded and not yet written, whatever --size and
    --workers; fewer workers decode where larger records would pass it."""
    rb = side * side * 3
    for n in (3, 1000, 10**6):
        chunk, window, used = parallel.plan(n, workers, rb)
        assert chunk >= 1 and 1 <= used <= workers and window > used
        assert chunk * window * rb <= max(256 << 20, 2 * rb)
        assert chunk * rb <= max(32 << 20, rb)
    if rb * (workers + 1) <= 256 << 20:
        assert used == workers  # every worker, wherever the bound allows


def test_shards_together_are_the_whole_pack(mixed, tmp_path):
    full = tmp_path / "full.bin"
    pack_folder(mixed, full, size=(12, 12), workers=1)
    fpix, flab, fpaths, _, findex = records(full)
    pix, lab, paths, skipped = [], [], [], []
    for i in range(3):
        out = tmp_path / f"shard{i}.bin"
        pack_folder(mixed, out, size=(12, 12), workers=2, num_shards=3, shard_index=i)
        p, lb, pa, _, index = records(out)
        assert index.classes == findex.classes  # classes come from all of SRC
        cut = shard_slice(10, 3, i)
        assert index.raw["shard"] == {"index": i, "count": 3, "source_files": 10,
                                      "source_range": [cut.start, cut.stop]}  # fmt: skip
        pix.append(p), lab.extend(lb.tolist()), paths.extend(pa)
        skipped += index.raw["skipped"]
    np.testing.assert_array_equal(np.concatenate(pix), fpix)
    assert lab == flab.tolist() and paths == fpaths
    assert skipped == findex.raw["skipped"]


def test_unlabelled_pack(mixed, tmp_path):
    out = tmp_path / "p.bin"
    pack_folder(mixed, out, size=(8, 8), labels="none", workers=1)
    _, labels, paths, _, index = records(out)
    assert index.classes == () and set(labels.tolist()) == {-1} and len(paths) == 7
    assert index.raw["packer"]["labels"] == "none"


def test_non_utf8_file_name_is_skipped_not_fatal(image_folder, tmp_path):
    src = image_folder(per_class=2)
    try:
        name = os.path.join(os.fsencode(src / "cat"), b"caf\xe9.jpg")
        with open(name, "wb") as f:
            f.write((src / "cat" / "000.jpg").read_bytes())
    except OSError:
        pytest.skip("this file system refuses non-UTF-8 names")
    out = tmp_path / "p.bin"
    summary = pack_folder(src, out, size=(8, 8), workers=1)
    assert summary.count == 4
    assert summary.skipped == [{"path": "cat/caf\\xe9.jpg", "reason": summary.skipped[0]["reason"]}]
    assert "not valid UTF-8" in summary.skipped[0]["reason"]


def test_output_inside_the_source_folder_is_not_packed(image_folder, tmp_path):
    src = image_folder()
    out = src / "cat" / "p.bin"
    first = pack_folder(src, out, size=(8, 8), workers=1)
    again = pack_folder(src, out, size=(8, 8), workers=1, force=True)
    assert first.count == again.count == 6


def test_progress_bar_goes_to_stderr_when_asked(image_folder, tmp_path, capsys):
    src = image_folder()
    pack_folder(src, tmp_path / "p.bin", size=(8, 8), workers=1, progress=True)
    captured = capsys.readouterr()
    assert captured.out == "" and "6/6" in captured.err and "img/s" in captured.err
    pack_folder(src, tmp_path / "q.bin", size=(8, 8), workers=1)  # not a TTY: silent
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("workers", [1, 2])
def test_pillow_warnings_do_not_leak_from_a_pack(tmp_path, capfd, workers):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(2):  # a corrupt EXIF block: Pillow warns, we read it as "no rotation"
        exif = b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\xff\xff"
        Image.new("RGB", (16, 8), (255, 0, 0)).save(src / f"{i}.jpg", exif=exif)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = pack_folder(tmp_path / "src", tmp_path / "p.bin", size=(4, 4), workers=workers)
    assert summary.count == 2 and summary.skipped == []
    assert "EXIF" not in capfd.readouterr().err  # nor from a worker process


@pytest.mark.parametrize(
    "shape", [(224, 224, 3), (1, 1, 3), (256, 256, 3), (257, 256, 3), (3, 70001, 3), (70000, 2, 3)]
)
def test_digest_is_exact(shape):
    rng = np.random.default_rng(1)
    for pixels in (rng.integers(0, 256, shape, dtype=np.uint8), np.full(shape, 255, np.uint8)):
        flat = pixels.reshape(-1, 3).astype(np.int64)
        crc, sums, sums_sq = digest_stored(pixels, "raw", *shape[1::-1], 3)
        assert crc == record_checksum(pixels.tobytes())
        assert list(sums) == flat.sum(0).tolist()
        assert list(sums_sq) == (flat * flat).sum(0).tolist()


@pytest.mark.parametrize("size", [(224, 224), (1, 1), (300, 7)])
def test_digest_of_a_workers_image_equals_digest_stored(size):
    rng = np.random.default_rng(2)
    shape = (size[1], size[0], 3)
    for pixels in (rng.integers(0, 256, shape, dtype=np.uint8), np.full(shape, 255, np.uint8)):
        img = Image.fromarray(pixels)
        assert digest_stored(img.tobytes(), "raw", *size, 3, img) == digest_stored(
            pixels, "raw", *size, 3
        )


def test_no_more_than_a_window_of_chunks_is_ever_in_flight(image_folder, tmp_path, monkeypatch):
    """Workers start decoding a file only while fewer than window x chunk files wait to be
    written: one log, appended to by the workers as they start and by the writer as it
    writes, shows it."""
    src = image_folder(per_class=15)
    log = tmp_path / "log"
    monkeypatch.setattr(parallel, "plan", lambda n, workers, rb, unit=1: (2, 3, workers))
    real_decode, real_append = decode.decode_record, PackWriter.append

    def logged(mark, fn):
        def call(*a, **kw):
            if mark == "w":
                fn(*a, **kw)
            with open(log, "a") as f:
                f.write(mark)
            return None if mark == "w" else fn(*a, **kw)

        return call

    monkeypatch.setattr(decode, "decode_record", logged("d", real_decode))
    monkeypatch.setattr(PackWriter, "append", logged("w", real_append))
    summary = pack_folder(src, tmp_path / "p.bin", size=(8, 8), workers=2)
    waiting = np.cumsum([1 if m == "d" else -1 for m in log.read_text()])
    assert summary.count == 30 and waiting.max() <= 2 * 3 and waiting[-1] == 0


def test_free_space_messages_tell_close_sizes_apart(tmp_path, monkeypatch):
    from imgpack.packer.pack import check_free_space
    from imgpack.packer.verify import human_bytes

    assert [human_bytes(n) for n in (999, 999_960, 12_400_000, 3.1e9)] == [
        "999 B", "1.0 MB", "12.4 MB", "3.1 GB"]  # fmt: skip
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 0, 12_400_000))
    with pytest.raises(PackError, match="needs 12,410,000 bytes but only 12,400,000"):
        check_free_space(tmp_path, 12_410_000)
    with pytest.raises(PackError, match="needs 13.0 MB but only 12.4 MB is free"):
        check_free_space(tmp_path, 13_000_000)


def test_size_as_the_command_line_takes_it(image_folder, tmp_path):
    """pack_folder(size=32) and size="40x24" as a user types --size; a bad one is one line."""
    src = image_folder(per_class=1)
    assert read_index(pack_folder(src, tmp_path / "a.bin", size=32).out_bin).shape == (32, 32, 3)
    wide = pack_folder(src, tmp_path / "b.bin", size="40x24", resize="stretch")
    assert read_index(wide.out_bin).shape == (24, 40, 3)
    with pytest.raises(ValueError, match=r"^size 'big': expected N or WIDTHxHEIGHT"):
        pack_folder(src, tmp_path / "c.bin", size="big")
    assert not (tmp_path / "c.bin").exists()
