"""Packs in object storage: ``PackedImageDataset("s3://bucket/train.bin")`` and
``pack-images SRC s3://bucket/train.bin``.

``store`` speaks to the filesystem (fsspec, imported only once a URL is used), ``cache``
keeps fetched blocks of records in one sparse local file per pack, the file the dataset
maps, ``mirror`` turns URLs into such local packs (and fetches the blocks of the next
batches while the current ones are read) and publishes a pack made locally at a URL. This
module imports nothing heavy: the reader and the packer ask ``has_url`` of every path.
"""

from __future__ import annotations

import re
from typing import Any

from imgpack.errors import ImgpackError

__all__ = ["has_url", "RemoteError"]

# a scheme of two letters or more (one letter is a Windows drive); file:// is a URL too
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")


class RemoteError(ImgpackError, OSError):
    """A store failed us: an object not found, an endpoint failing after retries, a fetched
    range that stays short or damaged, an upload refused. The message names the URL and
    the records; catch ``ImgpackError`` (or ``OSError``) to handle it."""


def has_url(source: Any) -> bool:
    """Whether ``source`` names something an fsspec filesystem serves, not a local path; for
    a list of paths, whether any of them does."""
    if isinstance(source, (list, tuple)):
        return any(has_url(s) for s in source)
    return isinstance(source, str) and _URL.match(source) is not None
