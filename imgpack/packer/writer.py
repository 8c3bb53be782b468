"""Stream records into a pack and publish it atomically.

``PackWriter`` is the only code that lays out bytes of a .bin; it appends
records in order to ``NAME.bin.partial``, keeps the small per-record columns
(labels, CRCs, paths, sizes, geometry, targets, exact channel sums) in compact arrays
(``append``), and on ``finish()`` writes the trailing sections and header, fsyncs,
and renames into place, .bin first and .json last: the .json appearing is the commit
point. Nothing under the final names is ever partial.

Every record carries its digest: the CRC-32 of its stored bytes and the exact integer
sums (and sums of squares) of the pixels a reader gets back. Workers compute it right
after a decode, the writer from bytes (``digest_stored``). Integer sums make a pack's
stats independent of worker count and exactly mergeable.
"""

from __future__ import annotations

import os
import signal
import threading
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.errors import InvalidArgumentError, SourceError
from imgpack.format import layout
from imgpack.format import write as fmt
from imgpack.format.codec import rgb_to_yuv420, yuv420_to_rgb
from imgpack.format.fields import RECORD_FIELDS, RecordGeometry, whole_record
from imgpack.packer.decode import check_codec
from imgpack.packer.jpeg import SUBSAMPLING, as_image, decode_jpeg, encode_image, max_jpeg_bytes
from imgpack.packer.sources.source import printable_path

__all__ = [
    "PackWriter",
    "check_target",
    "target_value",
    "digest_stored",
    "encode_record",
    "handling",
    "partial_path",
]


def partial_path(out_bin: str | os.PathLike) -> Path:
    """Where an unfinished pack lives until it is complete."""
    return Path(f"{os.fspath(out_bin)}.partial")


class PackWriter:
    """Append records to a new pack, then ``finish()`` to publish it (or ``abort()``).

    ``height`` x ``width`` is the bound: a record may have any size within it. ``codec``
    "raw" stores HWC pixels as given, "yuv420" (3 channels) Y, Cb, Cr planes
    (``imgpack.format.codec``), "jpeg" a JPEG stream per record, encoded at ``quality``
    (default 90; no other codec takes one). ``channels``: 3 (RGB) or 1 (L); ``target_dim`` K > 0:
    a float32 target vector of K values per record (``append(..., target=...)``).
    Every record has a geometry (``append(..., geometry=...)``; None: its whole
    source), written as the ``source_size``/``source_box``/``content_box`` fields.
    Use as a context manager: leaving the block calls ``abort()``, which after ``finish()``
    has nothing left to close (on an exception, the partial file is kept for ``--resume``).
    """

    def __init__(
        self,
        out_bin: str | os.PathLike,
        *,
        height: int,
        width: int,
        classes: list[str],
        channels: int = 3,
        target_dim: int = 0,
        codec: str = "raw",
        quality: int | None = None,
    ) -> None:
        self.quality = check_codec(codec, channels, quality)
        self.out_bin = Path(out_bin)
        self.out_json, _ = layout.pack_paths(self.out_bin)
        self.partial = partial_path(self.out_bin)
        self.height, self.width, self.channels = height, width, channels
        self.codec, self.target_dim, self.classes = codec, target_dim, list(classes)
        # the bound's record (jpeg: at most the worst case of our encoding; a source stored as
        # it came may be larger)
        bound = (width, height)
        self.max_record_bytes = self.nbytes(bound, max_jpeg_bytes(*bound, channels))
        # every record's small columns, in record order, by the names the pack gives them, in
        # the order they are laid out: the sections after the pixels, then the record fields
        # (record_length, each record's stored bytes, in jpeg packs only; targets if K > 0)
        self.columns = {"labels": array("i"), "checksums": array("I")}
        self.columns.update(path_offsets=array("Q", [0]), paths=bytearray())
        for name, field in RECORD_FIELDS.items():
            if (name != "record_length" or codec == "jpeg") and (name != "targets" or target_dim):
                self.columns[name] = array(np.dtype(field.dtype).char)
        self.sums, self.sums_sq = [0] * channels, [0] * channels
        self.pixels = 0  # per channel, in every record: the stats' N
        self.pixels_nbytes = 0  # the records' bytes: where the next one goes
        self.stored_as_is = 0  # jpeg: records that are a source's own bytes
        self.skipped: list[dict[str, str]] = []
        self.published = False  # finish() renamed the pack into place
        self._file = None

    # -- lifecycle ---------------------------------------------------------------

    def open(self) -> PackWriter:
        """Start a new partial file, or reopen one keeping the records already accounted for.

        Records kept on resume are accounted for with ``append(kept=True)`` first, which
        knows their sizes: the file is cut where the last of them ends, so a resumed pack is
        byte-identical to an uninterrupted one.
        """
        end = layout.HEADER_BYTES + self.pixels_nbytes  # the header: written by finish()
        self._file = open(self.partial, "r+b" if self.count else "wb")  # noqa: SIM115
        self._file.truncate(end)
        self._file.seek(end)
        return self

    def __enter__(self) -> PackWriter:
        return self.open()  # a new writer: ``with PackWriter(...) as w``

    def __exit__(self, exc_type, exc, tb) -> None:
        """Close the file as the block ends, whatever ends it: published by ``finish()`` in
        the block, or left as the partial file (kept for ``--resume``)."""
        self.abort()

    def abort(self) -> None:
        """Close without publishing; the final names are untouched."""
        if self._file is not None:
            self._file.close()
            self._file = None

    # -- writing -----------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self.columns["labels"])

    def append(
        self,
        pixels: Any,
        label: int,
        relpath: str,
        digest: RecordDigest | None = None,
        *,
        geometry: RecordGeometry | None = None,
        target: Sequence[float] | None = None,
        size: tuple[int, int] | None = None,
        as_is: bool = False,
        kept: bool = False,
    ) -> None:
        """Write one record: an (h, w, C) uint8 array within the bound, or its stored bytes.

        An array is stored as is (raw) or encoded (yuv420, jpeg). Bytes (any buffer) are the
        record as stored of ``size`` (width, height; default: the bound); ``as_is``: jpeg
        bytes that are a source file's own (the index counts them). ``digest``: its
        ``digest_stored`` (None: computed; jpeg bytes are decoded for it, so a stream that
        is not a JPEG of ``size`` is refused). ``geometry``: where it came from (None: its
        whole source); ``target``: its K floats (``target_dim`` K). ``kept``: the bytes are
        already in the partial file, read back (resume): accounted for, not written again.
        """
        if isinstance(pixels, np.ndarray) and pixels.ndim == 3:
            h, w, c = pixels.shape
            if pixels.dtype != np.uint8 or c != self.channels:
                raise InvalidArgumentError(
                    f"{relpath}: record shape {pixels.shape} {pixels.dtype}, expected "
                    f"(h, w, {self.channels}) uint8 within {self.height}x{self.width}"
                )
            size = (w, h)  # checked with the bytes, before any of them is written
            pixels = encode_record(np.ascontiguousarray(pixels), self.codec, self.quality)
        buf = memoryview(pixels).cast("B")
        size = self._check(relpath, size, len(buf), geometry)
        target = check_target(relpath, target, self.target_dim)
        if digest is None:
            try:
                digest = digest_stored(buf, self.codec, *size, self.channels)
            except ValueError as e:  # jpeg bytes that do not decode to this record
                raise InvalidArgumentError(f"{relpath}: {e}") from None
        if not kept:
            self._file.write(buf)
        crc, sums, sums_sq = digest
        source_size, sbox, cbox = whole_record(*size) if geometry is None else geometry
        path, offsets = relpath.encode("utf-8"), self.columns["path_offsets"]
        values = {"labels": (label,), "checksums": (crc,), "paths": path, "record_size": size}
        values.update(path_offsets=(offsets[-1] + len(path),), record_length=(len(buf),))
        values.update(source_size=source_size, source_box=sbox, content_box=cbox, targets=target)
        for name, column in self.columns.items():
            column.extend(values[name])
        self.pixels_nbytes += len(buf)
        self.pixels += size[0] * size[1]
        self.stored_as_is += bool(as_is)
        self.sums = [a + b for a, b in zip(self.sums, sums)]
        self.sums_sq = [a + b for a, b in zip(self.sums_sq, sums_sq)]

    def nbytes(self, size: tuple[int, int], length: int | None) -> int:
        """Bytes of one record of ``size`` (jpeg: its ``length``, checked by ``append``)."""
        if self.codec == "jpeg":
            return length
        return layout.record_nbytes(self.codec, size[0], size[1], self.channels)

    def _check(self, relpath, size, length, geometry) -> tuple[int, int]:
        """What the writer checks of every record before any byte of it is written: a
        one-line error naming the record's source path. Returns its (width, height), within
        the bound (``size`` None: the bound); its callers give whole numbers (an image's size,
        a journal line's checked integers)."""
        w, h = size = (self.width, self.height) if size is None else size
        if not (1 <= w <= self.width and 1 <= h <= self.height):
            raise InvalidArgumentError(
                f"{relpath}: record size {size!r} is not (width, height) within the bound "
                f"{self.width}x{self.height}"
            )
        need = self.nbytes((w, h), length)
        if length != need or (self.codec == "jpeg" and not 2 <= length < 2**32):
            raise InvalidArgumentError(
                f"{relpath}: record has {length} bytes, a {w}x{h} {self.codec} record has "
                + ("2 to 2**32 - 1" if self.codec == "jpeg" else f"{need}")
            )
        if geometry is not None and not _geometry_ok(geometry):
            raise ValueError(
                f"{relpath}: geometry {geometry!r} is not ((width, height), source box, "
                f"content box) with a positive size and boxes of 4 numbers"
            )
        return w, h

    def flush(self) -> None:
        """Hand every appended byte to the OS, so a journal may name those records."""
        if self._file is not None:  # closed: finish() or abort() already handed everything
            self._file.flush()

    def skip(self, relpath: str, reason: str) -> None:
        """Record a source file that produced no record, and why (its name as JSON holds it)."""
        self.skipped.append({"path": printable_path(relpath), "reason": reason})

    def finish(
        self, *, packer: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Write trailing sections and header, fsync, rename into place; return the index."""
        f, n = self._file, self.count
        # first what can fail on bad sums (a damaged journal): the partial file stays as it is
        stats = fmt.stats_from_sums(self.pixels, self.sums, self.sums_sq)
        sections = layout.layout_sections(n, self.pixels_nbytes, len(self.columns["paths"]))
        specs = [
            (name, field.dtype, (self.target_dim,) if name == "targets" else field.shape)
            for name, field in RECORD_FIELDS.items()
            if name in self.columns
        ]
        fields = layout.layout_fields(sections, n, specs)
        for name in fields.keys() & {"record_size", "record_length"}:  # how to read the records
            fields[name] = replace(fields[name], required=True)
        places = {**sections, **fields}
        # each column as the little-endian bytes its section holds
        payloads = [
            np.asarray(column).astype(places[name].dtype).tobytes()
            for name, column in self.columns.items()
        ]
        hwc = (self.height, self.width, self.channels)
        pack_id = fmt.compute_pack_id(
            shape=hwc, count=n, classes=self.classes, payloads=payloads, codec=self.codec
        )
        for name, payload in zip(self.columns, payloads):
            f.seek(places[name].offset)
            f.write(payload)
        f.truncate(layout.file_bytes(sections, fields))
        f.seek(0)
        shape = dict(count=n, height=hwc[0], width=hwc[1], channels=hwc[2], codec=self.codec)
        f.write(layout.encode_header(**shape, pack_id=pack_id, pixels_nbytes=self.pixels_nbytes))
        f.flush()
        os.fsync(f.fileno())
        self.abort()  # closed: what follows only renames
        jpeg = {"quality": self.quality, "subsampling": SUBSAMPLING[self.channels]}
        index = fmt.build_index(
            data_file=self.out_bin.name,
            classes=self.classes,
            sections=sections,
            fields=fields,
            stats=stats,
            skipped=self.skipped,
            packer=packer,
            extra=extra,
            pack_id=pack_id.hex(),
            jpeg={**jpeg, "stored_as_is": self.stored_as_is} if self.codec == "jpeg" else None,
            **shape,
        )
        # a Ctrl-C stops the run once the pack is whole, never between the .bin and its .json
        caught: list[int] = []
        with handling(signal.SIGINT, lambda signum, frame: caught.append(signum)) as old:
            # Drop a stale index first: a reader then sees "no pack", never old JSON over new
            # pixels.
            self.out_json.unlink(missing_ok=True)
            os.replace(self.partial, self.out_bin)
            fmt.write_json_atomic(self.out_json, index)
            self.published = True
            _fsync_dir(self.out_bin.parent)
        if caught and callable(old):
            old(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt
        return index


def _geometry_ok(geometry: Any) -> bool:
    """((width, height), source box, content box) with a positive size, boxes of 4 numbers."""
    try:
        size, sbox, cbox = geometry
        return (
            len(size) == 2
            and all(not isinstance(v, bool) and v == int(v) and 0 < v < 2**32 for v in size)
            and len(sbox) == len(cbox) == 4
            and all(isinstance(float(v), float) for v in (*sbox, *cbox))
        )
    except (TypeError, ValueError, OverflowError):
        return False


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def target_value(v: Any) -> float:
    """One value of a target vector: a number (not a bool), finite as a float32; a
    ValueError says which it is not. The one rule for a target value, whether a labels
    file's cell, ``pack_folder(targets=)`` or ``append`` gives it."""
    try:
        if isinstance(v, bool):
            raise TypeError
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"target {str(v)[:40]!r} is not a number") from None
    if not abs(x) <= _FLOAT32_MAX:  # NaN too
        raise ValueError(f"target {str(v)[:40]!r} is not finite as a float32")
    return x


def check_target(relpath: str, target: Any, k: int | None) -> tuple[float, ...] | None:
    """``target`` as the K numbers a record stores (``target_value`` each; ``k`` None: any
    K >= 1, the first record's; 0: none at all); a SourceError names a bad one. The one
    check of a target vector, whether ``pack_folder(targets=)`` or ``append`` is handed it."""
    if target is None and k == 0:
        return None
    if target is None:
        raise SourceError(f"{relpath}: no target vector given (every record needs one)")
    try:
        values = tuple(target_value(v) for v in target)
    except (TypeError, ValueError) as e:  # TypeError: not iterable
        why = e if isinstance(e, ValueError) else "not a sequence of numbers"
        raise SourceError(f"{relpath}: target vector {target!r:.60}: {why}") from None
    expected = k if k is not None else len(values) or "at least 1"
    if len(values) != expected:
        raise SourceError(
            f"{relpath}: target vector has {len(values)} values, "
            f"the pack holds {expected} per record"
        )
    return values


@contextmanager
def handling(signum: int, handler: Callable[[int, Any], Any]) -> Iterator[Any]:
    """``handler`` takes ``signum`` in the block; yields the handler it replaced. Only the
    main thread handles signals: elsewhere the block runs as it is."""
    old = signal.getsignal(signum)
    with ExitStack() as restore:
        if threading.current_thread() is threading.main_thread() and old is not None:
            signal.signal(signum, handler)
            restore.callback(signal.signal, signum, old)  # as the block ends, however
        yield old


def _fsync_dir(folder: Path) -> None:
    """Make the renames durable (no-op where directories cannot be opened or synced: the
    pack is published by then)."""
    with suppress(OSError), ExitStack() as opened:
        fd = os.open(folder, os.O_RDONLY)
        opened.callback(os.close, fd)
        os.fsync(fd)


# (crc32 of the stored bytes, per-channel sums, per-channel sums of squares) of one record
# (C = 1 or 3): the sums are of the HWC uint8 pixels a reader gets back
RecordDigest = tuple[int, tuple[int, ...], tuple[int, ...]]

# (256, 2): v and v**2 of each level, for the sums a histogram's counts make
_LEVELS = np.arange(256, dtype=np.int64)[:, None] ** np.arange(1, 3)


def encode_record(pixels: Any, codec: str, quality: int | None) -> Any:
    """The stored bytes of one record's pixels (an (h, w, C) uint8 array, or an ``Image``
    for yuv420 and jpeg): as they are (raw), Y, Cb, Cr planes (yuv420), a JPEG stream."""
    if codec == "jpeg":
        return encode_image(pixels, quality)
    return rgb_to_yuv420(np.asarray(pixels)) if codec == "yuv420" else pixels


def digest_stored(
    buf: Any, codec: str, width: int, height: int, channels: int, back: Any = None
) -> RecordDigest:
    """The digest of one stored record: the CRC of its bytes as stored, the exact sums of
    the pixels a reader gets back (yuv420: of ``yuv420_to_rgb``; jpeg: of ``decode_jpeg``,
    a ValueError when it does not decode to a ``width`` x ``height`` record; never of the
    source's pixels). ``back``: those pixels (an array, or the ``Image`` a worker just
    made), where the caller already has them.

    The sums come from Pillow's ``histogram()`` (256 counts per channel, one C pass over
    the pixels) times each level and its square: exact integers (counts * 255**2 stay far
    below 2**63), so a pack's stats do not depend on worker count or summation order.
    """
    data = np.frombuffer(buf, dtype=np.uint8)
    if back is None and codec == "jpeg":
        back = decode_jpeg(data, width, height, channels)
    elif back is None and codec == "yuv420":
        back = yuv420_to_rgb(data, width, height)
    elif back is None:
        back = data.reshape(height, width, channels)
    counts = np.array(as_image(back).histogram(), dtype=np.int64).reshape(channels, 256)
    sums, sums_sq = (counts @ _LEVELS).T.tolist()
    return fmt.record_checksum(data), tuple(sums), tuple(sums_sq)
