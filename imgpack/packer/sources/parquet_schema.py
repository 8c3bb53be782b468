"""Which columns of a Parquet file hold the images and the labels, and the class names.

The Hub's layout, as the ``datasets`` library writes it: an ``Image`` feature is stored as
``struct<bytes: binary, path: string>`` and a ``ClassLabel`` as integers, and the file's
schema metadata, under the key ``huggingface``, holds the features as JSON
(``{"info": {"features": {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel",
"names": [...]}}}}``). Files written by other tools have no such metadata: the columns are
then found by their types alone, and the classes are numbers.
"""

from __future__ import annotations

import json
from typing import Any

from imgpack.errors import SourceError

__all__ = ["UNLABELLED_HINT", "class_names", "image_column", "label_column"]

UNLABELLED_HINT = "pack them without labels with --label-column none"


def _is_image_type(t) -> bool:
    import pyarrow as pa

    binary = (pa.types.is_binary, pa.types.is_large_binary)
    if any(test(t) for test in binary):
        return True
    if pa.types.is_struct(t):
        k = t.get_field_index("bytes")
        return k >= 0 and any(test(t.field(k).type) for test in binary)
    return False


def _features(schema, path: str) -> dict[str, Any]:
    """The ``huggingface`` metadata's features ({} when there is none)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return {}
    try:
        meta = json.loads(raw)
    except ValueError:
        raise SourceError(f"{path}: its 'huggingface' schema metadata is not JSON") from None
    info = meta.get("info") if isinstance(meta, dict) else None
    features = info.get("features") if isinstance(info, dict) else None
    return features if isinstance(features, dict) else {}


def _columns_line(schema) -> str:
    return ", ".join(f"{f.name} ({f.type})" for f in schema)[:300]


def image_column(schema, wanted: str | None, path: str) -> str:
    """The image column: ``wanted``, else the one the metadata calls an ``Image``, else the
    one binary (or struct with a binary ``bytes``) column, else the one named ``image``."""
    found = [f.name for f in schema if _is_image_type(f.type)]
    if wanted is not None:
        if wanted not in schema.names:
            raise SourceError(
                f"{path}: no column {wanted!r} (--image-column); its columns: "
                f"{_columns_line(schema)}"
            )
        if wanted not in found:
            raise SourceError(
                f"{path}: column {wanted!r} is {schema.field(wanted).type}, not images "
                f"(binary, or a struct with a binary 'bytes' field)"
            )
        return wanted
    features = _features(schema, path)
    tagged = [n for n in found if (features.get(n) or {}).get("_type") == "Image"]
    for choice in (tagged, found, [n for n in found if n == "image"]):
        if len(choice) == 1:
            return choice[0]
    if not found:
        raise SourceError(
            f"{path}: no image column (binary, or a struct with a binary 'bytes' field); "
            f"its columns: {_columns_line(schema)}"
        )
    raise SourceError(
        f"{path}: {len(found)} image columns ({', '.join(found)}): name one with --image-column"
    )


def label_column(schema, wanted: str | None, path: str) -> str:
    """The label column: ``wanted``, else ``label``; integers either way."""
    import pyarrow as pa

    name = wanted or "label"
    if name not in schema.names:
        ints = [f.name for f in schema if pa.types.is_integer(f.type)]
        choose = f" (integer columns here: {', '.join(ints)})" if ints else ""
        what = f"no column {wanted!r} (--label-column)" if wanted else "no 'label' column"
        raise SourceError(
            f"{path}: {what}; name the label column with --label-column{choose}, "
            f"or {UNLABELLED_HINT}"
        )
    kind = schema.field(name).type
    if not pa.types.is_integer(kind):
        raise SourceError(
            f"{path}: label column {name!r} holds {kind}, expected integers (class numbers); "
            f"name another with --label-column, or {UNLABELLED_HINT}"
        )
    return name


def class_names(schema, column: str, path: str) -> list[str] | None:
    """The ``ClassLabel`` names the ``huggingface`` metadata gives ``column``, or None."""
    feature = _features(schema, path).get(column)
    if not isinstance(feature, dict) or feature.get("_type") != "ClassLabel":
        return None
    names = feature.get("names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SourceError(f"{path}: the ClassLabel of {column!r} has no list of names")
    if len(set(names)) != len(names):
        raise SourceError(f"{path}: the ClassLabel of {column!r} names a class twice")
    return names
