"""Tar shards and Parquet files made here, from Pillow-written images, as the tools that
ship datasets write them: WebDataset's members (``key.jpg``, ``key.cls``) and the Hugging
Face ``datasets`` layout (``struct<bytes, path>`` images, ``huggingface`` metadata)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from conftest import photo_like
from PIL import Image

__all__ = ["encoded", "hf_metadata", "samples", "write_folder", "write_parquet", "write_tar"]


def encoded(seed: int, width: int = 40, height: int = 30, fmt: str = "JPEG", **save) -> bytes:
    """A photo-like image as a file's bytes (JPEG, PNG, ...)."""
    buf = io.BytesIO()
    Image.fromarray(photo_like(width, height, seed)).save(buf, fmt, **save)
    return buf.getvalue()


def samples(count: int, classes: int = 3, *, first: int = 0) -> list[tuple[str, int, bytes]]:
    """(key, label, JPEG bytes) of ``count`` samples, keys in sorted order."""
    return [(f"s{first + k:04d}", (first + k) % classes, encoded(first + k)) for k in range(count)]


def write_tar(path: Path, members: list[tuple[str, bytes]], *, end: bool = True) -> Path:
    """A tar of ``members`` (name, data), in that order; ``end`` False leaves out the
    end-of-archive blocks, as a writer killed before its close would."""
    buf = io.BytesIO()
    tar = tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT)
    for name, data in members:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    if end:
        tar.close()
    else:
        tar.fileobj = io.BytesIO()  # close() writes its end blocks somewhere else
        tar.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return path


def shard(path: Path, rows: list[tuple[str, int, bytes]], ext: str = "jpg") -> Path:
    """A WebDataset shard: ``key.<ext>`` and ``key.cls`` per sample."""
    members = []
    for key, label, data in rows:
        members += [(f"{key}.{ext}", data), (f"{key}.cls", str(label).encode())]
    return write_tar(path, members)


def hf_metadata(names: list[str] | None) -> dict[str, str]:
    """The schema metadata ``datasets`` writes for an Image and a ClassLabel column."""
    features = {"image": {"decode": True, "id": None, "_type": "Image"}}
    if names is not None:
        features["label"] = {"names": names, "id": None, "_type": "ClassLabel"}
    return {"huggingface": json.dumps({"info": {"features": features}})}


def write_parquet(
    path: Path,
    rows: list[tuple[str, int | None, bytes | None]],
    *,
    names: list[str] | None = None,
    row_group: int = 4,
    metadata: dict[str, str] | None = None,
    struct: bool = True,
) -> Path:
    """A Hub-layout Parquet file: ``image`` struct<bytes, path> (or plain binary), ``label``
    int64, the ClassLabel ``names`` in the huggingface metadata when given. A row's bytes
    None is a null image, its label None a null label."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if struct:
        kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        images = pa.array([{"bytes": d, "path": f"{k}.jpg"} for k, _, d in rows], kind)
    else:
        images = pa.array([d for _, _, d in rows], pa.binary())
    table = pa.table({"image": images, "label": pa.array([lab for _, lab, _ in rows], pa.int64())})
    meta = hf_metadata(names) if metadata is None else metadata
    table = table.replace_schema_metadata(meta or None)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group)
    return path


def write_folder(root: Path, rows: list[tuple[str, int, bytes]], classes: list[str]) -> Path:
    """The same images unpacked: ``root/<class>/<key>.jpg``."""
    for key, label, data in rows:
        path = root / classes[label] / f"{key}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root
