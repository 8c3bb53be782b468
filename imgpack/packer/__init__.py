"""The offline packer: image folder -> NAME.bin + NAME.json. Never imports torch."""

__all__: list[str] = []
