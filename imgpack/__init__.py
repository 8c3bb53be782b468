"""imgpack: pack an image folder once, then feed it to the GPU from one memory-mapped file.

This module is the public facade: ``imgpack.PackedImageDataset``, ``imgpack.FormatError``
and the rest of ``__all__`` are looked up in their home modules on first use, so that
``import imgpack`` and the packer CLI never pay for importing torch.
"""

from imgpack.errors import __all__ as _error_names

__version__ = "0.2.0"

_LAZY = {
    **dict.fromkeys(_error_names, "imgpack.errors"),
    "PackedImageDataset": "imgpack.reader.dataset",
    "make_loader": "imgpack.reader.loader",
    "PackLoader": "imgpack.reader.loader",
    "DeviceTransform": "imgpack.reader.transform",
    "watch": "imgpack.diagnose.meter",
    "InProcessOptions": "imgpack.reader.options",
    "WorkerOptions": "imgpack.reader.options",
    "OrderOptions": "imgpack.reader.options",
    "DistributedOptions": "imgpack.reader.options",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'imgpack' has no attribute {name!r}")
