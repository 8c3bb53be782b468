"""The packer's sources: one module per kind of input, one protocol (``source``)."""

__all__: list[str] = []
