"""FFCV's JPEG pipeline on a CPU, emulated as it runs, for the scripts that compare with it.

FFCV is rarely installable beside a current torch, so its steps are written out here from
its source: the writer stores each image as a JPEG of quality 90 (``RGBImageField(
write_mode="jpg")``); the loader decodes each record whole with libjpeg-turbo's fast DCT
(``imdecode`` asks for ``TJFLAG_FASTDCT``) into its thread's buffer, rounds the crop box to
whole pixels and resizes it with ``cv2.resize(INTER_AREA)`` into one uint8 batch reused for
every batch; ``RandomHorizontalFlip``, ``ToTensor``/``ToTorchImage`` and ``NormalizeImage``
then give the float batch a training step takes. The threads split the batch as FFCV's
compiled loop does (simplejpeg and OpenCV release the GIL).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import simplejpeg

__all__ = ["jpeg_streams", "random_boxes", "centre_boxes", "resize", "RESIZE", "FfcvLike"]

RESIZE = "OpenCV INTER_AREA, as FFCV"


def resize(image: np.ndarray, w: int, h: int, dst: np.ndarray | None = None) -> np.ndarray:
    return cv2.resize(image, (w, h), dst=dst, interpolation=cv2.INTER_AREA)


def jpeg_streams(ds) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Every record of ``ds`` as FFCV's writer would store it (one JPEG of quality 90), and
    each one's (width, height)."""
    streams, sizes = [], []
    for i in range(len(ds)):
        image = ds[i][0].permute(1, 2, 0).contiguous().numpy()
        streams.append(simplejpeg.encode_jpeg(image, quality=90, colorspace="RGB"))
        sizes.append((image.shape[1], image.shape[0]))
    return streams, sizes


def random_boxes(sizes, rng: np.random.Generator, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """RandomResizedCrop's boxes (x, y, w, h) in whole pixels, as torchvision and FFCV draw
    them: ten tries at a random area and aspect, then the centre at the clamped aspect."""
    boxes = []
    for w, h in sizes:
        for _ in range(10):
            area = w * h * rng.uniform(*scale)
            aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
            cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if 0 < cw <= w and 0 < ch <= h:
                x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
                break
        else:
            cw, ch = min(w, round(h * ratio[1])), min(h, round(w / ratio[0]))
            x, y = (w - cw) // 2, (h - ch) // 2
        boxes.append((x, y, cw, ch))
    return boxes


def centre_boxes(sizes, size: int, ratio: float = 224 / 256):
    """FFCV's CenterCropRGBImageDecoder: the centre square of side ``ratio`` x the shorter."""
    out = []
    for w, h in sizes:
        side = round(min(w, h) * ratio)
        out.append(((w - side) // 2, (h - side) // 2, side, side))
    return out


class FfcvLike:
    """Batches of ``size`` x ``size`` crops from JPEG streams, as FFCV's CPU pipeline makes
    them: uint8, or float normalised by ``mean``/``std`` (0..1 scale) when ``floats``."""

    def __init__(self, streams, sizes, size: int, threads: int, mean, std, floats: bool):
        self.streams, self.sizes, self.size = streams, sizes, size
        self.pool = ThreadPoolExecutor(threads)
        self.threads, self.floats = threads, floats
        self.local = threading.local()
        import torch  # here, so that bench_pack, which only resizes, starts without it

        self.torch = torch
        self.mean = torch.tensor(mean).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(std).view(1, 3, 1, 1) * 255
        self.batch = self.out = None

    def _decode(self, i: int) -> np.ndarray:
        w, h = self.sizes[i]
        buf = getattr(self.local, "buf", None)
        if buf is None or buf.size < h * w * 3:
            buf = self.local.buf = np.empty(h * w * 3 * 2, dtype=np.uint8)
        dst = buf[: h * w * 3].reshape(h, w, 3)
        return simplejpeg.decode_jpeg(self.streams[i], fastdct=True, fastupsample=True, buffer=dst)

    def __call__(self, idx, boxes, flips):
        n, s = len(idx), self.size
        if self.batch is None or len(self.batch) < n:
            self.batch = np.empty((n, s, s, 3), dtype=np.uint8)

        def one(k: int) -> None:
            x, y, w, h = boxes[k]
            crop = self._decode(idx[k])[y : y + h, x : x + w]
            resize(np.ascontiguousarray(crop), s, s, dst=self.batch[k])
            if flips[k]:
                self.batch[k] = self.batch[k, :, ::-1]

        list(self.pool.map(one, range(n)))
        torch = self.torch
        images = torch.from_numpy(self.batch[:n]).permute(0, 3, 1, 2)
        if not self.floats:
            return images
        if self.out is None or len(self.out) < n:
            self.out = torch.empty((n, 3, s, s), memory_format=torch.channels_last)
        out = self.out[:n]
        out.copy_(images).sub_(self.mean).div_(self.std)
        return out
