"""JPEG records decoded on the GPU, in batches, with NVIDIA's nvImageCodec (optional).

The CPU decode (``imgpack.reader.jpeg``) stays the default and the fallback; this module
is for a loader that delivers on a CUDA device: the batch's JPEG bytes go to nvImageCodec
in one call and come back as uint8 tensors already on the device, so the host neither
decodes nor copies pixels. nvImageCodec is an extra (``pip install imgpack[gpu]``: the
``nvidia-nvimgcodec-cu12`` wheel with its nvJPEG wheel), imported only when asked for.

Written from nvImageCodec's documented Python API (0.7 to 0.9) and exercised here with its
CPU backend only: **it has not run on a GPU yet** (see docs/gpu-decode.md).

How it decodes:

* Only GPU decoders are allowed: the hardware JPEG engine where the GPU has one, else
  nvJPEG's CUDA decoder with the Huffman stage on the GPU too
  (``hybrid_huffman_threshold=0``), so the decode does not take the cores the loader needs.
  libjpeg-turbo is left out on purpose: a record the GPU cannot decode is an error, never a
  silent CPU decode. Chroma is upsampled with interpolation (``fancy_upsampling=1``), as
  libjpeg-turbo does by default, so both paths agree to within rounding.
* A region (left, top, right, bottom) in record pixels decodes only that part (the crop a
  transform drew), through ``CodeStream.get_sub_code_stream(region=...)``.
* Output is interleaved (h, w, C) on the stream that is current at the call; each tensor is
  a zero-copy DLPack view of nvImageCodec's buffer, returned as a (C, h, w) permuted view:
  paste it where it belongs (``canvas[i, :, :h, :w].copy_(t)``) on that same stream.
* One decoder per device, made on first use and checked by decoding a tiny built-in JPEG;
  calls on one device are serialised (the decoder is not documented as thread-safe).
"""

from __future__ import annotations

import atexit
import base64
import importlib
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from imgpack.errors import FormatError, InvalidArgumentError, MissingExtraError

__all__ = ["available", "require", "decode_batch"]

_INSTALL = "pip install imgpack[gpu]"
# HW engine first, else nvJPEG's CUDA decoder with Huffman decoding on the GPU; chroma
# interpolated like libjpeg-turbo. The threshold and the thread count are unmeasured choices.
_OPTIONS = ":fancy_upsampling=1 nvjpeg_cuda_decoder:hybrid_huffman_threshold=0"
_CPU_THREADS = min(4, os.cpu_count() or 1)

# A 16 x 16 baseline 4:2:0 JPEG (quality 50): top half (200, 30, 30), bottom (30, 30, 200).
_PROBE = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERXRT"
    "c4UG1RV19iZ2hnPk1xeXBkeFxlZ2P/2wBDARESEhgVGC8aGi9jQjhCY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2Nj"
    "Y2NjY2NjY2NjY2NjY2NjY2NjY2NjY2P/wAARCAAQABADASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAw"
    "QFBgcICQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkK"
    "FhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmq"
    "KjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEB"
    "AQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRob"
    "HBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOE"
    "hYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+P"
    "n6/9oADAMBAAIRAxEAPwDHorPort/sj+/+H/BPR/tT+5+P/AP/2Q=="
)
_PROBE_RGB = ((200, 30, 30), (30, 30, 200))  # top half, bottom half

_lock = threading.Lock()  # guards the two dicts below
_decoders: dict[int, tuple[Any, threading.Lock]] = {}  # device index -> (decoder, its lock)
_problems: dict[int, str | None] = {}  # device index -> why it cannot decode (None: it can)


def _library():
    """The nvidia.nvimgcodec module, or MissingExtraError saying what to install."""
    try:  # by its full name: sys.modules decides, not an attribute left on ``nvidia``
        nvimgcodec = importlib.import_module("nvidia.nvimgcodec")
    except (ImportError, OSError) as e:
        raise MissingExtraError(
            f"GPU JPEG decoding needs NVIDIA nvImageCodec, which cannot be imported ({e}); "
            f"install it with {_INSTALL}"
        ) from None
    return nvimgcodec


def _cuda_index(device: Any) -> int | None:
    """The CUDA device index ``device`` names, or None for anything torch cannot use here."""
    try:
        dev = torch.device(device)
        if dev.type != "cuda" or not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device() if dev.index is None else dev.index
    except (RuntimeError, TypeError):  # not a device, or CUDA that cannot start
        return None
    return index if index < torch.cuda.device_count() else None


def _problem(index: int) -> str | None:
    """Why cuda:``index`` cannot decode JPEG with nvImageCodec, or None; asked once per device."""
    with _lock:
        if index in _problems:
            return _problems[index]
        try:
            nvimgcodec = _library()
            kinds = (nvimgcodec.BackendKind.HW_GPU_ONLY, nvimgcodec.BackendKind.HYBRID_CPU_GPU)
            backends = [nvimgcodec.Backend(kind) for kind in kinds]
            with torch.cuda.device(index):
                decoder = nvimgcodec.Decoder(
                    device_id=index,
                    max_num_cpu_threads=_CPU_THREADS,
                    backends=backends,
                    options=_OPTIONS,
                )
                _decoders[index] = (decoder, threading.Lock())
                _problems[index] = _check_probe(nvimgcodec, decoder, index)
        except Exception as e:  # whatever stops the probe means "not here"; the reason is kept
            _problems[index] = f"{type(e).__name__}: {e}"
        if _problems[index] is not None:
            _decoders.pop(index, None)
        return _problems[index]


def _check_probe(nvimgcodec, decoder, index: int) -> str | None:
    """Decode ``_PROBE`` on cuda:``index`` into torch; None when the pixels come out right."""
    stream = torch.cuda.current_stream(index)
    probe = [np.frombuffer(_PROBE, np.uint8)]
    name = ["a built-in test JPEG"]
    images = _decode_images(nvimgcodec, decoder, probe, 3, [None], name, None, stream.cuda_stream)
    if images[0].buffer_kind != nvimgcodec.ImageBufferKind.STRIDED_DEVICE:
        return f"nvImageCodec decoded into {images[0].buffer_kind}, not device memory"
    pixels = _to_tensor(images[0]).float()
    for half, rgb in zip((pixels[:, :8], pixels[:, 8:]), _PROBE_RGB):
        got = half.mean(dim=(1, 2)).cpu()
        if (got - torch.tensor(rgb, dtype=torch.float32)).abs().max() > 20:
            return f"a test JPEG decoded to wrong colours ({[round(v) for v in got.tolist()]})"
    return None


def available(device: Any) -> bool:
    """Whether ``decode_batch`` can decode on ``device``: a CUDA device torch can use, with
    nvImageCodec importable and a GPU decoder that decodes a test JPEG right. Cached per
    device; never raises (a loader asks this to choose between the GPU and the CPU path)."""
    index = _cuda_index(device)
    return index is not None and _problem(index) is None


def require(device: Any) -> int:
    """The CUDA index of ``device`` when ``decode_batch`` can decode there, else the reason
    as an error: InvalidArgumentError for a device that is not a usable CUDA one,
    MissingExtraError (with the pip command) without nvImageCodec or its GPU decoder."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise InvalidArgumentError(
            f"device={str(dev)!r}: GPU JPEG decoding needs a CUDA device (the CPU decodes "
            "with imgpack.reader.jpeg)"
        )
    _library()
    index = _cuda_index(dev)
    if index is None:
        raise InvalidArgumentError(f"device={str(dev)!r}: torch cannot use that CUDA device here")
    problem = _problem(index)
    if problem is not None:
        raise MissingExtraError(
            f"nvImageCodec cannot decode JPEG on cuda:{index} ({problem}); {_INSTALL} installs "
            "it with nvJPEG"
        )
    return index


def _regions(regions: Any, n: int) -> list[tuple[int, int, int, int] | None]:
    """Validate the per-record regions (left, top, right, bottom), or n times None."""
    if regions is None:
        return [None] * n
    regions = list(regions)
    if len(regions) != n:
        raise InvalidArgumentError(f"regions: {len(regions)} given for {n} records")
    out: list[tuple[int, int, int, int] | None] = []
    for i, r in enumerate(regions):
        if r is None:
            out.append(None)
            continue
        box = tuple(r) if isinstance(r, (tuple, list)) else ()
        if len(box) != 4 or not all(isinstance(v, (int, np.integer)) for v in box):
            raise InvalidArgumentError(
                f"regions[{i}] = {r!r}: expected (left, top, right, bottom) integers"
            )
        left, top, right, bottom = (int(v) for v in box)
        if not (0 <= left < right and 0 <= top < bottom):
            raise InvalidArgumentError(
                f"regions[{i}] = {r!r}: needs 0 <= left < right and 0 <= top < bottom"
            )
        out.append((left, top, right, bottom))
    return out


def _code_stream(nvimgcodec, buf: np.ndarray, name: str, channels: int, size) -> Any:
    """Parse one record's header; FormatError naming it for anything that is not the JPEG
    the pack says it is (unparseable, another codec, components or size not the pack's)."""
    try:  # the header is parsed when first asked about, not by the constructor
        cs = nvimgcodec.CodeStream(buf)
        codec, components, width, height = cs.codec_name, cs.num_channels, cs.width, cs.height
    except (RuntimeError, ValueError) as e:
        raise FormatError(f"{name}: damaged JPEG record (nvImageCodec: {e})") from None
    if codec != "jpeg":
        raise FormatError(f"{name}: damaged JPEG record (it is a {codec} stream)")
    if components != channels:
        raise FormatError(
            f"{name}: damaged JPEG record (a {components}-component JPEG in a "
            f"{channels}-channel pack)"
        )
    if size is not None and (width, height) != tuple(size):
        raise FormatError(
            f"{name}: damaged JPEG record (its header says {width}x{height}, the index "
            f"{size[0]}x{size[1]})"
        )
    return cs


def _decode_images(nvimgcodec, decoder, buffers, channels, regions, names, sizes, stream):
    """nvImageCodec Images, (h, w, C) each, for the records: one batched call on ``stream``
    (a cudaStream_t as an int). Each record is checked before the call; a record the
    decoder rejects is named by a FormatError (a failed batch is retried one by one to
    find it)."""
    streams, shapes = [], []
    for i, buf in enumerate(buffers):
        cs = _code_stream(nvimgcodec, buf, names[i], channels, None if sizes is None else sizes[i])
        if regions[i] is None:
            shapes.append((cs.height, cs.width))
        else:
            left, top, right, bottom = regions[i]
            if right > cs.width or bottom > cs.height:
                raise InvalidArgumentError(
                    f"regions[{i}] = {regions[i]} reaches outside {names[i]} "
                    f"({cs.width}x{cs.height} pixels)"
                )
            cs = cs.get_sub_code_stream(region=nvimgcodec.Region(top, left, bottom, right))
            shapes.append((bottom - top, right - left))
        streams.append(cs)
    spec = nvimgcodec.ColorSpec.GRAY if channels == 1 else nvimgcodec.ColorSpec.SRGB
    params = nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=spec)
    try:
        images = decoder.decode(streams, params=params, cuda_stream=stream)
    except RuntimeError:
        images = []
        for i, cs in enumerate(streams):  # one by one, to name the record it failed on
            try:
                images.append(decoder.decode(cs, params=params, cuda_stream=stream))
            except RuntimeError as e:
                raise FormatError(f"{names[i]}: damaged JPEG record (nvImageCodec: {e})") from e
    for i, image in enumerate(images):
        if image is None:
            raise FormatError(f"{names[i]}: damaged JPEG record (nvImageCodec could not decode it)")
        got = tuple(image.shape) + (() if len(image.shape) == 3 else (1,))
        if got != (*shapes[i], channels):
            raise FormatError(
                f"{names[i]}: nvImageCodec decoded {got}, expected {(*shapes[i], channels)}"
            )
    return images


def _to_tensor(image) -> torch.Tensor:
    """A device Image as a (C, h, w) uint8 tensor sharing its memory: DLPack, ordered after
    the decode on torch's current stream (torch passes that stream to ``__dlpack__``)."""
    t = torch.from_dlpack(image)
    return (t if t.dim() == 3 else t.unsqueeze(-1)).permute(2, 0, 1)


def decode_batch(
    buffers: Sequence[Any],
    channels: int,
    device: Any,
    regions: Sequence[Any] | None = None,
    *,
    names: Sequence[str] | None = None,
    sizes: Sequence[tuple[int, int]] | None = None,
) -> list[torch.Tensor]:
    """Decode JPEG records on a CUDA device in one batch: a list of uint8 (C, h, w) tensors.

    ``buffers``: each record's bytes (a numpy uint8 view of the mapped pack, bytes or a
    memoryview). ``channels``: the pack's C (1 or 3). ``regions``: None, or per record None
    or (left, top, right, bottom) in record pixels to decode only that part (h, w are then
    the region's). ``names``: how an error names each record (default ``record <i>``).
    ``sizes``: each record's (w, h) from the index, checked against its JPEG header.

    The tensors are ready on the stream current at the call and share nvImageCodec's
    memory: paste them into the batch (and drop them) on that stream. FormatError names a
    record that is not a JPEG of the pack's kind or that the decoder rejects;
    MissingExtraError says what to install when nvImageCodec (or its nvJPEG) is missing;
    InvalidArgumentError for a device that is not CUDA or a bad region.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        require(dev)  # raises for a device that is not CUDA
    if channels not in (1, 3):
        raise InvalidArgumentError(f"channels={channels!r}: a JPEG pack has 1 or 3 channels")
    arrays = [b if isinstance(b, np.ndarray) else np.frombuffer(b, np.uint8) for b in buffers]
    n = len(arrays)
    names = [f"record {i}" for i in range(n)] if names is None else list(names)
    if len(names) != n or (sizes is not None and len(sizes) != n):
        raise InvalidArgumentError(f"names and sizes need one entry per record ({n} records)")
    boxes = _regions(regions, n)
    nvimgcodec, index = _library(), require(dev)
    if n == 0:
        return []
    decoder, lock = _decoders[index]
    stream = torch.cuda.current_stream(index)
    with lock, torch.cuda.device(index):
        images = _decode_images(
            nvimgcodec, decoder, arrays, channels, boxes, names, sizes, stream.cuda_stream
        )
    return [_to_tensor(image) for image in images]


@atexit.register
def _release() -> None:
    """Drop the decoders while CUDA is still up, not during the interpreter's teardown."""
    with _lock:
        _decoders.clear()
