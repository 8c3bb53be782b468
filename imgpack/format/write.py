"""The writer's half of the format: what it derives from the records, and the index it writes.

Per-record checksums, the stats, the pack id and the index JSON are each
computed here once; the reader's checks (``imgpack.format.index``) hold every
pack to the same rules. Standard library and numpy only.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from imgpack.format import layout

__all__ = [
    "record_checksum",
    "stats_from_sums",
    "sums_possible",
    "compute_pack_id",
    "build_index",
    "write_json_atomic",
]


def record_checksum(buf: bytes | memoryview | np.ndarray) -> int:
    """CRC-32 of one record, the unit `verify` checks to find bit rot."""
    return zlib.crc32(buf) & 0xFFFFFFFF


def stats_from_sums(pixels: int, sums: list[int], sums_sq: list[int]) -> dict[str, Any]:
    """Per-channel mean/std on the 0..1 scale from exact integer sums of uint8 values.

    Integer sums make the result independent of worker count and let shards be
    merged exactly later.
    """
    n = max(pixels, 1)  # no pixels: every sum is 0, and so are mean and std
    mean = [s / n / 255.0 for s in sums]
    std = [math.sqrt(max(q * n - s * s, 0)) / n / 255.0 for s, q in zip(sums, sums_sq)]
    return {"mean": mean, "std": std, "pixels": pixels, "sum": list(sums), "sum_sq": list(sums_sq)}


def sums_possible(pixels: int, sums: list[int], sums_sq: list[int]) -> bool:
    """Whether per-channel ``sums`` and ``sums_sq`` can be those of ``pixels`` uint8 values.

    Per channel: ``0 <= sum <= 255 * pixels``, ``0 <= sum_sq <= 255 * sum`` (each
    ``v * v <= 255 * v``) and ``sum**2 <= pixels * sum_sq`` (Cauchy-Schwarz). Real pixels
    always pass, so no genuine pack or journal line is refused; the reader asks it of an
    index's stats and a resumed run of each journalled record's sums (the CRCs cover
    neither: a journal digit changed in place that stays possible is still believed, and
    the pack's stats then follow it).
    """
    return all(
        0 <= s <= 255 * pixels and 0 <= q <= 255 * s and s * s <= pixels * q
        for s, q in zip(sums, sums_sq)
    )


def compute_pack_id(
    *,
    shape: Sequence[int],
    count: int,
    classes: Sequence[str],
    payloads: Sequence[bytes],
    codec: str,
) -> bytes:
    """The pack's identity: 16 bytes of SHA-256 over what its records are.

    ``payloads`` are the bytes of every section but the pixels, which the checksums
    stand for, and of every record field. Derived, not drawn at random: the same
    folder packed twice (any worker count, resumed or not) is the same bytes,
    while any other record, label, path, class list, field or codec gives another id.
    The hashed JSON is ``[shape, count, classes, codec]``.
    """
    h = hashlib.sha256(b"imgpack pack id 2\n")
    head = [list(shape), count, list(classes), codec]
    h.update(json.dumps(head, ensure_ascii=False).encode("utf-8"))
    for payload in payloads:
        h.update(len(payload).to_bytes(8, "little"))
        h.update(payload)
    return h.digest()[: layout.PACK_ID_BYTES]


def build_index(
    *,
    data_file: str,
    count: int,
    height: int,
    width: int,
    classes: list[str],
    sections: dict[str, layout.Section],
    stats: dict[str, Any],
    skipped: list[dict[str, str]],
    packer: dict[str, Any],
    fields: dict[str, layout.RecordField],
    pack_id: str,
    extra: dict[str, Any] | None = None,
    channels: int,
    codec: str = "raw",
    jpeg: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON index as a dict, fields in the order docs/format.md lists them.

    ``height``/``width`` are the bound; a jpeg pack has the ``jpeg`` object after its
    ``codec`` (``quality``, ``subsampling``, ``stored_as_is``).
    """
    return {
        "format": layout.FORMAT_NAME,
        "format_version": layout.FORMAT_VERSION,
        "data_file": data_file,
        "data_file_bytes": layout.file_bytes(sections, fields),
        "count": count,
        "shape": [height, width, channels],
        "dtype": "uint8",
        "layout": "HWC",
        "codec": codec,
        **({"jpeg": dict(jpeg)} if jpeg is not None else {}),
        "data_offset": layout.HEADER_BYTES,
        "classes": list(classes),
        "sections": {name: s.to_json() for name, s in sections.items()},
        "fields": {name: f.to_json() for name, f in fields.items()},
        "pack_id": pack_id,
        "checksum": {"algorithm": "crc32", "unit": "record"},
        "stats": stats,
        "skipped": skipped,
        "packer": packer,
        **(extra or {}),
    }


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON under a temporary name in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    # not mkstemp: its 0600 mode would hide the index from other users of a shared dataset
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
