"""imgpack: pack an image folder once, then feed it to the GPU from one memory-mapped file.

The reader (torch) is exposed lazily so that ``import imgpack`` and the packer
CLI never pay for importing torch.
"""

from __future__ import annotations

from imgpack.errors import *  # noqa: F403
from imgpack.errors import __all__ as _error_names

__version__ = "0.1.0"

_LAZY = {
    "PackedImageDataset": "imgpack.reader.dataset",
    "make_loader": "imgpack.reader.loader",
    "to_device": "imgpack.reader.gpu",
    "DeviceTransform": "imgpack.reader.gpu",
    "watch": "imgpack.diagnose.meter",
    "InProcessOptions": "imgpack.reader.options",
    "WorkerOptions": "imgpack.reader.options",
    "OrderOptions": "imgpack.reader.options",
    "DistributedOptions": "imgpack.reader.options",
}

__all__ = ["__version__", *_error_names, *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'imgpack' has no attribute {name!r}")
