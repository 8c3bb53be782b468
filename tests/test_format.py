"""The on-disk format: golden bytes, layout arithmetic, and every way read_index refuses a pack."""

from __future__ import annotations

import dataclasses
import io
import json
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

from imgpack.errors import FormatError, PackChangedError
from imgpack.format.codec import yuv420_to_rgb
from imgpack.format.fields import GEOMETRY_FIELDS, RECORD_FIELDS, RecordGeometry
from imgpack.format.index import read_index
from imgpack.format.layout import (
    FORMAT_VERSION,
    HEADER_BYTES,
    PRE_RELEASE_VERSIONS,
    SUPPORTED_VERSIONS,
    decode_header,
    encode_header,
    file_bytes,
    layout_fields,
    layout_sections,
    pack_paths,
)
from imgpack.format.write import (
    build_index,
    compute_pack_id,
    record_checksum,
    stats_from_sums,
    write_json_atomic,
)
from imgpack.packer.verify import verify_pack
from imgpack.packer.writer import PackWriter

# --- the golden 2-image packs (format version 3): records of their own size, a codec -----

PIXELS_A = np.arange(18, dtype=np.uint8).reshape(2, 3, 3)
PIXELS_B = (255 - 7 * np.arange(18)).astype(np.uint8).reshape(2, 3, 3)
SMALL_B = PIXELS_B[:1, :2]  # record 1: 1 row of 2 pixels, inside the 2x3 bound
PACKER = {"size": [3, 2], "resize": "center-crop", "filter": "bilinear"}
GEOMETRY_A = RecordGeometry((640, 480), (80.0, 0.0, 560.0, 480.0), (0.0, 0.0, 3.0, 2.0))
GEOMETRY_S = RecordGeometry((300, 150), (0.0, 0.0, 300.0, 150.0), (0.0, 0.0, 2.0, 1.0))
TARGET_A, TARGET_B = [1.0, 0.0], [0.5, -2.0]
PACK_ID_RAW = "fc294883c88db9659c115c949f2bf2d6"
PACK_ID_YUV = "c16d1d408e1f297848ae2075167e221f"
GOLDEN_V3_SIZE = 4640
PRE_RELEASE = "was a pre-release format; repack it with pack-images"


def golden_bytes(chunks: dict, size: int) -> bytes:
    """``size`` bytes: each chunk's hex at its offset, zero everywhere else."""
    out = bytearray(size)
    for offset, hexed in chunks.items():
        chunk = bytes.fromhex(hexed)
        out[offset : offset + len(chunk)] = chunk
    return bytes(out)


def _v3_chunks(nbytes: str, pack_id: str, codec: str, pixels: str, crcs: str) -> dict:
    return {
        0: "89494d475041434b"  # magic
        "03000000"  # format version 3
        "00100000"  # header bytes 4096
        "0200000000000000"  # count 2
        + nbytes  # u64: the pixels section's size
        + "02000000 03000000 03000000"  # the bound: height 2, width 3; channels 3
        + pack_id  # 16 bytes at 44
        + codec,  # u32 at 60: 0 raw, 1 yuv420
        4096: pixels,
        4160: "00000000 01000000",  # labels <i4
        4224: crcs,  # CRC-32 of each record's stored bytes <u4
        4288: "0000000000000000 0900000000000000 1200000000000000",  # path offsets <u8
        4352: b"cat/0.pngdog/1.png".hex(),  # paths
        4416: "03000000 02000000 02000000 01000000",  # record_size <u4 (3, 2), (2, 1)
        4480: "80020000 e0010000 2c010000 96000000",  # source_size <u4 (640, 480), (300, 150)
        4544: "00 00 a0 42 00 00 00 00 00 00 0c 44 00 00 f0 43"  # source_box 80, 0, 560, 480
        "00000000 00000000 00009643 00001643",  # 0, 0, 300, 150
        4608: "00000000 00000000 00004040 00000040"  # content_box <f4 0, 0, 3, 2
        "00000000 00000000 00000040 0000803f",  # 0, 0, 2, 1
    }


GOLDEN_V3_RAW = _v3_chunks(
    "1800000000000000",  # 24 = 2*3*3 + 1*2*3
    PACK_ID_RAW,
    "00000000",
    "000102030405060708090a0b0c0d0e0f1011"  # record 0: 2x3 HWC
    "fff8f1eae3dc",  # record 1: 1x2 HWC, at offset 18
    "857ff5dc 970bdb4d",
)
GOLDEN_V3_YUV = _v3_chunks(
    "0e00000000000000",  # 14 = (6 + 2*2*1) + (2 + 2*1*1)
    PACK_ID_YUV,
    "01000000",
    "01 04 07 0a 0d 10  81 81  7f 7f"  # record 0: Y 2x3, Cb 1x2, Cr 1x2
    "f9 e4  7b  84",  # record 1, at offset 10: Y 1x2, Cb 1x1, Cr 1x1
    "322960fe 4919df52",
)


def _field_entry(offset, nbytes, dtype, shape):
    return {"offset": offset, "nbytes": nbytes, "dtype": dtype, "shape": shape, "required": False}


def _v3_index(codec: str, pixels: int, pack_id: str, stats: dict) -> dict:
    return {
        "format": "imgpack",
        "format_version": 3,
        "data_file": "pack.bin",
        "data_file_bytes": GOLDEN_V3_SIZE,
        "count": 2,
        "shape": [2, 3, 3],
        "dtype": "uint8",
        "layout": "HWC",
        "codec": codec,
        "data_offset": 4096,
        "classes": ["cat", "dog"],
        "sections": {
            "pixels": {"offset": 4096, "nbytes": pixels, "dtype": "|u1"},
            "labels": {"offset": 4160, "nbytes": 8, "dtype": "<i4"},
            "checksums": {"offset": 4224, "nbytes": 8, "dtype": "<u4"},
            "path_offsets": {"offset": 4288, "nbytes": 24, "dtype": "<u8"},
            "paths": {"offset": 4352, "nbytes": 18, "dtype": "|u1"},
        },
        "fields": {
            "record_size": {**_field_entry(4416, 16, "<u4", [2]), "required": True},
            "source_size": _field_entry(4480, 16, "<u4", [2]),
            "source_box": _field_entry(4544, 32, "<f4", [4]),
            "content_box": _field_entry(4608, 32, "<f4", [4]),
        },
        "pack_id": pack_id,
        "checksum": {"algorithm": "crc32", "unit": "record"},
        "stats": stats,
        "skipped": [],
        "packer": PACKER,
    }


GOLDEN_V3_RAW_INDEX = _v3_index(
    "raw",
    24,
    PACK_ID_RAW,
    stats_from_sums(8, [534, 526, 518], [120276, 113624, 107180]),
)
# the stats are those of the RGB a reader gets back, not of the RGB that was packed
GOLDEN_V3_YUV_INDEX = _v3_index(
    "yuv420",
    14,
    PACK_ID_YUV,
    stats_from_sums(8, [534, 526, 522], [120276, 113624, 106380]),
)
V3_KEYS = [k for k in GOLDEN_V3_RAW_INDEX if k != "skipped"]


def write_v3(folder: Path, codec: str = "raw", *, targets: bool = False) -> Path:
    """A golden version 3 pack, written by the real writer: records 3x2 and 2x1.

    ``targets``: with a 2-value target vector per record, a field after the geometry
    (``targets`` at 4672, the file 4688 bytes; not the golden bytes, as the pack id differs).
    """
    folder.mkdir(parents=True, exist_ok=True)
    with PackWriter(
        folder / "pack.bin",
        height=2,
        width=3,
        classes=["cat", "dog"],
        codec=codec,
        target_dim=2 if targets else 0,
    ) as w:
        ta, tb = (TARGET_A, TARGET_B) if targets else (None, None)
        w.append(PIXELS_A, 0, "cat/0.png", geometry=GEOMETRY_A, target=ta)
        w.append(SMALL_B, 1, "dog/1.png", geometry=GEOMETRY_S, target=tb)
        w.finish(packer=dict(PACKER))
    return folder / "pack.bin"


@pytest.mark.parametrize(
    ("codec", "chunks", "want"),
    [("raw", GOLDEN_V3_RAW, GOLDEN_V3_RAW_INDEX), ("yuv420", GOLDEN_V3_YUV, GOLDEN_V3_YUV_INDEX)],
)
def test_writer_output_matches_golden_v3_bytes(tmp_path, codec, chunks, want):
    out = write_v3(tmp_path, codec)
    assert out.read_bytes() == golden_bytes(chunks, GOLDEN_V3_SIZE)
    index = json.loads((tmp_path / "pack.json").read_text(encoding="utf-8"))
    assert index == {**want, "skipped": []}
    assert [k for k in index if k != "skipped"] == V3_KEYS  # the documented field order
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pack.bin", "pack.json"]


def test_golden_v3_reads_back_records_of_their_own_size(tmp_path):
    raw = read_index(write_v3(tmp_path / "raw"))
    yuv = read_index(write_v3(tmp_path / "yuv", "yuv420"))
    for index in (raw, yuv):
        assert index.raw["format_version"] == 3
        assert (index.shape, index.classes) == ((2, 3, 3), ("cat", "dog"))
        assert index.record_sizes.tolist() == [[3, 2], [2, 1]]
        assert not index.record_sizes.flags.writeable
        assert (index.uniform, index.record_bytes) == (False, None)
    assert (raw.codec, raw.record_offsets.tolist()) == ("raw", [0, 18, 24])
    assert (yuv.codec, yuv.record_offsets.tolist()) == ("yuv420", [0, 10, 14])
    assert (raw.pack_id, yuv.pack_id) == (PACK_ID_RAW, PACK_ID_YUV)
    data = (tmp_path / "raw" / "pack.bin").read_bytes()
    assert data[4096 + 18 : 4096 + 24] == SMALL_B.tobytes()
    stored = (tmp_path / "yuv" / "pack.bin").read_bytes()[4096 : 4096 + 14]
    back = [yuv420_to_rgb(np.frombuffer(stored[a:b], np.uint8), w, h)
            for (a, b), (w, h) in zip([(0, 10), (10, 14)], [(3, 2), (2, 1)])]  # fmt: skip
    assert np.abs(back[0].astype(int) - PIXELS_A).max() <= 2
    sums = [int(back[0][..., c].sum() + back[1][..., c].sum()) for c in range(3)]
    assert sums == yuv.raw["stats"]["sum"]  # what a reader gets back
    assert read_index(write_v3(tmp_path / "again", "yuv420")).pack_id == yuv.pack_id
    assert raw.pack_id != yuv.pack_id
    assert raw.section_array("labels", data).tolist() == [0, 1]
    offsets, paths = raw.section_array("path_offsets", data), raw.section_array("paths", data)
    assert [raw.source_path(i, offsets, paths) for i in range(2)] == ["cat/0.png", "dog/1.png"]
    crcs = raw.section_array("checksums", data)
    assert crcs.tolist() == [zlib.crc32(PIXELS_A.tobytes()), zlib.crc32(SMALL_B.tobytes())]


def test_geometry_and_target_vectors_read_back(tmp_path):
    index = read_index(write_v3(tmp_path, targets=True))
    assert index.fields["targets"].offset == 4672 and index.data_file_bytes == 4688
    sizes, sboxes, cboxes = index.geometry()
    assert sizes.dtype == np.int64 and sizes.tolist() == [[640, 480], [300, 150]]
    assert sboxes.dtype == np.float32
    assert sboxes.tolist() == [list(GEOMETRY_A.source_box), list(GEOMETRY_S.source_box)]
    assert cboxes.tolist() == [list(GEOMETRY_A.content_box), list(GEOMETRY_S.content_box)]
    targets = index.target_vectors()
    assert targets.dtype == np.float32 and targets.tolist() == [TARGET_A, TARGET_B]
    assert not targets.flags.writeable and not sizes.flags.writeable


def test_pack_id_is_the_documented_hash_of_the_records():
    """Same records, same id (byte-identical repacks); another label, path, class or codec:
    another."""
    data = golden_bytes(GOLDEN_V3_RAW, GOLDEN_V3_SIZE)
    index = GOLDEN_V3_RAW_INDEX
    payloads = [
        data[e["offset"] : e["offset"] + e["nbytes"]]
        for e in [*list(index["sections"].values())[1:], *index["fields"].values()]
    ]
    args = {"shape": [2, 3, 3], "count": 2, "classes": ["cat", "dog"], "codec": "raw"}
    assert compute_pack_id(payloads=payloads, **args).hex() == PACK_ID_RAW
    for other in ({"classes": ["cat", "cow"]}, {"codec": "yuv420"}, {"count": 3}):
        assert compute_pack_id(payloads=payloads, **{**args, **other}).hex() != PACK_ID_RAW
    changed = [payloads[0][:-1] + b"\x07", *payloads[1:]]
    assert compute_pack_id(payloads=changed, **args).hex() != PACK_ID_RAW


def test_index_and_data_share_the_umask_mode(tmp_path):
    """The index must be as readable as the .bin (a 0600 temp file would hide it from others)."""
    write_v3(tmp_path)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes["pack.json"] == modes["pack.bin"]


# --- the pre-release formats (versions 1 and 2): refused, saying to repack -----------------

# Made by hand from literals, as the packer of those days wrote them: two 2x3 RGB records
# (every record H x W raw, one record's bytes at header byte 24 and in "record_bytes"); version
# 2 added the pack id (header bytes 44..59) and record fields (geometry, targets) after paths.
PRE_RELEASE_CHUNKS = {
    4096: "000102030405060708090a0b0c0d0e0f1011"  # record 0, HWC
    "fff8f1eae3dcd5cec7c0b9b2aba49d968f88",  # record 1
    4160: "00000000 01000000",  # labels <i4
    4224: "857ff5dc 9fd018bc",  # CRC-32 of each record <u4
    4288: "0000000000000000 0900000000000000 1200000000000000",  # path offsets <u8
    4352: b"cat/0.pngdog/1.png".hex(),  # paths, UTF-8
}
V2_PACK_ID = "1e6c42f4a52d5a7296fccb610b1f4185"
V1_CHUNKS = {
    0: "89494d475041434b 01000000 00100000 0200000000000000 1200000000000000"
    "02000000 03000000 03000000",  # version 1; count 2, record bytes 18, 2 x 3 x 3
    **PRE_RELEASE_CHUNKS,
}
V2_CHUNKS = {
    0: "89494d475041434b 02000000 00100000 0200000000000000 1200000000000000"
    "02000000 03000000 03000000" + V2_PACK_ID,  # version 2: the pack id at 44
    **PRE_RELEASE_CHUNKS,
    4416: "80020000 e0010000 2c010000 90010000",  # source_size <u4 (640, 480), (300, 400)
    4480: "00 00 a0 42 00 00 00 00 00 00 0c 44 00 00 f0 43"  # source_box <f4 80, 0, 560, 480
    "00000000 00000000 00009643 0000c843",  # 0, 0, 300, 400
    4544: "00000000 00000000 00004040 00000040"  # content_box <f4 0, 0, 3, 2
    "0000803e 00000000 00003040 00000040",  # 0.25, 0, 2.75, 2
    4608: "0000803f 00000000 0000003f 000000c0",  # targets <f4 (1, 0), (0.5, -2)
}
V1_INDEX = {
    "format": "imgpack",
    "format_version": 1,
    "data_file": "pack.bin",
    "data_file_bytes": 4370,
    "count": 2,
    "shape": [2, 3, 3],
    "dtype": "uint8",
    "layout": "HWC",
    "record_bytes": 18,
    "data_offset": 4096,
    "classes": ["cat", "dog"],
    "sections": {
        "pixels": {"offset": 4096, "nbytes": 36, "dtype": "|u1"},
        "labels": {"offset": 4160, "nbytes": 8, "dtype": "<i4"},
        "checksums": {"offset": 4224, "nbytes": 8, "dtype": "<u4"},
        "path_offsets": {"offset": 4288, "nbytes": 24, "dtype": "<u8"},
        "paths": {"offset": 4352, "nbytes": 18, "dtype": "|u1"},
    },
    "checksum": {"algorithm": "crc32", "unit": "record"},
    "stats": {
        "mean": [0.4117647058823529, 0.4, 0.38823529411764707],
        "std": [0.3953302971305089, 0.38017984776608466, 0.36507466069502004],
        "pixels": 12,
        "sum": [1260, 1224, 1188],
        "sum_sq": [254250, 237630, 221610],
    },
    "skipped": [{"path": "dog/broken.jpg", "reason": "cannot identify image file"}],
    "packer": PACKER,
}
V2_INDEX = {
    **{k: v for k, v in V1_INDEX.items() if k not in ("checksum", "stats", "skipped", "packer")},
    "format_version": 2,
    "data_file_bytes": 4624,
    "fields": {
        "source_size": _field_entry(4416, 16, "<u4", [2]),
        "source_box": _field_entry(4480, 32, "<f4", [4]),
        "content_box": _field_entry(4544, 32, "<f4", [4]),
        "targets": _field_entry(4608, 16, "<f4", [2]),
    },
    "pack_id": V2_PACK_ID,
    **{k: V1_INDEX[k] for k in ("checksum", "stats", "skipped", "packer")},
}


def _write_pre_release(folder: Path, chunks: dict, index: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pack.bin").write_bytes(golden_bytes(chunks, index["data_file_bytes"]))
    (folder / "pack.json").write_text(json.dumps(index, indent=1), encoding="utf-8")
    return folder / "pack.bin"


def write_v1(folder: Path) -> Path:
    """A version 1 pack (pre-release, no longer read), made by hand from literals."""
    return _write_pre_release(folder, V1_CHUNKS, V1_INDEX)


def write_v2(folder: Path) -> Path:
    """A version 2 pack (pre-release, no longer read), made by hand from literals."""
    return _write_pre_release(folder, V2_CHUNKS, V2_INDEX)


@pytest.mark.parametrize(("version", "write"), [(1, write_v1), (2, write_v2)])
def test_pre_release_packs_are_refused_in_one_line_that_says_to_repack(tmp_path, version, write):
    path = write(tmp_path)
    assert path.read_bytes()[8:12] == version.to_bytes(4, "little")  # what it claims to be
    want = f"pack.json: format version {version} {PRE_RELEASE}"
    for name in (path, path.with_suffix(".json")):
        with pytest.raises(FormatError) as err:
            read_index(name)
        assert str(err.value) == want
    assert verify_pack(path).problems == [want]
    assert set(PRE_RELEASE_VERSIONS) == {1, 2} and SUPPORTED_VERSIONS == (FORMAT_VERSION,) == (3,)


# --- the golden jpeg pack (format version 3, codec jpeg): records of stored length --------

# Pillow's (libjpeg-turbo's) baseline encoding of PIXELS_A and SMALL_B at quality 90, kept as
# literals so that the golden bytes do not follow the encoder's version: SOI, JFIF APP0, the
# two quantisation tables, SOF0 (8 bits, h, w, 3 components: Y 2x2, Cb and Cr 1x1 = 4:2:0),
# the four standard Huffman tables (ITU T.81 Annex K.3), SOS, entropy-coded data, EOI.
JPEG_HEAD = (
    "ffd8 ffe000104a46494600010100000100010000"
    "ffdb0043000302020302020303030304030304050805050404050a070706080c0a0c0c0b0a0b0b0d0e12100d"
    "0e110e0b0b1016101113141515150c0f171816141812141514ffdb00430103040405040509050509140d0b0d"
    "1414141414141414141414141414141414141414141414141414141414141414141414141414141414141414"
    "141414141414"
)
JPEG_TABLES = (
    "ffc4001f0000010501010101010100000000000000000102030405060708090a0bffc400b510000201030302"
    "0403050504040000017d01020300041105122131410613516107227114328191a1082342b1c11552d1f02433"
    "627282090a161718191a25262728292a3435363738393a434445464748494a535455565758595a6364656667"
    "68696a737475767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8"
    "b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffc4001f"
    "0100030101010101010101010000000000000102030405060708090a0bffc400b51100020102040403040705"
    "040400010277000102031104052131061241510761711322328108144291a1b1c109233352f0156272d10a16"
    "2434e125f11718191a262728292a35363738393a434445464748494a535455565758595a636465666768696a"
    "737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9ba"
    "c2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9fa"
    "ffda000c03010002110311003f00"
)


def _sof(h: int, w: int) -> str:
    return f"ffc00011 08 {h:04x} {w:04x} 03 012200 021101 031101"


JPEG_A = bytes.fromhex(JPEG_HEAD + _sof(2, 3) + JPEG_TABLES + "fcce8618fca5fddaf4f4a28a2ac83f ffd9")
JPEG_B = bytes.fromhex(
    JPEG_HEAD + _sof(1, 2) + JPEG_TABLES + "fd12bfff008feb8ffae8dfce8a28ae23ac ffd9"
)
PACK_ID_JPEG = "aa730cdb9e23732f762965efaa4cb2f5"
GOLDEN_JPEG_SIZE = 5984


def _decoded(stream: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(stream)))


def write_jpeg(folder: Path) -> Path:
    """The golden jpeg pack: the two streams stored as given (``size`` says their size)."""
    folder.mkdir(parents=True, exist_ok=True)
    with PackWriter(
        folder / "pack.bin", height=2, width=3, classes=["cat", "dog"], codec="jpeg"
    ) as w:
        w.append(JPEG_A, 0, "cat/0.png", geometry=GEOMETRY_A, size=(3, 2))
        w.append(JPEG_B, 1, "dog/1.png", geometry=GEOMETRY_S, size=(2, 1))
        w.finish(packer=dict(PACKER))
    return folder / "pack.bin"


GOLDEN_JPEG = {
    0: "89494d475041434b 03000000 00100000 0200000000000000"
    "0205000000000000"  # the pixels section: 640 + 642 = 1282 bytes
    "02000000 03000000 03000000" + PACK_ID_JPEG + "02000000",  # codec 2: jpeg
    4096: (JPEG_A + JPEG_B).hex(),  # record 0 at 0 (640 bytes), record 1 at 640 (642)
    5440: "00000000 01000000",  # labels
    5504: "c148300a feb9a061",  # CRC-32 of each stream
    5568: "0000000000000000 0900000000000000 1200000000000000",  # path offsets
    5632: b"cat/0.pngdog/1.png".hex(),
    5696: "03000000 02000000 02000000 01000000",  # record_size (3, 2), (2, 1)
    5760: "80020000 82020000",  # record_length <u4 [1]: 640, 642
    5824: "80020000 e0010000 2c010000 96000000",  # source_size
    5888: "00 00 a0 42 00 00 00 00 00 00 0c 44 00 00 f0 43"
    "00000000 00000000 00009643 00001643",  # source_box
    5952: "00000000 00000000 00004040 00000040"
    "00000000 00000000 00000040 0000803f",  # content_box, ending the file at 5984
}


def test_writer_output_matches_golden_jpeg_bytes(tmp_path):
    out = write_jpeg(tmp_path)
    assert out.read_bytes() == golden_bytes(GOLDEN_JPEG, GOLDEN_JPEG_SIZE)
    index = json.loads((tmp_path / "pack.json").read_text(encoding="utf-8"))
    assert list(index)[:10] == [*V3_KEYS[:9], "jpeg"]  # the jpeg object follows the codec
    assert index["codec"] == "jpeg"
    assert index["jpeg"] == {"quality": 90, "subsampling": "4:2:0", "stored_as_is": 0}
    assert index["fields"]["record_length"] == {
        **_field_entry(5760, 8, "<u4", [1]),
        "required": True,
    }
    assert list(index["fields"]) == ["record_size", "record_length", *GEOMETRY_FIELDS]
    # the stats are of the pixels Pillow decodes, which another JPEG decoder may round otherwise
    back = [_decoded(JPEG_A), _decoded(JPEG_B)]
    sums = [int(back[0][..., c].sum() + back[1][..., c].sum()) for c in range(3)]
    assert index["stats"]["sum"] == sums and index["stats"]["pixels"] == 8
    assert index["pack_id"] == PACK_ID_JPEG


def test_golden_jpeg_reads_back_streams_of_their_own_length(tmp_path):
    index = read_index(write_jpeg(tmp_path))
    assert (index.codec, index.quality, index.uniform, index.record_bytes) == (
        "jpeg",
        90,
        False,
        None,
    )
    assert index.record_lengths.tolist() == [640, 642] and not index.record_lengths.flags.writeable
    assert index.record_offsets.tolist() == [0, 640, 1282]
    data = (tmp_path / "pack.bin").read_bytes()
    assert data[4096 : 4096 + 640] == JPEG_A and data[4096 + 640 : 4096 + 1282] == JPEG_B
    assert np.abs(_decoded(JPEG_A).astype(int) - PIXELS_A).max() <= 12  # 4:2:0 of a tiny ramp
    assert _decoded(JPEG_B).shape == (1, 2, 3)


def test_record_sizes_are_read_when_asked_and_never_pickled(tmp_path):
    import pickle

    index = read_index(write_v3(tmp_path, "yuv420"))
    bare = len(pickle.dumps(index))
    assert index.record_offsets.tolist() == [0, 10, 14]  # reads record_size, keeps it
    again = pickle.loads(pickle.dumps(index))
    assert len(pickle.dumps(index)) == bare  # what travels to a worker does not grow
    assert again.record_sizes.tolist() == [[3, 2], [2, 1]] and again == index


def test_uniform_v3_packs_keep_the_v2_fast_path(tmp_path, make_pack):
    index = read_index(make_pack(count=3, height=4, width=5)[0])
    assert (index.raw["format_version"], index.uniform, index.record_bytes) == (3, True, 60)
    assert index.record_offsets.tolist() == [0, 60, 120, 180]
    assert index.fields["record_size"].required


# --- layout arithmetic and the header ----------------------------------------


def test_layout_of_the_golden_pack():
    sections = layout_sections(2, 24, 18)
    assert {k: s.to_json() for k, s in sections.items()} == GOLDEN_V3_RAW_INDEX["sections"]
    names = ("record_size", *GEOMETRY_FIELDS)
    specs = [(n, RECORD_FIELDS[n].dtype, RECORD_FIELDS[n].shape) for n in names]
    fields = layout_fields(sections, 2, specs)
    want = GOLDEN_V3_RAW_INDEX["fields"]
    assert {k: f.to_json() for k, f in fields.items()} == {
        k: {**want[k], "required": False} for k in names
    }
    assert file_bytes(sections, fields) == GOLDEN_V3_SIZE


@pytest.mark.parametrize("count", [0, 1, 2, 7, 1000])
@pytest.mark.parametrize(("h", "w", "paths"), [(1, 1, 0), (2, 3, 5), (224, 224, 12345)])
def test_layout_rules(count, h, w, paths):
    sections = layout_sections(count, count * h * w * 3, paths)
    assert list(sections) == ["pixels", "labels", "checksums", "path_offsets", "paths"]
    assert sections["pixels"].offset == HEADER_BYTES == 4096
    sizes = [count * h * w * 3, 4 * count, 4 * count, 8 * (count + 1), paths]
    assert [s.nbytes for s in sections.values()] == sizes
    ordered = list(sections.values())
    for a, b in zip(ordered, ordered[1:]):
        assert b.offset % 64 == 0
        assert a.end <= b.offset < a.end + 64  # aligned, and no more padding than that
    assert file_bytes(sections) == ordered[-1].end
    assert sections["path_offsets"].nbytes == 8 * (count + 1)


def test_header_round_trip():
    raw = encode_header(
        count=1_000_000,
        height=224,
        width=160,
        channels=3,
        pack_id=bytes(16),
        codec="raw",
        pixels_nbytes=1_000_000 * 224 * 160 * 3,
    )
    assert len(raw) == 4096 and raw[:8] == b"\x89IMGPACK" and not any(raw[44:])
    assert decode_header(raw) == {
        "format_version": 3,
        "data_offset": 4096,
        "count": 1_000_000,
        "pixels_nbytes": 1_000_000 * 224 * 160 * 3,
        "height": 224,
        "width": 160,
        "channels": 3,
        "pack_id": "00" * 16,
        "codec": "raw",
    }


SMALL = {"count": 5, "height": 4, "width": 6}  # a header's record count and bound


def test_header_carries_channels_and_pack_id():
    pid = bytes(range(16))
    raw = encode_header(**SMALL, channels=1, pack_id=pid, pixels_nbytes=120, codec="raw")
    assert len(raw) == 4096 and raw[44:60] == pid and not any(raw[60:])
    head = decode_header(raw)
    assert (head["format_version"], head["channels"], head["pixels_nbytes"]) == (3, 1, 120)
    assert head["pack_id"] == pid.hex()


def test_v3_header_carries_the_pixels_size_and_the_codec():
    pid = bytes(range(16))
    raw = encode_header(**SMALL, channels=3, pack_id=pid, pixels_nbytes=77, codec="yuv420")
    assert len(raw) == 4096 and raw[24:32] == (77).to_bytes(8, "little")
    assert raw[44:60] == pid and raw[60:64] == b"\x01\0\0\0" and not any(raw[64:])
    assert decode_header(raw) == {
        "format_version": 3,
        "data_offset": 4096,
        "count": 5,
        "pixels_nbytes": 77,
        "height": 4,
        "width": 6,
        "channels": 3,
        "pack_id": pid.hex(),
        "codec": "yuv420",
    }
    plain = decode_header(
        encode_header(**SMALL, channels=3, pack_id=pid, pixels_nbytes=360, codec="raw")
    )
    assert (plain["pixels_nbytes"], plain["codec"]) == (360, "raw")
    assert decode_header(raw[:60] + (9).to_bytes(4, "little") + raw[64:])["codec"] == 9


@pytest.mark.parametrize("raw", [b"", b"\x89IMGPACK", b"\x89PNG\r\n\x1a\n" + bytes(4088)])
def test_decode_header_refuses_non_packs(raw):
    with pytest.raises(FormatError, match="x.bin: not an imgpack data file"):
        decode_header(raw, name="x.bin")


def test_record_checksum_is_zlib_crc32():
    rec = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    assert record_checksum(rec) == zlib.crc32(rec.tobytes())
    assert record_checksum(rec.tobytes()) == zlib.crc32(rec.tobytes())


def test_stats_merge_exactly_across_shards():
    rng = np.random.default_rng(1)
    a, b = (rng.integers(0, 256, (n, 4, 5, 3), dtype=np.uint8) for n in (3, 4))

    def sums(x):
        flat = x.reshape(-1, 3).astype(np.int64)
        return flat.shape[0], flat.sum(0).tolist(), (flat * flat).sum(0).tolist()

    (na, sa, qa), (nb, sb, qb) = sums(a), sums(b)
    merged = stats_from_sums(
        na + nb, [x + y for x, y in zip(sa, sb)], [x + y for x, y in zip(qa, qb)]
    )
    whole = stats_from_sums(*sums(np.concatenate([a, b])))
    assert merged == whole
    ref = np.concatenate([a, b]).reshape(-1, 3) / 255.0
    assert merged["mean"] == pytest.approx(ref.mean(0).tolist(), rel=1e-12)
    assert merged["std"] == pytest.approx(ref.std(0).tolist(), rel=1e-12)  # population std
    assert stats_from_sums(0, [0, 0, 0], [0, 0, 0])["mean"] == [0.0, 0.0, 0.0]


def test_pack_paths_names_either_file():
    assert pack_paths("d/a.bin") == (Path("d/a.json"), Path("d/a.bin"))
    assert pack_paths("d/a.json") == (Path("d/a.json"), Path("d/a.bin"))


def test_empty_and_unlabelled_packs_read(tmp_path):
    with PackWriter(tmp_path / "empty.bin", height=4, width=4, classes=["a"]) as w:
        w.finish(packer={})
    assert read_index(tmp_path / "empty.bin").count == 0
    with PackWriter(tmp_path / "nolab.bin", height=2, width=3, classes=[]) as w:
        w.append(PIXELS_A, -1, "0.png")
        w.finish(packer={})
    assert read_index(tmp_path / "nolab.json").classes == ()


# --- read_index on every kind of damage ----------------------------------------


def _json(fn):
    def mutate(folder: Path) -> None:
        path = folder / "pack.json"
        raw = json.loads(path.read_text(encoding="utf-8"))
        fn(raw)
        path.write_text(json.dumps(raw), encoding="utf-8")

    return mutate


def _set(key, value):
    return _json(lambda raw: raw.__setitem__(key, value))


def _drop(key):
    return _json(lambda raw: raw.pop(key))


def _section(name, key, value):
    return _json(lambda raw: raw["sections"][name].__setitem__(key, value))


def _bin_at(offset, data: bytes):
    def mutate(folder: Path) -> None:
        with open(folder / "pack.bin", "r+b") as f:
            f.seek(offset)
            f.write(data)

    return mutate


def _text(data: bytes):
    return lambda folder: (folder / "pack.json").write_bytes(data)


def _truncate(size):
    def mutate(folder: Path) -> None:
        with open(folder / "pack.bin", "r+b") as f:
            f.truncate(size)

    return mutate


def _u32(v):
    return int(v).to_bytes(4, "little", signed=v < 0)


def _truncate_json(folder: Path) -> None:
    path = folder / "pack.json"
    path.write_bytes(path.read_bytes()[:300])


def _paths_past_the_end(raw: dict) -> None:
    """The index agrees with itself but claims more bytes than the .bin has."""
    raw["sections"]["paths"]["offset"] = 8192
    raw["data_file_bytes"] = 8192 + 18


REQUIRED = (
    "format format_version data_file data_file_bytes count shape dtype layout codec "
    "data_offset classes sections fields pack_id checksum stats skipped packer"
).split()

# the file each message must start with, and the error class, kept short for the table
J, B = "pack.json", "pack.bin"
FE = FormatError
no_mean = _json(lambda r: r["stats"].pop("mean"))
float_sum = _json(lambda r: r["stats"].__setitem__("sum", [1.5, 2, 3]))
wrong_pixels = _json(lambda r: r["stats"].__setitem__("pixels", 11))
no_labels = _json(lambda r: r["sections"].pop("labels"))
sha256 = _set("checksum", {"algorithm": "sha256", "unit": "record"})

# fmt: off
DAMAGE = [
    ("invalid-json", _text(b"{not json"), FE, J, "invalid JSON at line 1"),
    ("cut-json", _truncate_json, FE, J, "invalid JSON"),
    ("not-utf8", _text(b'{"a": "\xff\xfe"}'), FE, J, "not UTF-8"),
    ("json-list", _text(b"[1, 2]"), FE, J, "should be a JSON object, found list"),
    ("json-null", _text(b"null"), FE, J, "found NoneType"),
    ("wrong-format", _set("format", "npy"), FE, J, "format is 'npy'"),
    ("version-4", _set("format_version", 4), FE, J, "format_version 4 is not supported"),
    ("version-2", _set("format_version", 2), FE, J, f"format version 2 {PRE_RELEASE}"),
    ("version-1", _set("format_version", 1), FE, J, f"format version 1 {PRE_RELEASE}"),
    ("version-0", _set("format_version", 0), FE, J, "upgrade imgpack"),
    *[(f"missing-{k}", _drop(k), FE, J, f"{k} is missing, expected") for k in REQUIRED],
    ("count-str", _set("count", "2"), FE, J, "count is '2', expected an int >= 0"),
    ("count-bool", _set("count", True), FE, J, "count is True, expected an int >= 0"),
    ("count-float", _set("count", 2.0), FE, J, "count is 2.0, expected"),
    ("version-str", _set("format_version", "3"), FE, J, "format_version is '3', expected an int"),
    ("shape-str", _set("shape", "2x3x3"), FE, J, "shape is '2x3x3', expected a list"),
    ("sections-list", _set("sections", []), FE, J, "sections is [], expected an object"),
    ("classes-ints", _set("classes", [1, 2]), FE, J, "classes is [1, 2], expected a list of"),
    ("count-negative", _set("count", -2), FE, J, "count is -2, expected an int >= 0"),
    ("offset-negative", _set("data_offset", -4096), FE, J, "data_offset is -4096, expected"),
    ("shape-2d", _set("shape", [2, 3]), FE, J, "shape is [2, 3], expected [height,"),
    ("shape-rgba", _set("shape", [2, 3, 4]), FE, J, "expected 1 or 3 channels"),
    ("shape-zero", _set("shape", [0, 3, 3]), FE, J, "each > 0"),
    ("shape-bool", _set("shape", [2, True, 3]), FE, J, "shape is [2, True, 3]"),
    ("dtype", _set("dtype", "float32"), FE, J, "dtype is 'float32', expected 'uint8'"),
    ("layout", _set("layout", "CHW"), FE, J, "layout is 'CHW', expected 'HWC'"),
    ("count-vs-sections", _set("count", 3), FE, J, "nbytes is 8, expected 12, what 3 records"),
    ("section-missing", no_labels, FE, J, "missing section 'labels'"),
    ("section-offset", _section("labels", "offset", "4160"), FE, J, "offset is '4160', expected"),
    ("section-nbytes", _section("paths", "nbytes", -1), FE, J, "'paths' nbytes is -1"),
    ("section-dtype", _section("labels", "dtype", "<i8"), FE, J, "dtype is '<i8'"),
    ("section-dtype-int", _section("labels", "dtype", 5), FE, J, "dtype is 5, expected '<i4'"),
    ("section-partial", _section("labels", "nbytes", 7), FE, J, "nbytes is 7, expected 8, what 2"),
    ("section-size", _section("labels", "nbytes", 12), FE, J, "expected 8, what 2 records need"),
    ("misaligned", _section("labels", "offset", 4136), FE, J, "4136, expected an int >= 0, a mul"),
    ("overlap", _section("checksums", "offset", 4160), FE, J, "'checksums' overlaps section 'lab"),
    ("in-header", _section("labels", "offset", 64), FE, J, "'labels' overlaps the header"),
    ("data-offset", _set("data_offset", 4160), FE, J, "data_offset is 4160, expected 4096"),
    ("past-end", _section("paths", "offset", 8192), FE, J, "is 4640, expected 8210, where"),
    ("file-bytes", _set("data_file_bytes", 5000), FE, J, "is 5000, expected 4640, where"),
    ("out-of-bounds", _json(_paths_past_the_end), FE, B, "index says 8210 (truncated?)"),
    ("truncated", _truncate(4200), FE, B, "file has 4200 bytes, index says 4640 (truncated?)"),
    ("truncated-empty", _truncate(0), FE, B, "file has 0 bytes, index says 4640 (truncated?)"),
    ("grown", _truncate(4641), FE, B, "file has 4641 bytes, index says 4640"),
    ("magic", _bin_at(0, b"\x89IMGPACX"), FE, B, "not an imgpack data file"),
    ("hdr-version", _bin_at(8, _u32(2)), FE, B, "header format_version is 2, index says 3"),
    ("hdr-offset", _bin_at(12, _u32(8192)), FE, B, "header data_offset is 8192, index says 4096"),
    ("hdr-count", _bin_at(16, _u32(3)), FE, B, "header count is 3, index says 2"),
    ("hdr-bytes", _bin_at(24, _u32(19)), FE, B, "header pixels_nbytes is 19, index says 24"),
    ("hdr-height", _bin_at(32, _u32(3)), FE, B, "header height is 3, index says 2"),
    ("hdr-width", _bin_at(36, _u32(2)), FE, B, "header width is 2, index says 3"),
    ("hdr-channels", _bin_at(40, _u32(4)), FE, B, "header channels is 4, index says 3"),
    ("label-high", _bin_at(4164, _u32(2)), FE, J, "record 1 has label 2, expected 0..1"),
    ("label-minus", _bin_at(4160, _u32(-1)), FE, J, "record 0 has label -1, expected 0..1"),
    ("no-classes", _set("classes", []), FE, J, "label 0, expected -1 (the pack has no"),
    ("dup-classes", _set("classes", ["cat", "cat"]), FE, J, "'cat'], expected no name twice"),
    ("checksum", sha256, FE, J, "'sha256', 'unit': 'record'}, expected crc32 per record"),
    ("stats-mean", no_mean, FE, J, "stats.mean is missing, expected 3 finite numbers"),
    ("stats-sum", float_sum, FE, J, "stats.sum is [1.5, 2, 3], expected 3 ints"),
    ("stats-pixels", wrong_pixels, FE, J, "stats.pixels is 11, expected 8, the records' w x h"),
    ("path-offsets", _bin_at(4304, _u32(17)), FE, J, "path offsets run 0..17, the paths section"),
    # escapes a fuzzer found (once OverflowError, UnicodeEncodeError, OSError, RecursionError)
    ("huge-mean", _json(lambda r: r["stats"]["mean"].__setitem__(0, 10**400)), FE, J,
     "stats.mean is [1000"),
    ("sum-too-big", _json(lambda r: r["stats"]["sum"].__setitem__(1, 10**400)), FE, J,
     "stats.sum is [534, 1000"),
    ("sum-sq-too-big", _json(lambda r: r["stats"]["sum_sq"].__setitem__(2, 10**9)), FE, J,
     "the sums of 8 uint8 values per channel, with sum_sq [120276, 113624, 1000000000]"),
    ("sum-negative", _json(lambda r: r["stats"]["sum"].__setitem__(0, -1)), FE, J,
     "stats.sum is [-1, 526, 518], expected the sums"),
    # sum**2 > pixels * sum_sq: no 8 values have these (Cauchy-Schwarz)
    ("sum-sq-too-small", _json(lambda r: r["stats"]["sum_sq"].__setitem__(0, 534**2 // 8)), FE,
     J, "stats.sum is [534, 526, 518], expected the sums of 8 uint8 values per channel, with "
     "sum_sq [35644, "),
    ("surrogate-name", _set("data_file", "\ud800.bin"), FE, J,
     "expected a file name in the index's own folder"),
    ("deep-json", _text(b'{"format": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), FE, J,
     "nested too deep"),
]
# fmt: on


_WRITTEN: dict[tuple, list[tuple[str, bytes]]] = {}


def golden_copy(folder: Path, write=None, *args, **kw) -> Path:
    """The pack ``write(folder, *args, **kw)`` makes (default ``write_v3``), written by the
    real writer once per process and then copied: each damage case spoils a fresh copy."""
    write = write or write_v3
    key = (write, args, tuple(sorted(kw.items())))
    if key not in _WRITTEN:
        out = write(folder, *args, **kw)
        _WRITTEN[key] = [(p.name, p.read_bytes()) for p in pack_paths(out)]
        return out
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in _WRITTEN[key]:
        (folder / name).write_bytes(data)
    return folder / "pack.bin"


def assert_refused(folder, mutate, kind, file, fragment):
    """Damage the pack in ``folder``: read_index raises ``kind``, one line naming ``file``."""
    mutate(folder)
    with pytest.raises(kind) as err:
        read_index(folder / "pack.bin")
    message = str(err.value)
    assert fragment in message
    assert message.startswith(file) and "\n" not in message


@pytest.mark.parametrize(
    ("mutate", "kind", "file", "fragment"), [c[1:] for c in DAMAGE], ids=[c[0] for c in DAMAGE]
)
def test_read_index_refuses_damage(tmp_path, mutate, kind, file, fragment):
    """The golden raw pack, damaged every way we know."""
    golden_copy(tmp_path)
    assert_refused(tmp_path, mutate, kind, file, fragment)


def _fld(name, key, value):
    return _json(lambda raw: raw["fields"][name].__setitem__(key, value))


def _add_field(name, entry):
    return _json(lambda raw: raw["fields"].__setitem__(name, entry))


TARGETS_SIZE = 4688  # write_v3(..., targets=True): the targets field ends the file


def _grow_file_for(extra: int):
    """An unknown field of ``extra`` bytes appended after the last one, the file grown to fit."""

    def mutate(folder: Path) -> None:
        path = folder / "pack.json"
        raw = json.loads(path.read_text(encoding="utf-8"))
        raw["fields"]["future"] = _field_entry(TARGETS_SIZE + 48, extra, "<u2", [extra // 4])
        raw["data_file_bytes"] = TARGETS_SIZE + 48 + extra
        path.write_text(json.dumps(raw), encoding="utf-8")
        with open(folder / "pack.bin", "r+b") as f:
            f.truncate(TARGETS_SIZE + 48 + extra)

    return mutate


unknown_required = {**_field_entry(4736, 0, "<f4", [1]), "required": True}
other_packs = "(the .bin and the .json are from different packs)"
# fmt: off
DAMAGE_FIELDS = [
    ("id-int", _set("pack_id", 7), FE, J, "pack_id is 7, expected a string"),
    ("id-short", _set("pack_id", "abc"), FE, J, "pack_id is 'abc', expected 32 lowercase hex"),
    ("id-upper", _set("pack_id", "AB" * 16), FE, J, "expected 32 lowercase hex digits"),
    ("id-other", _set("pack_id", "0" * 32), FE, B, f"index says {'0' * 32} {other_packs}"),
    ("hdr-id", _bin_at(44, b"\xff"), FE, B, "header pack_id is ff"),
    ("fields-list", _set("fields", []), FE, J, "fields is [], expected an object"),
    ("field-str", _add_field("x", "y"), FE, J, "record field 'x' is 'y', expected an object"),
    ("field-name", _add_field("Bad-Name", {}), FE, J, "record field 'Bad-Name': a name is"),
    ("required-kind", _fld("targets", "required", 1), FE, J, "required is 1, expected true or"),
    ("unknown-required", _add_field("depth", unknown_required), FE, J,
     "record field 'depth' required is True, expected false (this imgpack does not know the "
     "field: upgrade imgpack)"),
    ("offset", _fld("source_box", "offset", -64), FE, J, "'source_box' offset is -64, expected"),
    ("nbytes", _fld("source_box", "nbytes", "32"), FE, J, "'source_box' nbytes is '32'"),
    ("dtype", _fld("targets", "dtype", "float32"), FE, J, "dtype is 'float32', expected one of"),
    ("dtype-std", _fld("source_size", "dtype", "<u8"), FE, J,
     "'source_size' dtype is '<u8', expected '<u4'"),
    ("shape-std", _fld("source_box", "shape", [2, 2]), FE, J, "'source_box' shape is [2, 2], exp"),
    ("shape-bad", _fld("targets", "shape", [0]), FE, J, "shape is [0], expected a list of 1 to 4"),
    ("shape-deep", _fld("targets", "shape", [1] * 5), FE, J, "shape is [1, 1, 1, 1, 1], expected"),
    ("shape-bool", _fld("targets", "shape", [True]), FE, J, "'targets' shape is [True]"),
    ("field-bytes", _fld("targets", "nbytes", 8), FE, J,
     "'targets' nbytes is 8, expected 16, what 2 records need"),
    ("targets-k", _fld("targets", "shape", [4]), FE, J, "nbytes is 16, expected 32, what 2"),
    ("misaligned", _fld("source_box", "offset", 4552), FE, J, "'source_box' offset is 4552, expec"),
    ("overlap", _fld("content_box", "offset", 4544), FE, J,
     "section 'content_box' overlaps section 'source_box'"),
    ("over-paths", _fld("source_size", "offset", 4352), FE, J, "'paths' overlaps section 'sou"),
    ("in-header", _fld("targets", "offset", 0), FE, J, "'targets' overlaps the header"),
    ("past-end", _fld("targets", "offset", 4736), FE, J, "expected 4752, where the last"),
    ("truncated", _truncate(4684), FE, B, "file has 4684 bytes, index says 4688 (truncated?)"),
    ("channels-1", _set("shape", [2, 3, 1]), FE, B, "header channels is 3, index says 1"),
    ("hdr-channels", _bin_at(40, _u32(1)), FE, B, "header channels is 1, index says 3"),
    ("stats-c", _json(lambda r: r["stats"].__setitem__("sum", [1])), FE, J,
     "stats.sum is [1], expected 3 ints"),
]
# fmt: on


@pytest.mark.parametrize(
    ("mutate", "kind", "file", "fragment"),
    [c[1:] for c in DAMAGE_FIELDS],
    ids=[c[0] for c in DAMAGE_FIELDS],
)
def test_read_index_refuses_damaged_fields_and_ids(tmp_path, mutate, kind, file, fragment):
    golden_copy(tmp_path, write_v3, targets=True)
    assert_refused(tmp_path, mutate, kind, file, fragment)


def test_unknown_optional_fields_are_ignored_but_still_bounded(tmp_path):
    write_v3(tmp_path, targets=True)
    _grow_file_for(16)(tmp_path)
    index = read_index(tmp_path / "pack.bin")
    assert index.fields["future"].shape == (4,)  # kept, readable, and never in the way
    assert index.read_field("future").shape == (2, 4)
    assert index.target_vectors().tolist() == [TARGET_A, TARGET_B]
    _add_field("future", _field_entry(4672, 16, "<u2", [4]))(tmp_path)  # over the targets
    with pytest.raises(FormatError, match="'future' overlaps section 'targets'"):
        read_index(tmp_path / "pack.bin")


def test_packs_without_geometry_or_targets_fall_back_to_whole_records(tmp_path):
    """The geometry fields are optional: without them each record is its whole source, at
    its own size."""
    write_v3(tmp_path, targets=True)
    for name in (*GEOMETRY_FIELDS, "targets"):
        _json(lambda raw, name=name: raw["fields"].pop(name))(tmp_path)
    _set("data_file_bytes", 4432)(tmp_path)
    _truncate(4432)(tmp_path)  # the file ends at its last field, the record sizes
    index = read_index(tmp_path / "pack.bin")
    assert list(index.fields) == ["record_size"] and index.target_vectors() is None
    sizes, sboxes, cboxes = index.geometry()
    assert sizes.tolist() == [[3, 2], [2, 1]]
    assert sboxes.tolist() == cboxes.tolist() == [[0, 0, 3, 2], [0, 0, 2, 1]]
    assert sizes.dtype == np.int64 and cboxes.dtype == np.float32 and not sboxes.flags.writeable


def test_one_channel_pack_round_trips(tmp_path):
    with PackWriter(tmp_path / "pack.bin", height=2, width=3, classes=["a"], channels=1) as w:
        w.append(PIXELS_A[..., :1], 0, "a/0.png")
        w.append(PIXELS_B[..., :1], 0, "a/1.png")
        w.finish(packer={})
    index = read_index(tmp_path / "pack.bin")
    assert index.shape == (2, 3, 1) and index.record_bytes == 6 and len(index.mean) == 1
    data = (tmp_path / "pack.bin").read_bytes()
    assert data[40:44] == _u32(1)
    pixels = index.section_array("pixels", data).reshape(2, 2, 3, 1)
    np.testing.assert_array_equal(pixels, np.stack([PIXELS_A, PIXELS_B])[..., :1])
    assert index.raw["stats"]["sum"] == [int(PIXELS_A[..., 0].sum()) + int(PIXELS_B[..., 0].sum())]


ESCAPES = ["../x.bin", "/abs/x.bin", "sub/x.bin", "", ".", "..", "a\\x.bin", "x\x00.bin"]


@pytest.mark.parametrize("bad", ESCAPES)
def test_data_file_must_be_a_plain_name_beside_the_index(tmp_path, bad):
    folder = tmp_path / "sub"
    write_v3(folder)
    (tmp_path / "x.bin").write_bytes((folder / "pack.bin").read_bytes())  # a real target outside
    (folder / "sub").mkdir()
    (folder / "sub" / "x.bin").write_bytes((folder / "pack.bin").read_bytes())
    _set("data_file", bad)(folder)
    with pytest.raises(FormatError, match=r"^pack.json: data_file is .*, expected a file name"):
        read_index(folder / "pack.json")


def test_an_unreadable_index_or_data_file_is_a_format_error(tmp_path):
    write_v3(tmp_path / "a")
    (tmp_path / "a" / "pack.bin").unlink()
    (tmp_path / "a" / "pack.bin").mkdir()  # a folder where the data file should be
    with pytest.raises(FormatError, match=r"^pack\.json: cannot read data file pack\.bin \("):
        read_index(tmp_path / "a" / "pack.json")
    _set("data_file", "x" * 300 + ".bin")(tmp_path / "a")  # too long for any filesystem
    with pytest.raises(FormatError, match=r"^pack\.json: cannot read data file x+\.bin \("):
        read_index(tmp_path / "a" / "pack.json")
    (tmp_path / "b" / "pack.json").mkdir(parents=True)
    with pytest.raises(FormatError, match=r"^pack\.json: cannot read the index"):
        read_index(tmp_path / "b" / "pack.json")


def test_missing_files_are_named(tmp_path):
    write_v3(tmp_path)
    (tmp_path / "pack.bin").unlink()
    with pytest.raises(FormatError, match="pack.json: data file pack.bin not found beside"):
        read_index(tmp_path / "pack.json")
    with pytest.raises(FormatError, match="other.json: index not found"):
        read_index(tmp_path / "other.bin")


# --- a million records open without a million Python objects -------------------


def _sparse_million(folder: Path, count: int = 1_000_000) -> Path:
    """1x1 records, all zero: the .bin is a sparse file but for the record sizes."""
    sections = layout_sections(count, 3 * count, 0)
    names = ("record_size", *GEOMETRY_FIELDS)
    specs = [(n, RECORD_FIELDS[n].dtype, RECORD_FIELDS[n].shape) for n in names]
    fields = layout_fields(sections, count, specs)
    fields["record_size"] = dataclasses.replace(fields["record_size"], required=True)
    stats = stats_from_sums(count, [0, 0, 0], [0, 0, 0])
    one_by_one = {"count": count, "height": 1, "width": 1, "channels": 3, "codec": "raw"}
    index = build_index(
        data_file="big.bin",
        **one_by_one,
        classes=["only"],
        sections=sections,
        stats=stats,
        skipped=[],
        packer={},
        fields=fields,
        pack_id="00" * 16,
    )
    with open(folder / "big.bin", "wb") as f:
        f.write(encode_header(**one_by_one, pack_id=bytes(16), pixels_nbytes=3 * count))
        f.seek(fields["record_size"].offset)
        f.write(np.ones((count, 2), "<u4").tobytes())
        f.truncate(file_bytes(sections, fields))
    write_json_atomic(folder / "big.json", index)
    return folder / "big.bin"


def _longest_container(obj, seen=None) -> int:
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, dict):
        return max([len(obj), *(_longest_container(v, seen) for v in obj.values())])
    if isinstance(obj, (list, tuple, set)):
        return max([len(obj), *(_longest_container(v, seen) for v in obj)])
    if hasattr(obj, "__dataclass_fields__"):
        return _longest_container(vars(obj), seen)
    return 0


def test_million_record_index_holds_no_per_record_objects(tmp_path):
    path = _sparse_million(tmp_path)
    tracemalloc.start()
    try:
        index = read_index(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert index.count == 1_000_000 and index.uniform
    assert _longest_container(index) < 100
    # the labels (4 MB) and the record sizes (8 MB) are all that scale with N (a list of
    # 1M ints is 8 MB+); the offsets wait until a reader asks for them
    assert peak < 14_000_000


def test_a_renamed_bin_is_not_silently_swapped_for_the_one_the_index_names(tmp_path, make_pack):
    path, _, _ = make_pack(count=2, name="orig")
    path.rename(tmp_path / "renamed.bin")
    (tmp_path / "orig.json").rename(tmp_path / "renamed.json")
    make_pack(count=2, name="orig")  # another pack now sits under the old name
    match = "renamed.json: index names data file 'orig.bin'"
    with pytest.raises(FormatError, match=match):
        read_index(tmp_path / "renamed.bin")


@pytest.mark.parametrize(
    ("geometry", "target"),
    [
        (((0, 4), (0, 0, 1, 1), (0, 0, 3, 2)), None),  # a source of no pixels
        (((-1, 4), (0, 0, 1, 1), (0, 0, 3, 2)), None),
        (((2.5, 4), (0, 0, 1, 1), (0, 0, 3, 2)), None),
        (((4, 4), (0, 0, 1), (0, 0, 3, 2)), None),
        (((4, 4), (0, 0, 1, 1), ("a", 0, 3, 2)), None),
        ((4, 4), None),
        (None, [1.0, 2.0, 3.0]),  # the writer holds 2 per record
        (None, None),
        (None, ["x", 1.0]),
    ],
)
def test_writer_refuses_bad_geometry_and_targets_before_writing(tmp_path, geometry, target):
    with PackWriter(tmp_path / "p.bin", height=2, width=3, classes=["a"], target_dim=2) as w:
        w.append(PIXELS_A, 0, "a/0.png", target=[0.0, 1.0])
        with pytest.raises(ValueError, match=r"^a/1\.png: "):
            w.append(PIXELS_B, 0, "a/1.png", geometry=geometry, target=target)
        assert w.count == 1  # nothing of the refused record: the finished pack reads back
        w.finish(packer={})
    assert read_index(tmp_path / "p.bin").count == 1


# --- version 3: record sizes, the codec, the pixels' end --------------------------------


def _both_pixels_nbytes(n):
    """The index and the header agree on the pixels' size, and the record sizes do not."""

    def mutate(folder: Path) -> None:
        _bin_at(24, _u32(n))(folder)
        _section("pixels", "nbytes", n)(folder)

    return mutate


no_record_size = _json(lambda r: r["fields"].pop("record_size"))
stats_12 = _json(lambda r: r["stats"].__setitem__("pixels", 12))
# fmt: off
DAMAGE_V3 = [
    ("v3-beyond-width", "raw", _bin_at(4416, _u32(4)), FE, J,
     "record 0 is 4x2 (record_size, width x height), outside the bound 1..3 x 1..2"),
    ("v3-beyond-height", "yuv420", _bin_at(4428, _u32(3)), FE, J, "record 1 is 2x3 (record_size"),
    ("v3-empty-record", "raw", _bin_at(4420, _u32(0)), FE, J, "record 0 is 3x0 (record_size"),
    ("v3-huge-record", "raw", _bin_at(4416, _u32(2**32 - 1)), FE, J, "record 0 is 4294967295x2"),
    ("v3-end", "raw", _bin_at(4424, _u32(1)), FE, J,
     "the 2 records (raw, sizes from record_size) end at 21 bytes, the pixels section has 24"),
    ("v3-end-yuv", "yuv420", _bin_at(4424, _u32(1)), FE, J, "end at 13 bytes, the pixels section"),
    ("v3-pixels-nbytes", "raw", _both_pixels_nbytes(21), FE, J,
     "end at 24 bytes, the pixels section has 21"),
    ("v3-hdr-nbytes", "raw", _bin_at(24, _u32(25)), FE, B,
     "header pixels_nbytes is 25, index says 24"),
    ("v3-json-nbytes", "yuv420", _section("pixels", "nbytes", 15), FE, B,
     "header pixels_nbytes is 14, index says 15"),
    ("v3-codec", "raw", _set("codec", "webp"), FE, J,
     "codec is 'webp', expected one of raw, yuv420, jpeg (packed by a newer imgpack? upgrade"),
    ("v3-raw-as-jpeg", "raw", _set("codec", "jpeg"), FE, J,
     "jpeg is missing, expected an object (codec jpeg)"),
    ("v3-codec-int", "raw", _set("codec", 1), FE, J, "codec is 1, expected a string"),
    ("v3-no-codec", "yuv420", _drop("codec"), FE, J, "codec is missing, expected a string"),
    ("v3-hdr-codec", "raw", _bin_at(60, _u32(7)), FE, B, "header codec is 7, index says raw"),
    ("v3-hdr-codec-yuv", "yuv420", _bin_at(60, _u32(0)), FE, B, "header codec is raw, index says"),
    ("v3-yuv-1-channel", "yuv420", _set("shape", [2, 3, 1]), FE, J,
     "shape is [2, 3, 1], expected 3 channels (codec yuv420)"),
    ("v3-no-record-size", "raw", no_record_size, FE, J,
     "record field 'record_size' is missing from this raw pack"),
    ("v3-record-size-optional", "raw", _fld("record_size", "required", False), FE, J,
     "record field 'record_size' required is False, expected true: codec raw needs it"),
    ("v3-record-size-dtype", "raw", _fld("record_size", "dtype", "<u2"), FE, J,
     "'record_size' dtype is '<u2', expected '<u4'"),
    ("v3-record-size-bytes", "raw", _fld("record_size", "nbytes", 8), FE, J,
     "'record_size' nbytes is 8, expected 16, what 2 records need"),
    ("v3-stats-pixels", "raw", stats_12, FE, J,
     "stats.pixels is 12, expected 8, the records' w x h"),
    ("v3-truncated", "yuv420", _truncate(4630), FE, B, "file has 4630 bytes, index says 4640"),
    ("v3-hdr-version", "raw", _bin_at(8, _u32(2)), FE, B,
     "header format_version is 2, index says 3"),
]
# fmt: on


@pytest.mark.parametrize(
    ("codec", "mutate", "kind", "file", "fragment"),
    [c[1:] for c in DAMAGE_V3],
    ids=[c[0] for c in DAMAGE_V3],
)
def test_read_index_refuses_damaged_v3_records(tmp_path, codec, mutate, kind, file, fragment):
    golden_copy(tmp_path, write_v3, codec)
    assert_refused(tmp_path, mutate, kind, file, fragment)


def _jpeg_key(key, value):
    return _json(lambda r: r["jpeg"].__setitem__(key, value))


# fmt: off
DAMAGE_JPEG = [
    ("jpeg-no-length", _json(lambda r: r["fields"].pop("record_length")), FE, J,
     "record field 'record_length' is missing from this jpeg pack (jpeg packs need it)"),
    ("jpeg-length-optional", _fld("record_length", "required", False), FE, J,
     "record field 'record_length' required is False, expected true: codec jpeg needs it"),
    ("jpeg-length-dtype", _fld("record_length", "dtype", "<u8"), FE, J,
     "'record_length' dtype is '<u8', expected '<u4'"),
    ("jpeg-lengths-short", _bin_at(5760, _u32(639)), FE, J,
     "the 2 records (jpeg, lengths from record_length) end at 1281 bytes, "
     "the pixels section has 1282"),
    ("jpeg-lengths-long", _bin_at(5764, _u32(2**32 - 1)), FE, J, "the pixels section has 1282"),
    ("jpeg-length-1", _bin_at(5760, _u32(1)), FE, J,
     "record 0 has record_length 1, a JPEG stream has at least 2 bytes (SOI)"),
    ("jpeg-no-object", _drop("jpeg"), FE, J, "jpeg is missing, expected an object (codec jpeg)"),
    ("jpeg-object-int", _set("jpeg", 90), FE, J, "jpeg is 90, expected an object (codec jpeg)"),
    ("jpeg-no-quality", _json(lambda r: r["jpeg"].pop("quality")), FE, J,
     "jpeg.quality is missing, expected an int 1..100"),
    ("jpeg-quality-0", _jpeg_key("quality", 0), FE, J, "jpeg.quality is 0, expected an int 1..100"),
    ("jpeg-quality-101", _jpeg_key("quality", 101), FE, J, "jpeg.quality is 101"),
    ("jpeg-quality-str", _jpeg_key("quality", "90"), FE, J, "jpeg.quality is '90'"),
    ("jpeg-quality-bool", _jpeg_key("quality", True), FE, J, "jpeg.quality is True"),
    ("jpeg-quality-float", _jpeg_key("quality", 90.0), FE, J, "jpeg.quality is 90.0"),
    ("jpeg-subsampling", _jpeg_key("subsampling", 420), FE, J,
     "jpeg.subsampling is 420, expected a string"),
    ("jpeg-as-is-over", _jpeg_key("stored_as_is", 3), FE, J,
     "jpeg.stored_as_is is 3, expected an int 0..2"),
    ("jpeg-as-is-neg", _jpeg_key("stored_as_is", -1), FE, J, "jpeg.stored_as_is is -1"),
    ("jpeg-hdr-codec", _bin_at(60, _u32(0)), FE, B, "header codec is raw, index says jpeg"),
    ("jpeg-hdr-codec-3", _bin_at(60, _u32(3)), FE, B, "header codec is 3, index says jpeg"),
    ("jpeg-as-raw", _set("codec", "raw"), FE, J,
     "record field 'record_length' is in this raw pack, expected in jpeg packs only"),
    ("jpeg-as-yuv", _set("codec", "yuv420"), FE, J,
     "is in this yuv420 pack, expected in jpeg packs only"),
    ("jpeg-stats-pixels", stats_12, FE, J, "stats.pixels is 12, expected 8, the records' w x h"),
    ("jpeg-beyond-bound", _bin_at(5696, _u32(4)), FE, J, "record 0 is 4x2 (record_size"),
    ("jpeg-truncated", _truncate(5980), FE, B, "file has 5980 bytes, index says 5984"),
]
# fmt: on


@pytest.mark.parametrize(
    ("mutate", "kind", "file", "fragment"),
    [c[1:] for c in DAMAGE_JPEG],
    ids=[c[0] for c in DAMAGE_JPEG],
)
def test_read_index_refuses_damaged_jpeg_packs(tmp_path, mutate, kind, file, fragment):
    golden_copy(tmp_path, write_jpeg)
    assert_refused(tmp_path, mutate, kind, file, fragment)


def test_a_raw_pack_may_not_carry_record_lengths(tmp_path):
    write_v3(tmp_path, "raw")
    entry = {**_field_entry(8192, 8, "<u4", [1]), "required": True}
    _add_field("record_length", entry)(tmp_path)
    with pytest.raises(FE, match="^pack.json: record field 'record_length' is in this "):
        read_index(tmp_path / "pack.bin")


@pytest.mark.parametrize("codec", ["raw", "yuv420"])
def test_writer_refuses_records_beyond_the_bound_or_of_the_wrong_kind(tmp_path, codec):
    from imgpack.errors import InvalidArgumentError

    with PackWriter(tmp_path / "p.bin", height=2, width=3, classes=["a"], codec=codec) as w:
        for bad, match in [
            (
                np.zeros((3, 3, 3), np.uint8),
                r"record size \(3, 3\) is not \(width, height\) within",
            ),
            (np.zeros((2, 4, 3), np.uint8), r"record size \(4, 2\) .* within the bound 3x2"),
            (np.zeros((2, 3, 1), np.uint8), r"record shape .* expected \(h, w, 3\) uint8"),
            (np.zeros((2, 3, 3), np.float32), r"record shape .* expected \(h, w, 3\) uint8"),
            (bytes(5), r"record has 5 bytes, a 3x2 "),
        ]:
            with pytest.raises(InvalidArgumentError, match=r"^a/0\.png: " + match):
                w.append(bad, 0, "a/0.png")
        assert w.count == 0
        w.append(bytes(6 if codec == "raw" else 4), 0, "a/1.png", size=(2, 1))  # stored bytes
        w.finish(packer={})
    index = read_index(tmp_path / "p.bin")
    assert index.record_sizes.tolist() == [[2, 1]] and index.codec == codec
    with pytest.raises(InvalidArgumentError, match="codec yuv420 stores 3 channels"):
        PackWriter(tmp_path / "q.bin", height=2, width=3, classes=[], channels=1, codec="yuv420")
    with pytest.raises(
        InvalidArgumentError, match="codec must be one of raw, yuv420, jpeg, got 'png'"
    ):
        PackWriter(tmp_path / "q.bin", height=2, width=3, classes=[], codec="png")


def test_a_bin_that_lost_its_header_after_the_open_is_refused_as_damage(tmp_path):
    """Not a PackChangedError (another pack republished under the name): no pack at all."""
    write_v3(tmp_path)
    index = read_index(tmp_path / "pack.bin")
    _bin_at(0, b"\0" * 8)(tmp_path)
    with pytest.raises(FormatError, match=r"^pack\.bin: not an imgpack data file") as err:
        index.read_section("labels")
    assert not isinstance(err.value, PackChangedError)
