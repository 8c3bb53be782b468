"""make_loader with DeviceTransform.train/.eval on a jpeg pack: crops drawn first, each record
decoded at 1/2 where its crop is still four times the output size there (jpeg.GAP),
into a canvas just large enough; reproducible, the same in both modes, and as good as the
full decode."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import photo_like, photo_sources
from PIL import Image

from imgpack.format.index import read_index
from imgpack.packer.writer import PackWriter
from imgpack.reader import jpeg
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.options import DistributedOptions
from imgpack.reader.read import Batch, Scaled
from imgpack.reader.transform import DeviceTransform

SIZES = [(96, 80), (80, 96), (96, 72), (64, 96), (96, 96), (90, 61), (33, 96), (96, 50)]


def write_jpeg_pack(out: Path, records: list[np.ndarray], bound: tuple[int, int]) -> Path:
    """A fit-style jpeg pack: each record is its whole source (record pixels = source)."""
    h, w = bound
    with PackWriter(out, height=h, width=w, classes=["a", "b"], codec="jpeg") as wr:
        for k, rec in enumerate(records):
            wr.append(rec, k % 2, f"{'ab'[k % 2]}/{k}.png")
        wr.finish(packer={"size": [w, h], "resize": "fit", "filter": "bilinear"})
    return out


@pytest.fixture
def pack(tmp_path):
    records = [photo_like(w, h, seed=k) for k, (w, h) in enumerate(SIZES)]
    return write_jpeg_pack(tmp_path / "j.bin", records, (96, 96))


def stored(out: Path) -> list[bytes]:
    index = read_index(out)
    raw = np.fromfile(index.data_path, dtype=np.uint8)[index.data_offset :]
    cuts = index.record_offsets
    return [raw[a:b].tobytes() for a, b in zip(cuts[:-1], cuts[1:])]


class Spy(DeviceTransform):
    """A DeviceTransform that keeps what each apply() (a canvas) or finish() (the crops the
    CPU made) was given."""

    def apply(self, images, draw):
        self.seen = [*getattr(self, "seen", []), (images.clone(), draw)]
        return super().apply(images, draw)

    def finish(self, crops, draw):
        if crops.dtype == torch.uint8:  # not apply's own float crops, handed on to finish
            self.seen = [*getattr(self, "seen", []), (crops.clone(), draw)]
        return super().finish(crops, draw)


def spy(ds, mode="train", size=24, **kw):
    base = getattr(DeviceTransform, mode)(ds, size=size, **kw)
    t = Spy.__new__(Spy)
    t.__dict__.update(base.__dict__)
    return t


def record_scales(ds, draw) -> np.ndarray:
    """The scale each record of a draw was decoded at, from its decoded size."""
    sizes = ds.record_sizes[draw.records]
    return np.array(
        [
            next(d for d in jpeg.SCALES if tuple(-(-s // d)) == tuple(got))
            for s, got in zip(sizes, draw.sizes)
        ]
    )


def test_each_record_is_decoded_at_the_scale_its_crop_needs(pack, canvas_on_cpu):
    ds = PackedImageDataset(pack)
    data = stored(pack)
    t = spy(ds, size=8, generator=torch.Generator().manual_seed(0))
    out = [x for epoch in range(6) for x, _ in make_loader(ds, 4, seed=epoch, transform=t)]
    assert len(t.seen) == len(out) == 12
    used = []
    for (images, draw), x in zip(t.seen, out):
        d = record_scales(ds, draw)
        used += d.tolist()
        crop = draw.crop * d[:, None]  # back in record pixels
        cw, ch = crop[:, 2] - crop[:, 0], crop[:, 3] - crop[:, 1]
        gap = jpeg.GAP * 8  # the crop at least GAP times the output at its scale
        covers = (cw / d >= gap - 1e-9) & (ch / d >= gap - 1e-9)
        assert (covers | (d == 1)).all()  # (a smaller crop: the full decode)
        finer = (d < 2) & (cw / (2 * d) >= gap) & (ch / (2 * d) >= gap)
        assert not finer.any()  # and no larger scale would have
        # the canvas: as large as the largest decoded record, each one at its top-left
        assert tuple(images.shape[2:]) == (draw.sizes[:, 1].max(), draw.sizes[:, 0].max())
        for row, (i, di) in enumerate(zip(draw.records, d)):
            w, h = ds.record_sizes[i]
            sw, sh = draw.sizes[row]
            want = jpeg.decode(data[i], int(w), int(h), 3, scale=int(di))
            assert torch.equal(images[row, :, :sh, :sw], torch.from_numpy(want).permute(2, 0, 1))
        assert x.shape == (len(draw.records), 3, 8, 8)
        # the padding is left unzeroed (decode_into(pad=False)): the transform never reads it
        garbage = images.clone()
        for row, (sw, sh) in enumerate(draw.sizes):
            garbage[row, :, sh:], garbage[row, :, :, sw:] = 255, 255
        assert torch.equal(DeviceTransform.apply(t, garbage, draw), x)
    assert set(used) == {1, 2}  # never 1/4 or 1/8 (jpeg.PICK_SCALES)


def test_the_scaled_plan_picks_from_the_record_pixel_crop():
    class Ds:
        shape, mean, std = (1024, 1024, 3), (0.5,) * 3, (0.25,) * 3
        record_sizes = np.array([[1024, 1024], [1024, 768], [5, 5]])

        def __len__(self):
            return 3

    t = DeviceTransform.eval(Ds(), size=224)
    p = Scaled(t)(Batch(np.array([0, 1, 2]), (1024, 1024)))
    # eval: the box is 224/256 of the shorter side: 896 px, 672 px, 4.4 px: none is 4 x 224
    # at 1/2, so all are decoded whole; to 84 (an 84/96 box, as large) the first two are
    assert p.scales.tolist() == [1, 1, 1]
    t = DeviceTransform.eval(Ds(), size=84)
    p = Scaled(t)(Batch(np.array([0, 1, 2]), (1024, 1024)))
    assert p.scales.tolist() == [2, 2, 1]
    assert p.draw.sizes.tolist() == [[512, 512], [512, 384], [5, 5]]
    np.testing.assert_allclose(p.draw.crop[0], np.array([64, 64, 960, 960]) / 2)
    assert p.hw == (512, 512)


def test_workers_and_in_process_give_the_same_batches(pack):
    ds = PackedImageDataset(pack)
    runs = []
    for kw in ({}, {"num_workers": 2}):
        t = DeviceTransform.train(ds, size=24, generator=torch.Generator().manual_seed(3))
        loader = make_loader(ds, 3, seed=5, transform=t, device="cpu", **kw)
        runs.append([b for _ in range(2) for b in loader])
    assert len(runs[0]) == len(runs[1]) == 6
    for (x, y), (x2, y2) in zip(*runs):
        assert torch.equal(x, x2) and torch.equal(y, y2)


def test_torch_manual_seed_reproduces_the_crops_whatever_the_loop_draws(pack):
    ds = PackedImageDataset(pack)
    outs = []
    for noise in (False, True):
        torch.manual_seed(11)
        t = DeviceTransform.train(ds, size=24)
        got = []
        for x, _ in make_loader(ds, 4, shuffle=False, transform=t):
            got.append(x)
            if noise:  # the training loop's own use of torch's generator
                torch.rand(1000)
        outs.append(torch.cat(got))
    assert torch.equal(*outs)
    t = DeviceTransform.train(ds, size=24)  # another seed: other crops
    assert not torch.equal(
        torch.cat([x for x, _ in make_loader(ds, 4, shuffle=False, transform=t)]), outs[0]
    )


def test_the_loaders_seed_fixes_the_crops_too_and_each_rank_draws_its_own(pack, make_pack):
    """``make_loader(seed=S)`` reproduces the crops whatever torch's generator holds (a
    transform's own generator would rule), another S draws others; ranks seeded alike draw
    different crops for their k-th batches."""
    ds = PackedImageDataset(pack)
    t = DeviceTransform.train(ds, size=24)

    def epoch(seed, **kw):
        return torch.cat([x for x, _ in make_loader(ds, 4, seed=seed, transform=t, **kw)])

    torch.manual_seed(1)
    first = epoch(5)
    torch.manual_seed(2)
    assert torch.equal(epoch(5), first) and not torch.equal(epoch(6), first)
    # records of one geometry (a stretch pack): the k-th boxes of two ranks differ only
    # where their draws do
    same_size = PackedImageDataset(make_pack(count=16, height=40, width=40)[0])
    boxes = []
    for rank in (0, 1):
        t = DeviceTransform.train(same_size, size=8)
        two = DistributedOptions(rank=rank, world_size=2)
        next(iter(make_loader(same_size, 4, seed=5, transform=t, distributed=two)))
        boxes.append(t.last_params["boxes"])
    assert not torch.equal(*boxes)


def test_eval_decodes_at_half_size_into_a_smaller_canvas(tmp_path, canvas_on_cpu):
    records = [photo_like(w, h, seed=k) for k, (w, h) in enumerate(SIZES[:6])]
    ds = PackedImageDataset(write_jpeg_pack(tmp_path / "big.bin", records, (96, 96)))
    t = spy(ds, "eval", size=6)  # a 6/6 box of a 61-96 px side: 4 x 6 at 1/2
    x = torch.cat([x for x, _ in make_loader(ds, 6, shuffle=False, transform=t)])
    (images, draw), = t.seen  # fmt: skip
    assert record_scales(ds, draw).tolist() == [2] * 6
    assert tuple(images.shape[2:]) == (48, 48)  # a quarter of the bound's pixels
    full, _ = ds.gather(np.arange(6))
    by_hand = DeviceTransform.eval(ds, size=6)(full, np.arange(6))
    levels = (x - by_hand).abs().max() * 255 * max(ds.std)
    assert levels < 6  # the half-scale decode is a close cousin of the full one


def test_a_plain_callable_gets_records_at_their_stored_size(pack):
    ds = PackedImageDataset(pack)
    seen = []

    def t(images, records):
        seen.append((images.clone(), records.clone()))
        return images

    for kw in ({}, {"num_workers": 2}):
        seen.clear()
        out = list(make_loader(ds, 3, seed=2, transform=t, device="cpu", **kw))
        for (images, records), (x, _) in zip(seen, out):
            assert torch.equal(images, ds.gather(records)[0]) and torch.equal(images, x)


def test_a_new_size_between_epochs_picks_new_scales(pack, canvas_on_cpu):
    ds = PackedImageDataset(pack)
    t = spy(ds, "eval", size=6)
    loader = make_loader(ds, 8, shuffle=False, transform=t)
    list(loader)
    t.size = 60  # the box is 60/68 of a side: 1/2 no longer leaves 4 x 60 px
    (x, _), = list(loader)  # fmt: skip
    assert record_scales(ds, t.seen[0][1]).tolist() == [2] * 6 + [1, 2]  # 33 px: 1
    assert x.shape[-1] == 60 and record_scales(ds, t.seen[-1][1]).tolist() == [1] * 8


@pytest.mark.parametrize("kw", [{}, {"num_workers": 2}], ids=["inprocess", "workers"])
def test_a_size_set_mid_pass_reaches_the_batches_not_yet_drawn(pack, kw, canvas_on_cpu):
    """Mid-pass the crops already drawn keep their size: each batch is whole at one size,
    its crop that size's, the old size first; the next pass is all the new size."""
    ds = PackedImageDataset(pack)
    t = spy(ds, "eval", size=9)
    loader = make_loader(ds, 1, shuffle=False, transform=t, **kw)
    sizes = []
    for k, (x, _) in enumerate(loader):
        sizes.append(x.shape[-1])
        if k == 0:
            t.size = 12
    assert sizes == sorted(sizes) and sizes[0] == 9 and set(sizes) <= {9, 12}
    for (_, draw), side in zip(t.seen, sizes):
        by_hand = DeviceTransform.eval(ds, size=side).draw(draw.records, ds.shape[:2])
        assert draw.size == side and np.array_equal(draw.boxes, by_hand.boxes)
    assert [x.shape[-1] for x, _ in loader] == [12] * len(ds)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return 10 * math.log10(255**2 / max(mse, 1e-12))


def photo_pack(tmp_path: Path, longer: int) -> tuple[PackedImageDataset, list[np.ndarray]]:
    """Colour photographs (photo-like images where none is installed) at ``longer`` px, q90.
    Grey sources are left out: on grey textures the full decode is near exact and 1/2 can
    miss 0.5 dB against BILINEAR at any gap (jpeg.GAP)."""
    photos = [Image.open(p) for p in photo_sources()]
    photos = [p.convert("RGB") for p in photos if p.mode not in ("L", "LA", "I", "I;16")][:8]
    if not photos:
        shapes = [(512, 384), (400, 512), (512, 512), (512, 341)]
        photos = [Image.fromarray(photo_like(w, h, seed=k)) for k, (w, h) in enumerate(shapes)]
    originals = []
    for p in photos:
        p = p.copy()
        p.thumbnail((longer, longer), Image.BICUBIC)
        originals.append(np.asarray(p))
    out = write_jpeg_pack(tmp_path / f"photos{longer}.bin", originals, (longer, longer))
    return PackedImageDataset(out), originals


def run(ds, originals, t, epochs):
    """(loader output, Pillow's resample of the full decode, of the original), each (N, S, S,
    3) on the 0..255 scale, and the scale of each record."""
    data, size = stored(Path(ds.path)), t.size
    got, exact, truth, scales = [], [], [], []
    mean, std = (torch.tensor(v, dtype=torch.float64).view(1, 3, 1, 1) for v in (ds.mean, ds.std))
    for epoch in range(epochs):
        for x, _ in make_loader(ds, len(ds), seed=epoch, transform=t):
            _, draw = t.seen[-1]
            scales += record_scales(ds, draw).tolist()
            got.append((x.double() * std + mean).permute(0, 2, 3, 1).numpy() * 255)
            for i, box, flip in zip(draw.records, draw.boxes, draw.flip):
                full = Image.open(io.BytesIO(data[i])).convert("RGB")
                for src, into in ((full, exact), (Image.fromarray(originals[i]), truth)):
                    r = np.asarray(src.resize((size, size), Image.BILINEAR, box=tuple(box)), float)
                    into.append(r[:, ::-1] if flip else r)
    return np.concatenate(got), np.stack(exact), np.stack(truth), np.array(scales)


def test_on_the_cpu_small_crops_are_the_full_decodes_resample(tmp_path):
    """On a CPU the crop is Pillow's, in uint8, with no precision left for the 1/2 decode's
    loss at outputs this small (well above 50 dB): every record is decoded whole there, and
    each crop is Pillow's resample of the full decode."""
    ds, originals = photo_pack(tmp_path, 384)
    t = spy(ds, size=16, generator=torch.Generator().manual_seed(4))
    got, exact, truth, scales = run(ds, originals, t, 2)
    assert (scales == 1).all() and len(scales) >= 8
    for k in range(len(scales)):
        assert psnr(got[k], truth[k]) >= psnr(exact[k], truth[k]) - 0.5, k
    assert np.abs(got - exact).max() <= 1.01  # Pillow on the filter's reach: a level at most


@pytest.mark.parametrize("path", ["cpu crops", "device canvas"])
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_against_the_original_the_loader_is_within_half_a_db_of_the_full_decode(
    tmp_path, mode, path, request
):
    """The issue's measure on its storage: q90 records of 512 px, crops to 224, Pillow's
    resample of the original as the truth; the loader loses at most 0.5 dB to Pillow's exact
    resample of the full decode. (Decoding eval crops at 1/2, as a crop merely covering the
    output would allow, loses far more: jpeg.GAP.)"""
    if path == "device canvas":
        request.getfixturevalue("canvas_on_cpu")
    size = 224
    ds, originals = photo_pack(tmp_path, 512)
    kw = {"generator": torch.Generator().manual_seed(4)} if mode == "train" else {}
    epochs = 3 if mode == "train" else 1  # eval crops are the same every epoch
    got, exact, truth, _ = run(ds, originals, spy(ds, mode, size=size, **kw), epochs)
    assert psnr(got, truth) >= psnr(exact, truth) - 0.5, (psnr(got, truth), psnr(exact, truth))


def test_each_record_decoded_at_a_half_is_within_half_a_db_of_the_full_decode(
    tmp_path, canvas_on_cpu
):
    """384 px records, train crops to 16: many records decode at 1/2 (a box of 96 px or
    more). Per scaled record, against Pillow's BILINEAR of the original, the loader's output
    loses at most 0.5 dB to Pillow's resample of the full decode (jpeg.GAP)."""
    ds, originals = photo_pack(tmp_path, 384)
    t = spy(ds, size=16, generator=torch.Generator().manual_seed(4))
    got, exact, truth, scales = run(ds, originals, t, 6)
    assert set(scales.tolist()) == {1, 2} and (scales > 1).sum() >= 8
    for k in np.flatnonzero(scales > 1):
        assert psnr(got[k], truth[k]) >= psnr(exact[k], truth[k]) - 0.5, k
    assert psnr(got, exact) > 40
