"""The packer's sources: one module per kind of input, one base they share
(``source.Source``: listing, naming, labels, what is left out, reading, what pins them)."""

__all__: list[str] = []
