"""A pack in object storage against a plain fetch, a local read and LitData.

Everything reads from one S3 endpoint on this machine (moto's server, in its own process,
so that it does not share this one's GIL), side by side in one run:

* cold: an epoch over an empty cache, images/s, against the same client (s3fs) fetching
  the same bytes in the same ranges (the cache's blocks), with as many requests in flight
  and nothing else: imgpack's overhead over a plain fetch (goal: at least 0.8x);
* warm: the next epoch, everything cached, against the same pack read locally (goal:
  at least 0.95x);
* bytes: bytes fetched per epoch with ``cache_limit`` half the pack, in block order (its
  default there), over two epochs (goal: at most 1.1x the pack);
* LitData's own streaming of the same images from the same endpoint, where it imports
  (installed with ``pip install --no-deps litdata``, which keeps torch); Mosaic Streaming
  likewise (it imports ``transformers``: reported as not importable where that is absent).

    python scripts/bench_remote.py [--records 3000] [--side 96] [--batch 256]

Prints a table and saves out/bench_remote.json. Needs the dev extra (moto[server], s3fs).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import machine, save, table  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_endpoint() -> subprocess.Popen:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise SystemExit("moto's server did not start")


def make_pack(folder: Path, count: int, side: int) -> Path:
    from imgpack.packer.writer import PackWriter

    rng = np.random.default_rng(0)
    out = folder / "bench.bin"
    with PackWriter(out, height=side, width=side, classes=["a", "b"]) as w:
        for i in range(count):
            w.append(rng.integers(0, 256, (side, side, 3), np.uint8), i % 2, f"a/{i}.png")
        w.finish(packer={"size": [side, side], "resize": "stretch", "filter": "bilinear"})
    return out


def epoch(loader) -> float:
    """images/s of one whole epoch."""
    t, n = time.perf_counter(), 0
    for images, *_ in loader:
        n += len(images)
    return n / (time.perf_counter() - t)


def plain_fetch(url: str, ranges: list[tuple[int, int]], per_image: float) -> float:
    """images/s of fetching ``ranges`` with s3fs, IN_FLIGHT at once, nothing else."""
    import fsspec

    from imgpack.remote.mirror import IN_FLIGHT

    fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True)
    t = time.perf_counter()
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        done = sum(
            len(b) for b in pool.map(lambda r: fs.cat_file(path, start=r[0], end=r[1]), ranges)
        )
    return done / per_image / (time.perf_counter() - t)


_OPEN: dict = {}


def litdata_item(local: str, i: int) -> dict:
    """One record as LitData's optimize stores it (a top-level function: it is pickled)."""
    from imgpack import PackedImageDataset

    if local not in _OPEN:
        _OPEN[local] = PackedImageDataset(local)
    ds = _OPEN[local]
    image, label = ds[i]
    return {"image": image.numpy().copy(), "label": int(label)}


def litdata_epoch(local: Path, bucket: str, side: int, batch: int, tmp: Path) -> str:
    try:
        import litdata
    except ImportError as e:
        return f"not importable ({e.name})"
    import functools

    import fsspec

    from imgpack import PackedImageDataset

    try:
        out = tmp / "litdata"
        litdata.optimize(
            fn=functools.partial(litdata_item, str(local)),
            inputs=list(range(len(PackedImageDataset(local)))),
            output_dir=str(out),
            chunk_bytes="64MB",
            num_workers=1,
        )
        fsspec.filesystem("s3").put(str(out) + "/", f"{bucket}/litdata/", recursive=True)
        stream = litdata.StreamingDataset(f"s3://{bucket}/litdata", cache_dir=str(tmp / "ldc"))
        loader = litdata.StreamingDataLoader(stream, batch_size=batch, num_workers=0)
        cold = epoch((b["image"],) for b in loader)
        warm = epoch((b["image"],) for b in loader)
        return f"{cold:,.0f} cold, {warm:,.0f} warm"
    except Exception as e:  # noqa: BLE001 - a peer's failure is a row of the table
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=3000)
    p.add_argument("--side", type=int, default=96)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    proc = start_endpoint()
    try:
        run(args)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run(args) -> None:
    import fsspec

    from imgpack import PackedImageDataset, make_loader
    from imgpack.remote.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    local = make_pack(tmp, args.records, args.side)
    fs = fsspec.filesystem("s3")
    fs.mkdir("bench")
    for suffix in (".bin", ".json"):
        fs.put_file(str(local.with_suffix(suffix)), f"bench/bench{suffix}")
    url = "s3://bench/bench.bin"
    per_image = args.side * args.side * 3
    pixels = args.records * per_image
    rows, results = [], {}

    ds = PackedImageDataset(url, cache_dir=tmp / "cache")
    loader = make_loader(ds, args.batch, seed=0)
    starts = ds._remote.caches[0].here.first_byte.tolist()  # the cache's blocks
    ranges = list(zip(starts, starts[1:]))
    plain = plain_fetch(url, ranges, per_image)
    cold = epoch(loader)
    warm = epoch(loader)
    here = epoch(make_loader(PackedImageDataset(local), args.batch, seed=0))
    results.update(cold=cold, plain=plain, warm=warm, local=here)
    rows.append(
        ["cold epoch vs plain fetch", f"{cold:,.0f}", f"{plain:,.0f}", f"{cold / plain:.2f}x"]
    )
    rows.append(["warm epoch vs local pack", f"{warm:,.0f}", f"{here:,.0f}", f"{warm / here:.2f}x"])

    fetched: list[int] = []
    read = Store.read

    def counting(self, start, end, what, check=None):
        if what.startswith("records"):
            fetched.append(end - start)
        return read(self, start, end, what, check)

    Store.read = counting
    limited = PackedImageDataset(url, cache_dir=tmp / "half", cache_limit=pixels // 2)
    loader = make_loader(limited, args.batch, seed=0)
    for e in range(2):
        fetched.clear()
        epoch(loader)
        ratio = sum(fetched) / pixels
        results[f"bytes_epoch{e}"] = ratio
        rows.append([f"bytes fetched, epoch {e}, limit = pack/2 ({loader.order.order})",
                     f"{sum(fetched):,}", f"{pixels:,}", f"{ratio:.2f}x"])  # fmt: skip
    Store.read = read
    print(table(["", "imgpack", "reference", "ratio"], rows), flush=True)  # before the peers
    results["litdata"] = litdata_epoch(local, "bench", args.side, args.batch, tmp)
    rows.append(["LitData StreamingDataset, images/s", results["litdata"], "", ""])
    try:
        import streaming  # noqa: F401

        results["mosaic"] = "importable; not run here"
    except Exception as e:  # noqa: BLE001
        results["mosaic"] = f"not importable ({type(e).__name__}: {e})"
    rows.append(["Mosaic Streaming", results["mosaic"], "", ""])
    size = f"{args.records} records of {args.side}x{args.side}, {pixels / 1e6:.0f} MB"
    print(f"imgpack from a local S3 endpoint (moto), {size}, batch {args.batch}")
    print(table(["", "imgpack", "reference", "ratio"], rows))
    save("bench_remote", {"machine": machine(), "args": vars(args), "results": results})


if __name__ == "__main__":
    main()
