"""The imgpack on-disk format: the executable twin of ``docs/format.md``.

Shared by the packer and the reader; standard library and numpy only. Each name
has one home, imported from there (this package re-exports nothing):

* ``layout``: constants, the header, sections and the arithmetic that places them;
* ``fields``: version 2's record fields, and the per-record ``RecordGeometry``;
* ``write``: what a writer derives (record checksums, stats, pack id) and the index it writes;
* ``checks``: the rules an index must pass, one function each;
* ``index``: ``read_index``, which applies them, and the ``PackIndex`` it returns.

Readers must accept every format version ever written (``layout.SUPPORTED_VERSIONS``).
"""

from __future__ import annotations

__all__: list[str] = []
