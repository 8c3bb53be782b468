"""Shared fixtures: tiny real image folders and packs, made fresh in tmp_path."""

from __future__ import annotations

import functools
import gc
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from preloaded import Preloaded

from imgpack.format.codec import yuv420_to_rgb
from imgpack.format.index import read_index
from imgpack.packer.writer import PackWriter

# A shell without job control starts a background job (`pytest ... &`) with SIGINT ignored,
# and every interpreter the tests start would inherit that: the tests that press Ctrl-C on a
# packer or a training loop would then see it ignored. A handler here is reset to the default
# in each child at exec, so those children get Python's KeyboardInterrupt, as a user's do.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


def photo_like(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A smooth colour image with a little grain: decodes and resizes like a photo."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack(
        [
            128 + 100 * np.sin(xx / max(width, 1) * 3 + seed),
            128 + 100 * np.cos(yy / max(height, 1) * 2 + seed),
            128 + 60 * np.sin((xx + yy) / max(width + height, 1) * 5),
        ],
        axis=-1,
    )
    base += rng.normal(0, 4, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def photo_sources() -> list[Path]:
    """Photographs installed on this machine as files: scikit-image's sample photos where it
    happens to be installed (the dev extra does not install it), and matplotlib's portrait of
    Grace Hopper. Fewer than four are no sample to measure a codec on: then none, and callers
    fall back to photo-like images (``photo_like``)."""
    import importlib.util

    skimage = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
               "motorcycle_right.png", "grass.png", "gravel.png", "brick.png",
               "hubble_deep_field.jpg", "retina.jpg", "ihc.png")  # fmt: skip
    found = []
    for package, names in (
        ("skimage", [f"data/{n}" for n in skimage]),
        ("matplotlib", ["mpl-data/sample_data/grace_hopper.jpg"]),
    ):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            root = Path(next(iter(spec.submodule_search_locations)))
            found += [root / n for n in names if (root / n).is_file()]
    return found if len(found) >= 4 else []


def write_image(path: Path, width: int = 64, height: int = 48, seed: int = 0, **save) -> Path:
    """Write a photo-like RGB image; the format follows the suffix (.jpg, .png, ...)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(photo_like(width, height, seed)).save(path, **save)
    return path


def pytest_collection_finish(session):
    """What the collection imported (torch, numpy, every test module: some 300,000 objects)
    lives until the run ends: freeze it, so that a full garbage collection, automatic or
    the explicit one in ``close_loader``, walks only what the tests made since (about
    0.2 s less each). Nothing a test makes is frozen; it is collected as before."""
    gc.collect()
    gc.freeze()


@pytest.fixture
def image_folder(tmp_path: Path):
    """Factory: SRC/<class>/<n>.jpg with ``per_class`` images per class."""

    def make(classes=("cat", "dog"), per_class=3, width=64, height=48, ext=".jpg") -> Path:
        src = tmp_path / "src"
        seed = 0
        for cls in classes:
            for i in range(per_class):
                write_image(src / cls / f"{i:03d}{ext}", width, height, seed=seed)
                seed += 1
        return src

    return make


@pytest.fixture(autouse=True)
def _private_warm_locks(tmp_path_factory, monkeypatch):
    """The reader's node-wide warm lock files go to a test folder, not the shared /tmp."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("tmpdir")))


def records(out: Path):
    """(pixels (N,H,W,3), labels, paths, checksums, index) of a finished pack, read raw."""
    index = read_index(out)
    raw = np.fromfile(index.data_path, dtype=np.uint8)
    pix = index.section_array("pixels", raw).reshape(index.count, *index.shape)
    offsets = index.section_array("path_offsets", raw)
    paths_raw = index.section_array("paths", raw)
    paths = [index.source_path(i, offsets, paths_raw) for i in range(index.count)]
    labels = index.section_array("labels", raw)
    return pix, labels, paths, index.section_array("checksums", raw), index


def record_images(out: Path) -> list[np.ndarray]:
    """Every record of a pack as the (h, w, C) uint8 pixels a reader gets back, read with
    the format module alone: at its offset, at its own size, yuv420 converted."""
    index = read_index(out)
    raw = np.fromfile(index.data_path, dtype=np.uint8)[index.data_offset :]
    images = []
    for (w, h), a, b in zip(
        index.record_sizes, index.record_offsets[:-1], index.record_offsets[1:]
    ):
        stored = raw[a:b]
        if index.codec == "yuv420":
            images.append(yuv420_to_rgb(stored, int(w), int(h)))
        else:
            images.append(stored.reshape(h, w, index.channels))
    return images


def synthetic_records(count: int, height: int, width: int) -> np.ndarray:
    """Distinct, reproducible pixels per record so that any mix-up shows."""
    base = np.arange(height * width * 3, dtype=np.uint32).reshape(height, width, 3)
    return np.stack([((base * (i + 3) + i * 17) % 251).astype(np.uint8) for i in range(count)])


def write_pack(folder: Path, count=10, height=8, width=6, classes=("a", "b", "c"), name="pack"):
    """A pack written straight from arrays (no decoding) in ``folder``: (bin, pixels, labels)."""
    pixels = synthetic_records(count, height, width)
    labels = np.arange(count) % len(classes) if classes else np.full(count, -1)
    out = folder / f"{name}.bin"
    with PackWriter(out, height=height, width=width, classes=list(classes)) as w:
        for i in range(count):
            where = classes[labels[i]] if classes else "x"
            w.append(pixels[i], int(labels[i]), f"{where}/{i}.png")
        w.finish(packer={"size": [width, height], "resize": "stretch", "filter": "bilinear"})
    return out, pixels, labels.astype(np.int64)


@pytest.fixture
def make_pack(tmp_path: Path):
    """Factory writing a pack in tmp_path (``write_pack``): returns (bin, pixels, labels)."""
    return functools.partial(write_pack, tmp_path)


@pytest.fixture
def canvas_on_cpu(monkeypatch):
    """make_loader on a CPU device resamples ``DeviceTransform.train``/``.eval`` crops with
    the device's matmuls, over a canvas of the records, as a CUDA device does: the table's
    CPU crop rows are replaced by its canvas rows (where the records become pixels for a GPU
    fed by workers)."""
    from imgpack.reader import loader

    for codec, where in (("raw", "copy"), ("yuv420", "copy"), ("jpeg", "cpu")):
        monkeypatch.setitem(loader.STAGES, (codec, "crops"), loader.STAGES[(codec, where)])


def _extra(request, monkeypatch, library: str, switch: str) -> str:
    """A test run with one library of the cpu extra on (param "on", where installed) or off
    (``switch=0``): each path imgpack takes with and without it."""
    if request.param == "on":
        pytest.importorskip(library)
        monkeypatch.delenv(switch, raising=False)
    else:
        monkeypatch.setenv(switch, "0")
    return request.param


@pytest.fixture(params=["on", "off"], ids=["opencv", "torch"])
def crops(request, monkeypatch):
    """The CPU crop's two paths for a box enlarged on both axes: OpenCV's (the cpu extra)
    and torch's kernel (``IMGPACK_OPENCV=0``)."""
    return _extra(request, monkeypatch, "cv2", "IMGPACK_OPENCV")


@pytest.fixture(params=["on", "off"], ids=["compiled", "fallback"])
def kernels(request, monkeypatch):
    """imgpack's two paths for what numba compiles (the cpu extra): the kernels and the
    numpy/torch code (``IMGPACK_NUMBA=0``)."""
    return _extra(request, monkeypatch, "numba", "IMGPACK_NUMBA")


@pytest.fixture(scope="session")
def preloaded():
    """Runs scripts, each in a process of its own, forked from one interpreter that has
    imported torch (tests/preloaded.py), with this checkout first on the path."""
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    interpreter = Preloaded({**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path})
    yield interpreter
    interpreter.close()
