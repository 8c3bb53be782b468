"""torch DataLoader keywords passed to make_loader by name: refused, naming a call that works."""

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
    DATALOADER_KEYWORDS,
    DistributedOptions,
    OrderOptions,
    WorkerOptions,
)


def _init(worker_id):  # a worker_init_fn that pickles
    torch.manual_seed(worker_id)


# DataLoader keyword and value -> the make_loader keywords its message points to
CASES = {
    "persistent_workers": (True, {"num_workers": 1, "options": WorkerOptions(persistent=True)}),
    "multiprocessing_context": (  # fork: spawn is tested where it matters (test_loader.py)
        "fork",
        {"num_workers": 1, "options": WorkerOptions(multiprocessing_context="fork")},
    ),
    "worker_init_fn": (_init, {"num_workers": 1, "options": WorkerOptions(worker_init_fn=_init)}),
    "timeout": (30, {"num_workers": 1, "options": WorkerOptions(timeout=30)}),
    "prefetch_factor": (4, {"num_workers": 1, "options": WorkerOptions(prefetch_factor=4)}),
    "sampler": (
        torch.utils.data.SequentialSampler(range(16)),
        {"order": OrderOptions("sequential"), "distributed": DistributedOptions(0, 1)},
    ),
    "batch_sampler": (
        [[0, 1]],
        {"order": OrderOptions("sequential"), "distributed": DistributedOptions(0, 1)},
    ),
    "generator": (torch.Generator(), {"seed": 7}),
    "pin_memory_device": (
        "",
        {"num_workers": 1, "options": WorkerOptions(dataloader_kwargs={"pin_memory_device": ""})},
    ),
}


def test_every_keyword_answered_is_a_dataloader_keyword():
    accepted = set(torch.utils.data.DataLoader.__init__.__code__.co_varnames)
    assert set(DATALOADER_KEYWORDS) <= accepted


@pytest.mark.parametrize("keyword", sorted(CASES))
def test_the_keyword_is_refused_and_the_named_call_works(make_pack, keyword):
    path, _, _ = make_pack(count=16)
    ds = PackedImageDataset(path)
    given, new = CASES[keyword]
    with pytest.raises(InvalidArgumentError) as err:
        make_loader(ds, 8, **{keyword: given})
    message = str(err.value)
    assert "\n" not in message and f"make_loader({keyword}=...)" in message
    for name, value in new.items():
        if name in ("options", "order", "distributed"):
            assert f"{name}={type(value).__name__}(" in message
        else:
            assert f"{name}=" in message
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


@pytest.mark.parametrize("keyword", sorted(DATALOADER_KEYWORDS))
def test_every_option_a_message_names_is_spelled_as_it_exists(keyword):
    named = re.findall(r"(\w+Options)\(([^)]*)\)", DATALOADER_KEYWORDS[keyword])
    for cls_name, args in named:
        fields = {f.name for f in dataclasses.fields(getattr(options_mod, cls_name))}
        for arg in re.findall(r"(\w+)=", args):
            assert arg in fields, f"{keyword}: {cls_name} has no {arg}"


@pytest.mark.parametrize("keyword", ["bogus", "gather_threads", "block", "mode", "copy"])
def test_any_other_keyword_is_a_type_error(make_pack, keyword):
    path, _, _ = make_pack(count=4)
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
        make_loader(PackedImageDataset(path), 2, **{keyword: 1})
