"""The training-time reader: mmap Dataset, loaders, GPU-side helpers. Never imports Pillow."""
