"""The imgpack on-disk format: the executable twin of ``docs/format.md``.

Shared by the packer and the reader; standard library and numpy only. Each name
has one home, imported from there (this package re-exports nothing):

* ``layout``: constants, the header, sections and records, and the arithmetic that
  places them (``record_offsets``: where every record lies);
* ``codec``: the ``yuv420`` codec, to stored bytes and back;
* ``fields``: the standard record fields, and the per-record ``RecordGeometry``;
* ``write``: what a writer derives (record checksums, stats, pack id) and the index it writes;
* ``index``: ``read_index``, which applies every rule an index must pass, and the
  ``PackIndex`` it returns.

Readers must accept every format version released since version 3
(``layout.SUPPORTED_VERSIONS``); the pre-release versions 1 and 2 are refused with a
message that says to repack (``layout.PRE_RELEASE_VERSIONS``).
"""

__all__: list[str] = []
