"""What every script here shares: sample photographs, packing through the CLI, medians, tables.

The scripts are run as files (``python scripts/bench_load.py``), so this module is found
beside them; nothing in the package or the tests imports it.

Benchmarks on noise lie (noise JPEGs decode slower and compress worse than photographs), so
the sample folders are cut from photographs already on disk: scikit-image's sample photos
(read as files, never imported; ``scripts/demo.sh`` installs it), matplotlib's portrait of
Grace Hopper, or, where neither is installed, smooth colour fields with grain.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["photos", "make_folder", "pack", "alternate", "table", "machine", "save", "OUT"]

# results, packs and sample folders: out/ (ignored by git), or IMGPACK_SCRIPTS_OUT (the tests)
OUT = Path(os.environ.get("IMGPACK_SCRIPTS_OUT") or Path(__file__).resolve().parents[1] / "out")

_SKIMAGE = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "grass.png",
    "gravel.png",
    "brick.png",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "ihc.png",
)


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def photos(seed: int = 0) -> list[Image.Image]:
    """RGB photographs installed on this machine, or four procedural stand-ins."""
    found = []
    if (sk := _package_dir("skimage")) is not None:
        found += [sk / "data" / n for n in _SKIMAGE if (sk / "data" / n).is_file()]
    if (mpl := _package_dir("matplotlib")) is not None:
        hopper = mpl / "mpl-data" / "sample_data" / "grace_hopper.jpg"
        found += [hopper] if hopper.is_file() else []
    if found:
        return [Image.open(p).convert("RGB") for p in found]
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:512, 0:512] / 512
    out = []
    for _ in range(4):
        a, b, c, d = rng.uniform(1, 6, (4, 3))
        field = np.sin(a * xx[..., None] + d) * np.cos(b * yy[..., None] + c) * 110 + 128
        noisy = field + rng.normal(0, 6, field.shape)
        out.append(Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)))
    return out


def make_folder(
    dest: Path,
    *,
    classes: int,
    per_class: int,
    large: bool = False,
    seed: int = 0,
    quality: int = 90,
) -> Path:
    """``classes * per_class`` JPEGs in DEST/class_XX/: random crops of the photographs,
    resized, maybe flipped, colour-jittered. ImageNet-like sizes (about 400x350), or camera
    sizes with the short side over 2,000 px when ``large``."""
    rng = np.random.default_rng(seed)
    sources = photos(seed)
    for n in range(classes * per_class):
        if large:
            h = int(rng.integers(2000, 2300))
            w = int(h * rng.uniform(1.3, 1.5))
        else:
            w, h = int(rng.integers(330, 470)), int(rng.integers(290, 410))
        if rng.random() < 0.3:
            w, h = h, w
        photo = sources[int(rng.integers(len(sources)))]
        pw, ph = photo.size
        cw = min(pw, int(pw * rng.uniform(0.35, 1.0)))
        ch = min(ph, int(cw * h / w))
        cw = min(cw, int(ch * w / h))
        x, y = int(rng.integers(0, pw - cw + 1)), int(rng.integers(0, ph - ch + 1))
        img = photo.crop((x, y, x + cw, y + ch)).resize((w, h), Image.BICUBIC)
        arr = np.asarray(img, dtype=np.float32) * rng.uniform(0.85, 1.15, 3)
        if w * h > cw * ch:  # enlarged crops are too smooth to decode like camera JPEGs
            arr += rng.normal(0, 3.0, arr.shape)
        if rng.random() < 0.5:
            arr = arr[:, ::-1]
        folder = dest / f"class_{n // per_class:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        out = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
        out.save(folder / f"{n % per_class:05d}.jpg", quality=quality)
    return dest


def pack(src: Path, out: Path, *options: str) -> float:
    """Run ``pack-images SRC OUT OPTIONS --force`` as a user does; return its seconds."""
    cli = "from imgpack.packer.cli import main; main(prog_name='pack-images')"
    args = [sys.executable, "-c", cli, str(src), str(out), *options, "--force"]
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    done = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        sys.exit(done.stderr.strip())
    return time.perf_counter() - t0


def alternate(sides: dict[str, Callable[[], float]], repeats: int) -> dict[str, dict]:
    """Run every side once untimed, then all sides in turn ``repeats`` times; each call
    returns a rate. Gives each side's median, min and max: alternating spreads a busy
    machine's noise over all sides alike."""
    for run in sides.values():
        run()
    got: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, run in sides.items():
            got[name].append(run())
    return {
        n: {"median": statistics.median(v), "min": min(v), "max": max(v)} for n, v in got.items()
    }


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table; numbers right-aligned with thousands separators."""

    def cell(v) -> str:
        if isinstance(v, float):
            return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> str:
    """One line: processor, usable cores, memory, and torch's version where it is loaded."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    torch = sys.modules.get("torch")
    return f"{cpu}, {cores} cores, {mem:.0f} GiB, Python {platform.python_version()}, " + (
        f"numpy {np.__version__}" + (f", torch {torch.__version__}" if torch else "")
    )


def save(name: str, rows: dict) -> Path:
    """Write a script's results as JSON under out/ (never into docs/), with the machine."""
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **rows}, indent=1) + "\n")
    return path
