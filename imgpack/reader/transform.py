"""``DeviceTransform``: normalise and augment uint8 batches where they are, on the device.

uint8 crosses the bus (4x fewer bytes than float32) and the per-pixel float work
runs on the device, vectorised over the batch. Everything here also runs on
device "cpu", which is how it is tested without a GPU.

``DeviceTransform.train`` / ``.eval`` add the standard ImageNet geometry
(RandomResizedCrop + flip, Resize + CenterCrop) per sample: the boxes drawn here (in
source pixels, mapped into each record: below), the pixels from ``resample`` (Pillow's
antialiased bilinear as two batched matmuls). On a canvas of records smaller than itself
(a ``fit`` pack), each sample's taps stop at its own record's edge (``record_sizes``), so
no output pixel sees the padding.
``T(images, records)`` draws the crops (``T.draw``) then makes them. On a GPU that is
``T.apply``: the whole batch at once (``resample.resample_boxes``); on a CPU, each record
cropped as the loader's threads crop it (``resample.resample_record``: the same bytes)
then ``T.finish``. The loader draws first (``imgpack.reader.read``), so that a JPEG record
is decoded at the scale its crop needs, then makes the crops of the pixels it read.

Where each sample's crop lies. Boxes are drawn in the source image's own coordinates
(``ds.source_sizes``), inside the part of it the record shows (``ds.source_boxes``), so the
crop statistics are those of torchvision on the original file whatever the record's resize
mode; ``_to_record`` then maps them into the stored record through ``ds.content_boxes`` (a
stretched record so gives an undistorted crop). Everything is vectorised over the batch; the
random draws come from a ``torch.Generator`` (torch's default one unless given), so
``torch.manual_seed`` governs them.

A ``Draw`` is one batch's outcome, drawn before any pixel is read: what the loader needs
to decode each JPEG record at the smallest scale still covering its crop
(``imgpack.reader.read``) and what ``DeviceTransform.apply`` needs to resample the batch.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from imgpack.errors import InvalidArgumentError
from imgpack.reader.dataset import batch_indices
from imgpack.reader.device import described
from imgpack.reader.read import BufferPool
from imgpack.reader.resample import crop_each, opencv, resample_boxes
from imgpack.reader.run import check_threads

__all__ = ["DeviceTransform", "Draw", "draws_at_random", "random_resized_boxes", "center_boxes"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_BLOCK = 1 << 17  # pixels normalise looks up per OpenCV call: below 2**18, where its threads start
_KEPT = 3  # float batches kept for reuse on a CPU: the loop holds one while the next is made

# where each record came from, as a dataset gives it: (attribute, values per record)
_GEOMETRY = (("source_sizes", 2), ("source_boxes", 4), ("content_boxes", 4))
_ATTEMPTS = 10  # torchvision's RandomResizedCrop.get_params tries 10 times, then falls back


class DeviceTransform:
    """uint8 (B, C, H, W) -> float on the same device: geometry, flip, then normalise.

    ``mean``/``std`` are per channel on the 0..1 scale (the index's stats), one
    or three of them. Built directly, it takes a random ``crop=(h, w)`` window
    per sample and an optional ``flip`` (one gather over the batch, on uint8);
    ``last_params`` then holds the top, left and flip tensors of the last call.

    ``DeviceTransform.train(ds, ...)`` and ``.eval(ds, ...)`` instead resample
    each sample's box to ``size`` x ``size`` (``T.size`` may change between
    epochs); they are called as ``T(images, records)`` with the batch's record
    indices, and ``last_params`` holds ``boxes`` (float64 (B, 4), source
    pixels) and ``flip`` (bool (B,)) of the last call (under ``make_loader(...,
    device="cuda")``, which calls ``T`` a batch ahead, the next batch's).
    Arithmetic is float32 (float64 for a float64 ``dtype``), rounded to
    ``dtype`` once at the end.
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        dtype: torch.dtype = torch.float32,
        crop: tuple[int, int] | None = None,
        flip: bool = False,
        channels_last: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        mean, std = [float(m) for m in mean], [float(s) for s in std]
        if len(mean) not in (1, 3) or len(std) != len(mean) or min(std) <= 0:
            raise InvalidArgumentError(
                f"mean and std should be 1 or 3 numbers each (one per channel) with std > 0, "
                f"found {mean} and {std}"
            )
        if crop is not None:
            crop = tuple(crop)
            if len(crop) != 2 or not all(isinstance(c, int) and c > 0 for c in crop):
                raise InvalidArgumentError(f"crop should be (height, width) > 0, found {crop}")
        self.mean, self.std, self.dtype = tuple(mean), tuple(std), dtype  # checked
        self.crop, self.flip, self.channels_last = crop, bool(flip), channels_last
        self.generator = _generator(generator)
        # (scale, shift) per channel: (x/255 - mean)/std == x*scale + shift, folded in float64 once
        self._affine = ([1.0 / (255.0 * s) for s in std], [-m / s for m, s in zip(mean, std)])
        self.last_params: dict[str, torch.Tensor] | None = None
        # "train" or "eval" (crops from the dataset's geometry), None when built directly
        self.mode: str | None = None
        # the dataset whose geometry ``train``/``eval`` crops follow (None when built
        # directly): a loader of another dataset refuses this transform
        self.dataset: Any = None
        self._size = 0
        self._pool = BufferPool(_KEPT)  # the float batches (see ``_normalise``)

    @classmethod
    def from_dataset(cls, ds: Any, **kw: Any) -> DeviceTransform:
        """Normalise with the mean/std the packer computed for ``ds``."""
        return cls(ds.mean, ds.std, **kw)

    @classmethod
    def train(
        cls,
        ds: Any,
        size: int = 224,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: bool = True,
        dtype: torch.dtype = torch.float32,
        generator: torch.Generator | None = None,
        *,
        channels_last: bool = True,
    ) -> DeviceTransform:
        """RandomResizedCrop(size, scale, ratio) + flip, drawn in each source image's pixels.

        Boxes follow torchvision's ``RandomResizedCrop.get_params`` inside the part
        of the source each record shows; pixels are Pillow's antialiased bilinear
        resample of the box (``imgpack.reader.resample``: two batched matmuls on a GPU,
        each record's crop on a CPU). ``generator`` (default: torch's) makes the draws
        reproducible.
        """
        scale, ratio = _pair(scale, "scale"), _pair(ratio, "ratio")
        t = cls.from_dataset(
            ds, dtype=dtype, flip=flip, channels_last=channels_last, generator=generator
        )
        t.mode, t.dataset, t.scale, t.ratio, t.size = "train", ds, scale, ratio, size
        return t

    @classmethod
    def eval(
        cls,
        ds: Any,
        size: int = 224,
        crop_ratio: float = 0.875,
        dtype: torch.dtype = torch.float32,
        *,
        channels_last: bool = True,
    ) -> DeviceTransform:
        """Resize(int(size / crop_ratio)) + CenterCrop(size), in each source image's pixels.

        The box is exactly torchvision's (shorter side to int(size / crop_ratio),
        crop offset rounded), intersected with the part of the source the record shows.
        """
        try:
            ok = 0 < float(crop_ratio) <= 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise InvalidArgumentError(f"crop_ratio should be in (0, 1], found {crop_ratio!r}")
        t = cls.from_dataset(ds, dtype=dtype, channels_last=channels_last)
        t.mode, t.dataset, t.crop_ratio, t.size = "eval", ds, float(crop_ratio), size
        return t

    @property
    def size(self) -> int:
        """Output side of ``train``/``eval``; set it between passes to resize progressively.

        Mid-pass, the loader has already drawn the crops of the batches it reads ahead, at
        the old size (in-process: up to ``prefetch`` + 2 batches; workers mode:
        ``prefetch_factor`` x ``num_workers``), so the new size starts some batches later,
        each batch at one size."""
        return self._size

    @size.setter
    def size(self, value: int) -> None:
        try:
            side = operator.index(value)  # int, numpy or torch integers; not 2.0
        except TypeError:
            side = 0
        if isinstance(value, bool) or side <= 0:
            raise InvalidArgumentError(f"size should be a positive int, found {value!r}")
        self._size = side

    @property
    def dtype(self) -> torch.dtype:
        """The batches' floating dtype; like ``size``, it may change between passes."""
        return self._dtype

    @dtype.setter
    def dtype(self, value: torch.dtype) -> None:
        if value not in _FLOATS:
            raise InvalidArgumentError(f"dtype should be a floating dtype, found {value}")
        self._dtype = value

    def __repr__(self) -> str:
        stats = f"mean={self.mean}, std={self.std}, dtype={self.dtype}"
        if self.mode is not None:
            return f"DeviceTransform.{self.mode}(size={self.size}, {stats}, flip={self.flip})"
        window = f"crop={self.crop}, flip={self.flip}, channels_last={self.channels_last}"
        return f"DeviceTransform({stats}, {window})"

    def __call__(
        self, images: torch.Tensor, records: Any = None, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """The batch transformed; its random draws from ``generator`` (default: the
        transform's, else torch's). ``make_loader`` passes each batch's own (``plan``)."""
        c = len(self.mean)  # a uint8 (B, C, H, W) batch of this transform's channels
        batch = isinstance(images, torch.Tensor) and images.dim() == 4
        if not batch or images.dtype != torch.uint8 or images.shape[1] != c:
            found = described(images)
            raise InvalidArgumentError(f"expected a uint8 (B, {c}, H, W) tensor, found {found}")
        if self.mode is None:
            self.last_params = None  # (the crop's window and flip, where it draws them)
            if self._random():
                images = self._crop_flip(images, _generator(generator))
            return self._normalise(images.permute(0, 2, 3, 1))
        if records is None:
            raise InvalidArgumentError(
                f"DeviceTransform.{self.mode} is called as T(images, records): pass their records"
            )
        draw = self.draw(records, images.shape[2:], _generator(generator))
        if len(draw.boxes) != len(images):  # (a box per record)
            raise InvalidArgumentError(f"{len(images)} images but {len(draw.boxes)} record indices")
        return self._crop(images, draw) if images.device.type == "cpu" else self.apply(images, draw)

    def draw(
        self, records: Any, hw: tuple[int, int], generator: torch.Generator | None = None
    ) -> Draw:
        """``train``/``eval``: the crops of the batch of ``records`` (an H x W canvas of them:
        ``hw``), drawn before any pixel is read, from ``generator`` (default: the
        transform's, else torch's). ``T(images, records)`` draws, then makes the crops
        (``apply`` on a GPU); the loader draws first to decode each JPEG record at the scale
        its crop needs."""
        if isinstance(records, torch.Tensor):
            records = records.detach().cpu().numpy()
        n = len(self.dataset) if hasattr(self.dataset, "__len__") else None
        try:  # the dataset's own rule, as an argument's error
            idx = batch_indices(records, n)
        except (TypeError, IndexError) as e:
            raise InvalidArgumentError(f"records: {e}") from None
        source, seen, content, own = _geometry(self.dataset, idx, tuple(hw))
        b, size = len(idx), self.size  # read once: a loader thread draws while the loop
        # may set T.size
        if self.mode == "train":
            gen = generator if generator is not None else self.generator
            boxes = random_resized_boxes(seen, self.scale, self.ratio, gen)
            where = gen.device if gen is not None else torch.device("cpu")
            flip = (torch.rand(b, generator=gen, device=where).cpu() < 0.5) & self.flip
        else:
            boxes = center_boxes(source, seen, size, self.crop_ratio)
            flip = torch.zeros(b, dtype=torch.bool)
        crop = _to_record(boxes, seen, content).numpy()
        return Draw(idx.astype(np.int64), boxes.numpy(), flip.numpy(), crop, own.numpy(), size)

    def apply(self, images: torch.Tensor, draw: Draw) -> torch.Tensor:
        """Resample each sample's ``draw.crop`` of ``images`` to ``draw.size`` (its taps
        stopping at ``draw.sizes``), flip, normalise, the whole batch at once where it is
        (the device path, on any device); ``last_params`` from the draw."""
        # each sample's taps stop at its own record's edge (a record smaller than the canvas)
        crop, flip, extent = (torch.from_numpy(a) for a in (draw.crop, draw.flip, draw.sizes))
        pixels = resample_boxes(images, crop, draw.size, flip, _work(self.dtype), extent)
        return self.finish(pixels, draw)

    def _crop(self, images: torch.Tensor, draw: Draw) -> torch.Tensor:
        """``T(images, records)`` on a CPU (and a resident pack's batch there): each record's
        crop made as the loader's threads make it (``resample.crop_each``), byte for byte,
        then ``finish``."""
        crops = images.new_empty((len(images), draw.size, draw.size, images.shape[1]))
        pixels, sizes = images.permute(0, 2, 3, 1).numpy(), draw.sizes.tolist()
        crop_each(lambda i: pixels[i, : sizes[i][1], : sizes[i][0]], draw.crop, draw.flip,
                  crops.numpy(), check_threads(None))  # fmt: skip
        return self.finish(crops.permute(0, 3, 1, 2), draw)

    def finish(self, crops: torch.Tensor, draw: Draw) -> torch.Tensor:
        """What ``apply`` returns, for crops the loader's CPU threads already resampled and
        flipped as the draw says (``dataset.Packs.crops``): uint8 (B, C, S, S), channels
        last in memory. Only the normalise is left; ``last_params`` from the draw."""
        boxes, flip = (torch.from_numpy(a).to(crops.device) for a in (draw.boxes, draw.flip))
        self.last_params = {"boxes": boxes, "flip": flip}
        return self._normalise(crops.permute(0, 2, 3, 1))

    def _normalise(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 (or float) (B, H, W, C) pixels of any strides -> ``dtype`` (B, C, H, W),
        channels_last unless ``channels_last`` is False: (x/255 - mean)/std as x * scale[c] +
        shift[c], the one normalise (of every batch, on every device). On a CPU into float
        batches reused once nothing holds them any more (``read.BufferPool``): a fresh 150 MB
        batch pays a page fault per 4 KB, which costs more than the normalise itself.

        ``torch.mul(images, scale (1, C, 1, 1), out=channels_last)`` would broadcast the
        per-channel constants along the innermost dimension of channels_last memory (C, of size
        1 or 3), where a CPU does not vectorise. Here the batch is read as B*H rows of W*C
        values and the constants as one row of W*C (each channel's repeated W times): the same
        products and sums, in the same order and precision, in passes that vectorise; on a CPU,
        uint8 pixels look their results up (256 per channel, made by those products and sums).
        Computed in float32 (float64 for a float64 ``dtype``) and rounded to ``dtype`` once at
        the end.
        """
        (b, h, w, c), dtype, dev = pixels.shape, self.dtype, pixels.device
        work = _work(dtype)
        if (self._pool.dtype, self._pool.device) != (work, dev):  # both may change between passes
            self._pool = BufferPool(_KEPT, dtype=work, device=dev)  # (a GPU's: fresh batches)
        out = self._pool.take(b, (h, w, c))[0]
        # one per channel (C of them: the images were checked to have as many)
        scales, shifts = (torch.tensor(v, dtype=work, device=dev) for v in self._affine)
        if out.is_cpu and pixels.dtype == torch.uint8:
            cv2 = opencv()  # loaded on the first CPU batch
            # a uint8 value has 256 results per channel: made once by the device's product and
            # sum (the same bits), then looked up by OpenCV in one pass, in this thread, in
            # blocks of rows too small for OpenCV's own threads (like torch's intra-op ones,
            # they would spin on cores the loader's threads are busy on)
            table = (torch.arange(256, dtype=work)[:, None] * scales + shifts).numpy()[None]
            src = pixels.reshape(b * h, w, c).numpy()
            rows, step = out.view(b * h, w, c).numpy(), max(_BLOCK // max(w, 1), 1)
            for first in range(0, b * h, step):
                cv2.LUT(src[first : first + step], table, dst=rows[first : first + step])
        else:  # a GPU, or float pixels: the batch at once, rounded after the product and the sum
            rows = out.view(b * h, w * c)
            rows.copy_(pixels.reshape(b * h, w * c))
            rows.mul_(scales.repeat(w))
            rows.add_(shifts.repeat(w))
        result = out.permute(0, 3, 1, 2)
        result = result if work == dtype else result.to(dtype)
        return result if self.channels_last else result.contiguous()

    def _random(self) -> bool:
        """Whether it draws at random: ``train``, or built with ``crop=`` or ``flip=``."""
        return self.mode == "train" or self.mode is None and (self.crop is not None or self.flip)

    def _draw(self, high: int, n: int, device: torch.device, gen: Any) -> torch.Tensor:
        gen = gen if gen is not None else self.generator
        where = gen.device if gen is not None else device
        return torch.randint(0, high, (n,), generator=gen, device=where).to(device)

    def _crop_flip(self, x: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        """One advanced-indexing gather does every sample's crop window and mirror."""
        b, _, h, w = x.shape
        ch, cw = self.crop if self.crop is not None else (h, w)
        if ch > h or cw > w:
            raise InvalidArgumentError(f"crop {ch}x{cw} is larger than the {h}x{w} images")
        dev = x.device
        top, left = self._draw(h - ch + 1, b, dev, gen), self._draw(w - cw + 1, b, dev, gen)
        flip = (self._draw(2, b, dev, gen) if self.flip else torch.zeros_like(top)).bool()
        self.last_params = {"top": top, "left": left, "flip": flip}
        rows = top[:, None] + torch.arange(ch, device=dev)
        step = torch.arange(cw, device=dev)
        cols = left[:, None] + torch.where(flip[:, None], cw - 1 - step, step)
        batch = torch.arange(b, device=dev)[:, None, None]
        # advanced indices split by a slice go first: the result is (B, ch, cw, C)
        return x[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


def draws_at_random(transform: Any) -> bool:
    """Whether ``transform`` is a ``DeviceTransform`` that draws at random: ``train``, or one
    built with ``crop=`` or ``flip=`` (the loader then gives each batch its own generator)."""
    return isinstance(transform, DeviceTransform) and transform._random()


def _generator(value: Any) -> torch.Generator | None:
    """``value``, a torch.Generator or None, or InvalidArgumentError."""
    if value is not None and not isinstance(value, torch.Generator):
        raise InvalidArgumentError(
            f"generator should be a torch.Generator, found {described(value)}"
        )
    return value


def _work(dtype: torch.dtype) -> torch.dtype:
    """The arithmetic's dtype: float64 for a float64 output, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class Draw(NamedTuple):
    """One batch's crops, in numpy (it crosses to and from worker processes inline).

    ``records``: int64 (B,). ``boxes``: float64 (B, 4) (left, top, right, bottom) in source
    pixels (``last_params``). ``flip``: bool (B,). ``crop``: float64 (B, 4), the same boxes
    in the pixels of the images the draw applies to. ``sizes``: int64 (B, 2), (w, h) of
    each sample's pixels at the top-left of its slot in those images. ``size``: the side
    of the output.
    """

    records: np.ndarray
    boxes: np.ndarray
    flip: np.ndarray
    crop: np.ndarray
    sizes: np.ndarray
    size: int


def _pair(value: Any, what: str) -> tuple[float, float]:
    """``value`` as a finite (min, max) pair of floats with 0 < min <= max, or
    InvalidArgumentError naming ``what``."""
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what} should be a (min, max) pair, found {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        raise InvalidArgumentError(
            f"{what} should be a finite (min, max) with 0 < min <= max, found {value!r}"
        )
    return lo, hi


def _column(ds: Any, name: str, idx: np.ndarray, width: int) -> np.ndarray:
    """Rows ``idx`` of ``ds``'s (N, ``width``) array ``name``, as float64."""
    arr = np.asarray(getattr(ds, name))
    if arr.ndim != 2 or arr.shape[1] != width:
        raise InvalidArgumentError(f"ds.{name} should be an (N, {width}) array, found {arr.shape}")
    return arr[idx].astype(np.float64)


def _geometry(ds: Any, idx: np.ndarray, record_hw: tuple[int, int]) -> tuple:
    """(float64 (B, 2) source (w, h), (B, 4) source and (B, 4) content boxes, and int64
    (B, 2) (w, h) of each record itself, on the CPU) of records ``idx`` (checked indices).
    Objects without source geometry read as a record that is its whole source: the source
    is the record itself, both boxes the whole record (a pack without geometry fields gives
    the same rows itself). Each record's own size comes from ``record_sizes`` where ``ds``
    has it; anything else's records are ``record_hw``.

    Any dataset may give its geometry: ``record_sizes`` with ``shape``, each record's own size
    within the bound; ``source_sizes``, ``source_boxes``, ``content_boxes``, where it came
    from (a pack has them all)."""
    if all(hasattr(ds, name) for name in ("shape", "record_sizes")):
        if tuple(ds.shape[:2]) != record_hw:  # the records' own sizes are in their pixels
            raise InvalidArgumentError(
                f"this DeviceTransform was built for {ds.shape[1]}x{ds.shape[0]} records, found "
                f"{record_hw[1]}x{record_hw[0]} images: pass the dataset's records, uncropped"
            )
        own = _column(ds, "record_sizes", idx, 2).astype(np.int64)
    else:
        own = np.tile(np.array(record_hw[::-1], dtype=np.int64), (len(idx), 1))
    if all(hasattr(ds, name) for name, _ in _GEOMETRY):
        sizes, sbox, cbox = (_column(ds, name, idx, width) for name, width in _GEOMETRY)
    else:
        sizes = own.astype(np.float64)
        sbox = cbox = np.concatenate([np.zeros_like(sizes), sizes], 1)  # (read, never written)
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in (sizes, sbox, cbox, own))


def _uniform(
    shape: tuple[int, ...], lo: float, hi: float, gen: torch.Generator | None
) -> torch.Tensor:
    where = gen.device if gen is not None else torch.device("cpu")
    u = torch.rand(shape, generator=gen, device=where, dtype=torch.float64).cpu()
    return u.mul_(hi - lo).add_(lo)


def random_resized_boxes(
    visible: torch.Tensor,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """torchvision's RandomResizedCrop boxes, per row of ``visible`` (B, 4) (l, t, r, b).

    Area fraction uniform in ``scale`` and aspect log-uniform in ``ratio``,
    sides rounded to whole pixels, the first of 10 attempts that fits is kept
    and placed at a uniformly drawn whole-pixel offset; when none fits, the
    centre crop of the region clamped to ``ratio``. Returns float64 (B, 4).
    """
    b = visible.shape[0]
    left, top = visible[:, 0], visible[:, 1]
    vw, vh = visible[:, 2] - left, visible[:, 3] - top
    target = (vw * vh)[:, None] * _uniform((b, _ATTEMPTS), scale[0], scale[1], generator)
    aspect = _uniform((b, _ATTEMPTS), math.log(ratio[0]), math.log(ratio[1]), generator).exp_()
    w = torch.sqrt(target * aspect).round_()  # torch.round and Python's round both go half-even
    h = torch.sqrt(target / aspect).round_()
    fits = (w > 0) & (w <= vw[:, None]) & (h > 0) & (h <= vh[:, None])
    first = fits.to(torch.int8).argmax(1, keepdim=True)  # first True (0 when none)
    found = fits.any(1)
    w, h = w.gather(1, first)[:, 0], h.gather(1, first)[:, 0]
    # offsets: randint(0, side - crop + 1), drawn for every row, used where an attempt fit
    u = _uniform((b, 2), 0.0, 1.0, generator)
    dy = torch.floor(u[:, 0] * (torch.floor(vh - h) + 1))
    dx = torch.floor(u[:, 1] * (torch.floor(vw - w) + 1))
    # fallback: whole region, clamped to the ratio range, centred; a fractional region
    # (a center-crop record's part of its source) must not round past its own side
    lo, hi = min(ratio), max(ratio)
    in_ratio = vw / vh
    fw = torch.where(in_ratio > hi, torch.minimum(torch.round(vh * hi), vw), vw)
    fh = torch.where(in_ratio < lo, torch.minimum(torch.round(vw / lo), vh), vh)
    w, h = torch.where(found, w, fw), torch.where(found, h, fh)
    dy = torch.where(found, dy, torch.floor((vh - h) / 2))
    dx = torch.where(found, dx, torch.floor((vw - w) / 2))
    return torch.stack([left + dx, top + dy, left + dx + w, top + dy + h], 1)


def center_boxes(
    source_sizes: torch.Tensor, visible: torch.Tensor, size: int, crop_ratio: float
) -> torch.Tensor:
    """Resize(int(size / crop_ratio)) then CenterCrop(size), as torchvision does it on the source.

    The shorter side goes to R = int(size / crop_ratio), the longer to
    int(R * long / short); the crop starts at round((resized - size) / 2).
    Returned in source pixels (float64 (B, 4)); where the record shows less than
    that box (a center-crop pack of another aspect or crop ratio), the largest
    box of the same aspect centred in its intersection with ``visible``, so the
    crop is zoomed rather than distorted.
    """
    sw, sh = source_sizes[:, 0], source_sizes[:, 1]
    r = float(int(size / crop_ratio))
    short, long = torch.minimum(sw, sh), torch.maximum(sw, sh)
    long_r = torch.floor(r * long / short)
    rw = torch.where(sw <= sh, torch.full_like(sw, r), long_r)
    rh = torch.where(sw <= sh, long_r, torch.full_like(sh, r))
    # torchvision: int(round((resized - size) / 2.0)), half to even like torch.round
    left, top = torch.round((rw - size) / 2.0), torch.round((rh - size) / 2.0)
    fx, fy = sw / rw, sh / rh
    boxes = torch.stack([left * fx, top * fy, (left + size) * fx, (top + size) * fy], 1)
    # intersected with the visible region (a crop outside it has no pixels): (lo, hi) corners
    lo = torch.maximum(boxes[:, :2], visible[:, :2])
    hi = torch.maximum(torch.minimum(boxes[:, 2:], visible[:, 2:]), lo)
    # then the largest box of the crop's aspect (fx / fy) centred in that
    w, h = (hi - lo).unbind(1)
    nw, nh = torch.minimum(w, h * (fx / fy)), torch.minimum(h, w / (fx / fy))
    margin = torch.stack([w - nw, h - nh], 1) / 2
    # a side that needs no shrinking (to within float noise) keeps its exact coordinates
    margin = torch.where(margin > 1e-9 * (hi - lo), margin, 0.0)
    return torch.cat([lo + margin, hi - margin], 1)


def _to_record(boxes: torch.Tensor, s: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Source-pixel boxes -> record-pixel boxes, through each record's source box ``s`` and
    content box ``c``: x_r = c.l + (x_s - s.l) * c.w / s.w, same in y."""
    scale = ((c[:, 2:] - c[:, :2]) / (s[:, 2:] - s[:, :2])).repeat(1, 2)  # (sx, sy, sx, sy)
    return c[:, :2].repeat(1, 2) + (boxes - s[:, :2].repeat(1, 2)) * scale
