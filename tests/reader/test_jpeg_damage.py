"""A damaged jpeg record is one FormatError naming the pack file and the record, from every
path that reads it: ds[i], a batch, the in-process loader (inline and in its thread), worker
processes, the scaled decode, and a plain DataLoader; never a crash or a hang."""

from __future__ import annotations

import re

import numpy as np
import pytest
from packs_v3 import write_v3
from torch.utils.data import DataLoader

from imgpack.errors import FormatError
from imgpack.format.index import read_index
from imgpack.reader import jpeg
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.options import InProcessOptions
from imgpack.reader.transform import DeviceTransform

SIZES = [(20, 16), (13, 16), (20, 7), (16, 12), (20, 16), (9, 11), (20, 3), (18, 16)] * 3
BAD = 11  # the damaged record


def no_soi(rec: bytearray) -> None:
    rec[:2] = b"\x00\x00"


def other_size(rec: bytearray) -> None:
    sof = rec.index(b"\xff\xc0")  # baseline frame header: length, precision, height, width
    height = int.from_bytes(rec[sof + 5 : sof + 7], "big")
    rec[sof + 5 : sof + 7] = (height + 1).to_bytes(2, "big")


def no_end(rec: bytearray) -> None:
    rec[-40:] = bytes(40)  # the last entropy-coded bytes and the EOI marker


def same(images, records):
    """A plain transform: the records at their stored sizes, in the padded canvas."""
    return images


DAMAGE = {"no SOI": no_soi, "header of another size": other_size, "cut short": no_end}
MESSAGES = {
    "no SOI": "do not start with a JPEG SOI",
    "header of another size": "its header says {w}x{h1}, the index {w}x{h}",
    "cut short": "Premature end of JPEG file",
}


@pytest.fixture(params=sorted(DAMAGE))
def damaged(request, tmp_path):
    """(pack .bin, the message expected): a jpeg pack whose record BAD is damaged in place."""
    kind = request.param
    out, _, _ = write_v3(tmp_path / "j.bin", codec="jpeg", sizes=SIZES)
    index = read_index(out)
    a, b = (int(v) + index.data_offset for v in index.record_offsets[BAD : BAD + 2])
    with open(out, "r+b") as f:
        f.seek(a)
        rec = bytearray(f.read(b - a))
        DAMAGE[kind](rec)
        f.seek(a)
        f.write(rec)
    name = re.escape(f"{out} record {BAD}: damaged JPEG record (")
    w, h = SIZES[BAD]
    return out, f"{name}.*{re.escape(MESSAGES[kind].format(w=w, h=h, h1=h + 1))}"


def test_every_read_of_the_record_names_it(damaged):
    out, match = damaged
    ds = PackedImageDataset(out)
    assert ds[BAD - 1][0].shape[0] == 3  # its neighbours read as ever
    with pytest.raises(FormatError, match=match):
        ds[BAD]
    with pytest.raises(FormatError, match=match):
        ds.__getitems__([0, 5, BAD, 2])
    with pytest.raises(FormatError, match=match):
        ds.gather(np.arange(len(ds)))


def test_a_record_decoded_at_a_half_names_it_too(damaged, canvas_on_cpu):
    out, match = damaged
    ds = PackedImageDataset(out)
    eval_ = DeviceTransform.eval(ds, size=1)  # its box still 4 x the output at 1/2: decoded so
    loader = make_loader(ds, 4, shuffle=False, transform=eval_, device="cpu")
    with pytest.raises(FormatError, match=match):
        for _ in loader:
            pass


@pytest.mark.parametrize("threaded", [False, True], ids=["inline", "loader-thread"])
def test_the_in_process_loader_raises_it(damaged, threaded):
    out, match = damaged
    opts = InProcessOptions(prefetch=2 if threaded else 0)  # a background thread, or none
    ds = PackedImageDataset(out)
    for transform in (same, DeviceTransform.train(ds, size=4)):
        loader = make_loader(ds, 4, seed=0, transform=transform, options=opts)
        with pytest.raises(FormatError, match=match):
            for _ in loader:
                pass


def test_worker_processes_raise_it(damaged):
    out, match = damaged
    ds = PackedImageDataset(out)
    for transform in (same, DeviceTransform.eval(ds, size=4)):
        loader = make_loader(ds, 4, seed=0, transform=transform, num_workers=1)  # one will do
        with pytest.raises(FormatError, match=match):
            for _ in loader:
                pass
        loader.close()


@pytest.mark.filterwarnings("ignore:PackedImageDataset has a per-sample transform")
def test_the_per_sample_path_raises_it(damaged):
    out, match = damaged
    ds = PackedImageDataset(out, transform=lambda x: x.float().mean((1, 2)))
    loader = make_loader(ds, 4, seed=0, num_workers=1)
    with pytest.raises(FormatError, match=match):
        for _ in loader:
            pass
    loader.close()


def test_a_plain_dataloader_raises_it(damaged):
    """(Not with workers here: after a worker raised, torch's own shutdown of its workers
    waits 10 s, for any dataset; make_loader's workers are a DataLoader's, tested above.)"""
    out, match = damaged
    ds = PackedImageDataset(out)
    loader = DataLoader(ds, batch_size=1, collate_fn=lambda s: s)
    with pytest.raises(FormatError, match=match):
        for _ in loader:
            pass


def test_random_damage_is_a_format_error_or_a_decode(tmp_path):
    """Bytes flipped anywhere in a record: FormatError naming it, or pixels of its size."""
    out, _, _ = write_v3(tmp_path / "j.bin", codec="jpeg", sizes=SIZES)
    ix = read_index(out)
    a, b = (ix.data_offset + int(o) for o in ix.record_offsets[BAD : BAD + 2])
    good = out.read_bytes()[a:b]
    rng = np.random.default_rng(20)
    w, h = SIZES[BAD]
    outcomes = {"decoded": 0, "refused": 0}
    for _ in range(300):
        rec = bytearray(good)
        for k in rng.integers(0, len(rec), size=rng.integers(1, 8)):
            rec[k] = rng.integers(0, 256)
        try:
            image = jpeg.decode(bytes(rec), w, h, 3, scale=int(rng.choice(jpeg.SCALES)))
        except FormatError as e:
            assert str(e).startswith("JPEG record: damaged JPEG record (")
            outcomes["refused"] += 1
        else:
            assert image.dtype == np.uint8 and image.shape[2] == 3
            outcomes["decoded"] += 1
    assert min(outcomes.values()) > 0, outcomes
