"""0.1-era and DataLoader knobs passed to make_loader: refused, naming a call that works."""

from __future__ import annotations

import dataclasses
import re
import warnings

import pytest
import torch

from imgpack.errors import InvalidArgumentError
from imgpack.reader import options as options_mod
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.options import (
    MOVED_KNOBS,
    DistributedOptions,
    InProcessOptions,
    OrderOptions,
    WorkerOptions,
)


def _init(worker_id):  # a worker_init_fn that pickles
    torch.manual_seed(worker_id)


# old knob and value -> the make_loader keywords its message points to
CASES = {
    "persistent_workers": (True, {"num_workers": 1, "options": WorkerOptions(persistent=True)}),
    "multiprocessing_context": (
        "spawn",
        {"num_workers": 1, "options": WorkerOptions(multiprocessing_context="spawn")},
    ),
    "worker_init_fn": (_init, {"num_workers": 1, "options": WorkerOptions(worker_init_fn=_init)}),
    "timeout": (30, {"num_workers": 1, "options": WorkerOptions(timeout=30)}),
    "prefetch_factor": (4, {"num_workers": 1, "options": WorkerOptions(prefetch_factor=4)}),
    "gather_threads": (2, {"options": InProcessOptions(gather_threads=2)}),
    "prefetch_hints": (True, {"options": InProcessOptions(hints=True)}),
    "block": (4, {"order": OrderOptions("block", block=4)}),
    "window": (2, {"order": OrderOptions("block", window=2)}),
    "rank": (0, {"distributed": DistributedOptions(rank=0, world_size=2), "seed": 1}),
    "world_size": (2, {"distributed": DistributedOptions(rank=0, world_size=2), "seed": 1}),
    "shard_local": (
        True,
        {"distributed": DistributedOptions(rank=0, world_size=1, shard_local=True)},
    ),
    "mode": ("workers", {"num_workers": 1}),
    "copy": (True, {}),
    "keep": (True, {}),
    "pin_memory_device": (
        "",
        {"num_workers": 1, "options": WorkerOptions(dataloader_kwargs={"pin_memory_device": ""})},
    ),
}


@pytest.mark.parametrize("knob", sorted(CASES))
def test_the_old_knob_is_refused_and_the_named_call_works(make_pack, knob):
    path, _, _ = make_pack(count=16)
    ds = PackedImageDataset(path)
    old, new = CASES[knob]
    with pytest.raises(InvalidArgumentError) as err:
        make_loader(ds, 8, **{knob: old})
    message = str(err.value)
    assert "\n" not in message and f"make_loader({knob}=...)" in message
    for name, value in new.items():
        if name in ("options", "order", "distributed"):
            assert f"{name}={type(value).__name__}(" in message
    loader = make_loader(ds, 8, **new)
    images, _ = next(iter(loader))
    assert images.shape[0] == 8
    loader.close()


def test_collate_fn_points_to_dataloader_kwargs_that_work_for_a_transform(make_pack):
    path, _, _ = make_pack(count=16)
    ds = PackedImageDataset(path, transform=lambda x: x.float())
    with pytest.raises(InvalidArgumentError, match=r"WorkerOptions\(dataloader_kwargs="):
        make_loader(ds, 8, collate_fn=torch.utils.data.default_collate)
    opts = WorkerOptions(dataloader_kwargs={"collate_fn": torch.utils.data.default_collate})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the once-per-process per-sample warning
        loader = make_loader(ds, 8, num_workers=0, options=opts)
    assert next(iter(loader))[0].dtype == torch.float32


@pytest.mark.parametrize("knob", sorted(MOVED_KNOBS))
def test_every_option_a_message_names_is_spelled_as_it_exists(knob):
    named = re.findall(r"(\w+Options)\(([^)]*)\)", MOVED_KNOBS[knob])
    for cls_name, args in named:
        fields = {f.name for f in dataclasses.fields(getattr(options_mod, cls_name))}
        for arg in re.findall(r"(\w+)=", args):
            assert arg in fields, f"{knob}: {cls_name} has no {arg}"


def test_an_unknown_keyword_is_still_a_type_error(make_pack):
    path, _, _ = make_pack(count=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        make_loader(PackedImageDataset(path), 2, bogus=1)
