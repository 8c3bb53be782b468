"""Nothing wrong is ever served: damaged, short and failed fetches are retried, then one
line naming the URL and the records; a changed object is never read from an old copy;
several processes share one cache folder, each block fetched once."""

# ruff: noqa: F811 - the fixtures of servers.py are imported, then asked for by name
from __future__ import annotations

import functools
import multiprocessing
import os
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from servers import http, reads, s3, s3_fs, s3_server, small_blocks  # noqa: F401 - fixtures

from imgpack import PackedImageDataset, make_loader
from imgpack.errors import InvalidArgumentError, MissingExtraError, PackChangedError
from imgpack.remote import RemoteError
from imgpack.remote.cache import allocated, parse_limit


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """Retries after 10, 20, 40 ms instead of a restarting endpoint's 2 s: as many tries."""
    from imgpack.remote import store

    monkeypatch.setattr(store, "BACKOFF_S", 0.01)


@pytest.fixture
def served(make_pack, http):
    """(http URL of a 64-record 64x64 pack, its pixels, the server)."""
    out, pixels, _ = make_pack(count=64, height=64, width=64)
    return f"{http.url}/{out.name}", pixels, http


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_cache_limit_takes_bytes_or_sizes_and_refuses_the_rest():
    assert parse_limit(None) is None and parse_limit(1000) == 1000
    assert parse_limit("50GB") == 50 * 10**9 and parse_limit("1.5 MiB") == 3 << 19
    assert parse_limit(10**30) == 10**30
    for bad in ("lots", -1, 0, True, 1.5, "5XB", "", "inf", float("inf"), "nan"):
        with pytest.raises(InvalidArgumentError, match="is not a size") as e:
            parse_limit(bad)
        one_line(e)


def test_bad_sources_are_one_line(served, tmp_path, monkeypatch):
    url, _, http = served
    with pytest.raises(RemoteError, match="nope.json: not found") as e:
        PackedImageDataset(url.replace("pack.bin", "nope.bin"), cache_dir=tmp_path)
    one_line(e)
    with pytest.raises(InvalidArgumentError, match="for a pack at a URL"):
        PackedImageDataset(tmp_path / "x.bin", cache_limit="1GB")
    with pytest.raises(InvalidArgumentError, match="too small") as e:
        PackedImageDataset(url, cache_dir=tmp_path, cache_limit=100_000)
    one_line(e)
    monkeypatch.setitem(__import__("sys").modules, "fsspec.core", None)
    with pytest.raises(MissingExtraError, match=r"pip install imgpack\[remote\]") as e:
        PackedImageDataset(url, cache_dir=tmp_path)
    one_line(e)


def test_a_server_that_ignores_ranges_is_said_at_once(make_pack, tmp_path):
    """``python -m http.server`` answers a ranged GET with the whole object: one line says
    so, after one request, since asking again cannot give the range."""
    out, _, _ = make_pack(count=8)
    ranged = []

    class Plain(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path.endswith(".bin"):
                ranged.append(self.headers.get("Range"))
            super().do_GET()

    handler = functools.partial(Plain, directory=str(out.parent))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{out.name}"
        with pytest.raises(RemoteError, match="does not support Range requests") as e:
            PackedImageDataset(url, cache_dir=tmp_path / "cache")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert f"{url}: its header: the server returned the whole object" in one_line(e)
    assert ranged == ["bytes=0-4095"]  # asked once, not retried


@pytest.mark.parametrize("fault", ["corrupt", "short"])
def test_a_damaged_or_short_fetch_is_retried(served, tmp_path, fault):
    url, pixels, http = served
    ds = PackedImageDataset(url, cache_dir=tmp_path)
    http.fault, http.faults = fault, 1
    assert (ds[4][0].permute(1, 2, 0).numpy() == pixels[4]).all()
    assert [r[1:] for r in http.ranges[-2:]] == [(3 * 12288 + 4096, 6 * 12288 + 4096)] * 2


def test_a_fetch_that_stays_damaged_is_one_line_and_never_cached(served, tmp_path):
    url, pixels, http = served
    ds = PackedImageDataset(url, cache_dir=tmp_path)
    http.fault, http.faults = "corrupt", 100
    with pytest.raises(RemoteError, match=r"pack.bin: records 3..5: record 3 fails its CRC-32"):
        ds[4]
    http.faults = 0  # the block was never marked present: it is fetched again, whole
    assert (ds[4][0].permute(1, 2, 0).numpy() == pixels[4]).all()


def test_an_endpoint_gone_mid_epoch_ends_the_pass_and_the_loader_resumes(served, tmp_path):
    url, _, http = served
    loader = make_loader(PackedImageDataset(url, cache_dir=tmp_path), 8, seed=5)
    it = iter(loader)
    first = next(it)[0].clone()
    http.fault = "down"
    with pytest.raises(Exception) as e:
        for _ in it:
            pass
    assert "pack.bin" in str(e.value) or "pack.bin" in str(e.value.__cause__)
    state = loader.state_dict()
    http.fault = None
    again = make_loader(PackedImageDataset(url, cache_dir=tmp_path), 8, seed=5)
    again.load_state_dict(state)
    rest = [x.clone() for x, _ in again]
    local = [
        x.clone() for x, _ in make_loader(PackedImageDataset(http.root / "pack.bin"), 8, seed=5)
    ]
    assert torch.equal(first, local[0]) and len(rest) == 8 - state["batches_done"]
    assert all(torch.equal(a, b) for a, b in zip(rest, local[state["batches_done"] :]))


def test_a_changed_object_is_never_served_from_the_old_copy(make_pack, http, tmp_path):
    out, pixels, _ = make_pack(count=64, height=64, width=64)
    url = f"{http.url}/{out.name}"
    old = PackedImageDataset(url, cache_dir=tmp_path / "c")
    old[0]
    # re-packed under the same name: other records
    tmp_path.joinpath("other").mkdir()
    out2, pixels2, _ = make_pack(count=64, height=32, width=64, classes="xy", name="other/pack")
    os.replace(out2, out)
    os.replace(out2.with_suffix(".json"), out.with_suffix(".json"))
    new = PackedImageDataset(url, cache_dir=tmp_path / "c")
    assert new.classes == ["x", "y"] and old.classes == ["a", "b", "c"]
    assert (new[0][0].permute(1, 2, 0).numpy() == pixels2[0]).all()
    with pytest.raises(PackChangedError, match="changed since the dataset opened it") as e:
        old[40]
    one_line(e)


def test_samples_kept_under_a_small_limit_stay_right(served, tmp_path):
    url, pixels, _ = served
    ds = PackedImageDataset(url, cache_dir=tmp_path, cache_limit=300_000)
    kept = [ds[i] for i in range(64)]
    kept += [s for k in range(0, 64, 8) for s in ds.__getitems__(list(range(k, k + 8)))]
    # their blocks were evicted long ago: each sample is its own copy, never a view of a hole
    assert allocated(tmp_path) <= 300_000  # this process's pins never held the cache full
    assert all(
        (x.permute(1, 2, 0).numpy() == pixels[i % 64]).all() for i, (x, _) in enumerate(kept)
    )


def _read_all(url: str, cache_dir: str, queue) -> None:
    ds = PackedImageDataset(url, cache_dir=cache_dir)
    queue.put(ds.gather(np.arange(len(ds)))[0].numpy().tobytes())


def test_processes_share_one_cache_folder_each_block_fetched_once(served, tmp_path):
    url, pixels, http = served
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_read_all, args=(url, str(tmp_path), queue)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    want = (
        torch.from_numpy(pixels).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    )
    assert all(g == want.numpy().tobytes() for g in got)
    blocks = [r for r in http.ranges if r[1] >= 4096 and r[2] <= 4096 + pixels.nbytes]
    assert len(blocks) == len(set(blocks)) == 22


def test_a_script_that_ends_mid_epoch_exits_quietly(served, preloaded, tmp_path):
    """A script of its own (served by this process's server) leaves with the prefetch under
    way: exit 0, no traceback."""
    script = tmp_path / "script.py"
    script.write_text(
        "from imgpack import PackedImageDataset, make_loader\n"
        f"ds = PackedImageDataset({served[0]!r}, cache_dir={str(tmp_path / 'c')!r},"
        " cache_limit=400_000)\n"
        "it = iter(make_loader(ds, 8, seed=1)); next(it)\n",  # the prefetch is under way
        encoding="utf-8",
    )
    [(code, _, stderr)] = preloaded.run(([script], tmp_path, dict(os.environ)), timeout=120)
    assert code == 0 and "Traceback" not in stderr, stderr


def test_workers_and_the_prefetch_share_a_small_cache(served, tmp_path):
    from imgpack.reader.options import WorkerOptions

    url, pixels, _ = served
    ds = PackedImageDataset(url, cache_dir=tmp_path, cache_limit=400_000)
    local = PackedImageDataset(served[2].root / "pack.bin")
    every, labels = local.gather(np.arange(len(local)))
    record = {every[i].numpy().tobytes(): i for i in range(len(local))}  # each is distinct
    options = WorkerOptions(persistent=True)  # two epochs, one pair of workers
    loader = make_loader(ds, 8, seed=3, num_workers=2, options=options)
    for _ in range(2):  # the main process prefetches while two workers read and evict
        got = [(x.clone(), y) for x, y in loader]
        seen = [record[x.numpy().tobytes()] for images, _ in got for x in images]
        assert len(got) == 8 and sorted(seen) == list(range(len(local)))
        assert torch.cat([y for _, y in got]).tolist() == labels[seen].tolist()
    loader.close()
