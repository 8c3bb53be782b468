"""Two real ranks (torch.distributed, gloo on 127.0.0.1): disjoint shares of every epoch,
an exact evaluation pass (pad=False), one shared order drawn without a seed, and a state
saved on both ranks mid-epoch that resumes on one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from packs_v3 import write_v3

from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.order import EpochOrder

# records of many sizes within a 20 x 16 bound (packs_v3.SIZES), as test_resident.py's MANY
MANY = [(20, 16), (13, 16), (20, 7), (7, 5), (1, 1), (20, 16)]

RANK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from imgpack.reader.dataset import PackedImageDataset
    from imgpack.reader.loader import make_loader
    from imgpack.reader.options import DistributedOptions

    pack, out, odd = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method="env://")  # RANK, WORLD_SIZE, MASTER_* from env
    ds = PackedImageDataset(pack)
    key = {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}
    result = {"rank": dist.get_rank(), "world": dist.get_world_size()}
    for mode, workers in (("inprocess", None), ("workers", 1)):
        loader = make_loader(ds, 4, seed=7, num_workers=workers)
        result[mode] = {"len": len(loader), "epochs": []}
        for epoch in range(2):
            loader.set_epoch(epoch)
            seen = [key[img.numpy().tobytes()] for images, _ in loader for img in images]
            result[mode]["epochs"].append(seen)
    ev = PackedImageDataset(odd)
    ekey = {ev[i][0].numpy().tobytes(): i for i in range(len(ev))}
    for mode, workers in (("inprocess", None), ("workers", 1)):
        loader = make_loader(ev, 4, shuffle=False, pad=False, num_workers=workers)
        result["eval_" + mode] = [ekey[img.numpy().tobytes()] for b, _ in loader for img in b]
    loader = make_loader(ev, 4, seed=11, pad=False)  # preempted after its third step
    result["elastic_seen"] = [ekey[img.numpy().tobytes()] for _, (b, _) in zip(range(3), loader)
                              for img in b]
    result["elastic_states"] = [None, None]
    dist.all_gather_object(result["elastic_states"], loader.state_dict())
    torch.manual_seed(100 + dist.get_rank())  # ranks disagree: rank 0's draw must win
    loader = make_loader(ds, 4)
    result["unseeded"] = [key[img.numpy().tobytes()] for images, _ in loader for img in images]
    result["unseeded_seed"] = loader.state_dict()["seed"]
    # resident packs read shard-local (test_resident.py's case, in these ranks' interpreters)
    ds = PackedImageDataset(sys.argv[4:])
    local = DistributedOptions(shard_local=True)
    def canvas(x, records):  # records of many sizes: their padded canvas, as it comes
        return x

    resident = make_loader(ds, 3, seed=4, device="cpu", resident=True, distributed=local,
                           transform=canvas)
    streamed = make_loader(ds, 3, seed=4, device="cpu", distributed=local, transform=canvas)
    same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for e in range(2) for a, b in zip(resident, streamed))
    result["resident"] = {"same": same, "held": resident.read.held.tolist(),
                          "bytes": resident.resident_bytes, "batches": len(resident)}
    dist.barrier()
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(sys.platform == "win32", reason="gloo over TCP on Linux/macOS")
def test_two_real_ranks_share_each_epoch_and_their_state_resumes_on_one(make_pack, tmp_path):
    """Also, in the same two interpreters (one torch import and one gloo group for both):
    two ranks each hold their own shards of resident packs (test_resident.py's subject)."""
    path, _, _ = make_pack(count=48, height=8, width=6)
    odd, odd_pixels, _ = make_pack(count=47, height=8, width=6, name="odd")
    shards = [str(write_v3(tmp_path / f"s{k}.bin", "yuv420", sizes=MANY[:6], seed=k)[0])
              for k in range(4)]  # fmt: skip
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        env.update(RANK=str(rank), WORLD_SIZE="2", OMP_NUM_THREADS="1")
        cmd = [sys.executable, str(script), str(path), str(tmp_path / f"rank{rank}.json"), str(odd)]
        cmd += shards
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
    try:
        errors = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], errors
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world"]) for r in results] == [(0, 2), (1, 2)]
    for mode in ("inprocess", "workers"):
        assert [r[mode]["len"] for r in results] == [6, 6]
        for epoch in range(2):
            a, b = (r[mode]["epochs"][epoch] for r in results)
            assert len(a) == len(b) == 24
            assert not set(a) & set(b)
            assert sorted(a + b) == list(range(48))
            for rank, share in enumerate((a, b)):
                expected = EpochOrder(48, batch_size=4, seed=7, rank=rank, world_size=2)
                np.testing.assert_array_equal(share, expected.indices(epoch))
        for r in results:
            assert r[mode]["epochs"][0] != r[mode]["epochs"][1]  # set_epoch reshuffles
    assert results[0]["inprocess"] == results[0]["workers"]
    for mode in ("inprocess", "workers"):  # evaluation: every record exactly once, no padding
        a, b = (r["eval_" + mode] for r in results)
        assert (len(a), len(b)) == (23, 24) and sorted(a + b) == list(range(47))
    a, b = (r["unseeded"] for r in results)
    assert results[0]["unseeded_seed"] == results[1]["unseeded_seed"]
    assert sorted(a + b) == list(range(48))
    # saved on two ranks after 3 steps, resumed on one: each record exactly once in the epoch
    (state, other), seen = results[0]["elastic_states"], results[0]["elastic_seen"]
    assert state == other and state["consumed"] == [[2, 4, 3]]
    assert len(seen) == len(results[1]["elastic_seen"]) == 12
    one = make_loader(PackedImageDataset(odd), 4, seed=11, pad=False)
    one.load_state_dict(state)
    flat = odd_pixels.reshape(47, -1)
    rest = [int(np.flatnonzero((flat == img.permute(1, 2, 0).reshape(-1).numpy()).all(1))[0])
            for images, _ in one for img in images]  # fmt: skip
    assert sorted(seen + results[1]["elastic_seen"] + rest) == list(range(47))
    # resident, shard-local: the streamed batches, each rank holding its two shards' records
    held = [r["resident"] for r in results]
    assert all(r["same"] for r in held)
    assert held[0]["held"] == list(range(12)) and held[1]["held"] == list(range(12, 24))
    assert held[0]["bytes"] > 0 and held[0]["batches"] == 4
