"""The test bench: benchmarks, the demo, the GPU proof, sample folders, the DDP example.

Not part of the installed package. The entry points beside this folder
(``scripts/*.py``) put it on the path simply by being run from here; the test
suite reaches it through pytest's ``pythonpath`` setting in pyproject.toml.
"""
