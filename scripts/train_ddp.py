"""Train a tiny CNN with DistributedDataParallel from a sharded pack (an example of the pattern).

    pack-images SRC shards/part-00000.bin --num-shards 3 --shard-index 0   # ... and 1, 2
    pack-images merge all.manifest.json shards/part-*.bin
    torchrun --nproc-per-node 2 scripts/train_ddp.py --data all.manifest.json \
        --epochs 2 --checkpoint ckpt.pt --shard-local --log-samples seen.jsonl

On a CPU the ranks use gloo. Stop it at any time and run the same command again: it
continues at the next unseen batch. ``--help`` lists the options; the logic lives in
scripts/workbench/train_ddp.py, and docs/scaling.md explains the multi-node setup.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run from a bare checkout too; imports stay under the guard so that spawned
    # DataLoader workers, which re-import this file, do not load torch twice.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from workbench.train_ddp import main

    main()
