"""yuv420 in the reader: the torch back-conversion equals the format's numpy one, record by
record, and a yuv420 pack's batch is the contract's yuv canvas."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from packs_v3 import BOUND, SIZES, rgb_back, write_v3

from imgpack.errors import InvalidArgumentError
from imgpack.format.codec import rgb_to_yuv420, yuv420_planes, yuv420_to_rgb
from imgpack.reader.canvas import slot_shape
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.device import canvas_to_rgb


def canvas_of(bufs, sizes, bound):
    """The contract's yuv canvas, written out by hand from each record's planes."""
    h, w = bound
    hc, wc, _ = slot_shape("yuv420", (h, w, 3))
    out = np.zeros((len(bufs), 1, hc, wc), dtype=np.uint8)
    for k, (buf, (rw, rh)) in enumerate(zip(bufs, sizes)):
        y, cb, cr = yuv420_planes(buf, rw, rh)
        out[k, 0, :rh, :rw] = y
        out[k, 0, h : h + cb.shape[0], : cb.shape[1]] = cb
        out[k, 0, h : h + cr.shape[0], wc // 2 : wc // 2 + cr.shape[1]] = cr
    return torch.from_numpy(out)


def test_slot_shape():
    assert slot_shape("raw", (16, 20, 3)) == (16, 20, 3)
    assert slot_shape("yuv420", (16, 20, 3)) == (24, 20, 1)
    assert slot_shape("yuv420", (5, 7, 3)) == (8, 8, 1)  # odd: ceil(5/2) rows, 2 * ceil(7/2)


def test_torch_equals_the_formats_numpy_record_by_record():
    rng = np.random.default_rng(0)
    sizes = [(33, 17), (1, 1), (32, 18), (5, 2), (2, 5), (33, 18)]
    bufs = []
    for k, (w, h) in enumerate(sizes):
        rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        # even records: an encoded photo; odd ones: arbitrary bytes (every Y, Cb, Cr value)
        buf = rgb_to_yuv420(rgb)
        bufs.append(buf if k % 2 == 0 else rng.integers(0, 256, buf.size, dtype=np.uint8))
    out = canvas_to_rgb(canvas_of(bufs, sizes, (18, 33)), (18, 33), sizes=sizes)
    assert out.shape == (6, 3, 18, 33) and out.is_contiguous()  # planar: written plane by plane
    for k, (buf, (w, h)) in enumerate(zip(bufs, sizes)):
        got = out[k].permute(1, 2, 0).numpy()
        np.testing.assert_array_equal(got[:h, :w], yuv420_to_rgb(buf, w, h))
        assert not got[h:].any() and not got[:, w:].any()  # zero beyond each record


def test_exact_ties_round_as_the_format_does():
    # 1.772 * (253 - 128) = 221.5 and 1.772 * (3 - 128) = -221.5: exact ties in decimal
    # that floating point may place either side; every Y with those chroma values
    y = np.arange(256, dtype=np.uint8).reshape(16, 16)
    bufs, sizes = [], []
    for cb, cr in [(253, 128), (3, 128), (128, 253), (3, 3), (253, 253), (0, 255)]:
        chroma = np.full(64, cb, np.uint8), np.full(64, cr, np.uint8)
        bufs.append(np.concatenate([y.reshape(-1), *chroma]))
        sizes.append((16, 16))
    out = canvas_to_rgb(canvas_of(bufs, sizes, (16, 16)), (16, 16))
    for k, buf in enumerate(bufs):
        want = yuv420_to_rgb(buf, 16, 16)
        np.testing.assert_array_equal(out[k].permute(1, 2, 0).numpy(), want)


def test_without_sizes_the_padding_is_the_colour_of_zeros():
    buf = rgb_to_yuv420(np.full((2, 3, 3), 200, np.uint8))
    out = canvas_to_rgb(canvas_of([buf], [(3, 2)], (4, 4)), (4, 4))
    assert out[0, :, 3, 3].tolist() == [0, 135, 0]  # Y = Cb = Cr = 0
    assert out[0, :, 3, 1].tolist() == [0, 135, 0]
    masked = canvas_to_rgb(canvas_of([buf], [(3, 2)], (4, 4)), (4, 4), sizes=[(3, 2)])
    assert masked[0, :, 2:].sum() == 0 and masked[0, :, :, 3].sum() == 0
    assert (masked[0, :, :2, :3] == 200).all()


def test_bad_canvases_are_refused():
    with pytest.raises(InvalidArgumentError, match=r"uint8 \(B, 1, 24, 20\), found"):
        canvas_to_rgb(torch.zeros(2, 1, 24, 19, dtype=torch.uint8), (16, 20))
    with pytest.raises(InvalidArgumentError, match="found torch.float32"):
        canvas_to_rgb(torch.zeros(2, 1, 24, 20), (16, 20))
    with pytest.raises(InvalidArgumentError, match=r"sizes should be \(B, 2\)"):
        canvas_to_rgb(torch.zeros(2, 1, 24, 20, dtype=torch.uint8), (16, 20), sizes=[(3, 3)])


def test_a_yuv420_packs_batch_is_the_yuv_canvas(tmp_path):
    path, records, labels = write_v3(tmp_path / "yuv.bin", "yuv420")
    ds = PackedImageDataset(path)
    idx = [6, 0, 4, 3, 7, 1, 2, 5]
    images, got_labels = ds.gather(idx)
    assert images.shape == (8, 1, 24, 20) and images.dtype == torch.uint8
    bufs = [rgb_to_yuv420(records[i]) for i in idx]
    sizes = [SIZES[i] for i in idx]
    assert torch.equal(images, canvas_of(bufs, sizes, BOUND))
    assert got_labels.tolist() == labels[idx].tolist()
    # and back to RGB: each record as ds[i] gives it, zero beyond
    rgb = canvas_to_rgb(images, BOUND, sizes=ds.record_sizes[idx])
    for k, i in enumerate(idx):
        w, h = SIZES[i]
        assert torch.equal(rgb[k, :, :h, :w], ds[i][0])
        np.testing.assert_array_equal(
            ds[i][0].permute(1, 2, 0).numpy(), rgb_back(records[i], "yuv420")
        )
        assert rgb[k, :, h:].sum() == 0 and rgb[k, :, :, w:].sum() == 0


@pytest.mark.parametrize("seed", range(4))
def test_torch_equals_numpy_on_random_canvases(seed):
    """Arbitrary bytes in every plane (every Y, Cb, Cr), records of random sizes within an
    odd bound: each sample's RGB is the format's, byte for byte; without ``sizes``, the
    whole slot converts as one record of the bound."""
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(1, 40)), int(rng.integers(1, 40))
    sizes = [(int(rng.integers(1, w + 1)), int(rng.integers(1, h + 1))) for _ in range(5)]
    bufs = [
        rng.integers(0, 256, rw * rh + 2 * ((rw + 1) // 2) * ((rh + 1) // 2), dtype=np.uint8)
        for rw, rh in sizes
    ]
    canvas = canvas_of(bufs, sizes, (h, w))
    rgb = canvas_to_rgb(canvas, (h, w), sizes=sizes)
    whole = canvas_to_rgb(canvas, (h, w))
    for k, (buf, (rw, rh)) in enumerate(zip(bufs, sizes)):
        np.testing.assert_array_equal(
            rgb[k, :, :rh, :rw].permute(1, 2, 0).numpy(), yuv420_to_rgb(buf, rw, rh)
        )
        assert not rgb[k, :, rh:].any() and not rgb[k, :, :, rw:].any()
        slot = canvas[k, 0].numpy()
        np.testing.assert_array_equal(
            whole[k].permute(1, 2, 0).numpy(), yuv420_to_rgb(_as_record(slot, w, h), w, h)
        )


def _as_record(slot: np.ndarray, w: int, h: int) -> np.ndarray:
    """One canvas slot (Hc, Wc) read as a stored record of the whole bound w x h."""
    ch, cw = (h + 1) // 2, (w + 1) // 2
    half = slot.shape[1] // 2
    planes = [slot[:h, :w], slot[h : h + ch, :cw], slot[h : h + ch, half : half + cw]]
    return np.concatenate([p.reshape(-1) for p in planes])


def test_a_yuv420_loader_on_the_cpu_gives_plain_rgb_planes_a_user_can_keep(tmp_path):
    """What a CPU training loop gets from a fit yuv420 pack: uint8 (B, 3, H, W), channels
    last as every batch, each record as ds[i] gives it, zero beyond, batches kept in a list
    unchanged."""
    from imgpack import make_loader

    path, records, _ = write_v3(tmp_path / "yuv.bin", "yuv420")
    ds = PackedImageDataset(path)
    loader = make_loader(ds, 3, seed=2, device="cpu", transform=lambda x, r: (x, r))
    kept = [(images.clone(), images, records.clone()) for (images, records), _ in loader]
    assert sum(len(r) for _, _, r in kept) == len(ds)
    for copy, images, recs in kept:
        assert images.dtype == torch.uint8 and images.stride(1) == 1  # channels last
        assert torch.equal(copy, images)  # nothing wrote into a held batch
        for k, i in enumerate(recs.tolist()):
            w, h = SIZES[i]
            item = ds[i][0]
            assert item.is_contiguous() and item.shape == (3, h, w)
            assert torch.equal(images[k, :, :h, :w], item)
            assert images[k, :, h:].sum() == 0 and images[k, :, :, w:].sum() == 0
            np.testing.assert_array_equal(
                item.permute(1, 2, 0).numpy(), rgb_back(records[i], "yuv420")
            )


def test_a_plain_dataloader_with_workers_reads_yuv420_as_numpy_would(tmp_path, monkeypatch):
    """A stranger's loop over a yuv420 pack: torch's DataLoader, default collate, two worker
    processes: every sample equals what the format's conversion gives in this process."""
    from torch.utils.data import DataLoader

    sizes = [(21, 13)] * 6
    path, records, labels = write_v3(tmp_path / "yuv.bin", "yuv420", sizes=sizes, bound=(13, 21))
    ds = PackedImageDataset(path)
    got = list(DataLoader(ds, batch_size=4, num_workers=2))
    images = torch.cat([x for x, _ in got])
    assert images.shape == (6, 3, 13, 21) and images.dtype == torch.uint8
    for i in range(len(ds)):
        want = yuv420_to_rgb(rgb_to_yuv420(records[i]), 21, 13)
        np.testing.assert_array_equal(images[i].permute(1, 2, 0).numpy(), want)
        assert torch.equal(images[i], ds[i][0])
    assert torch.cat([y for _, y in got]).tolist() == labels.tolist()
