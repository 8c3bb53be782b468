"""GPU proof: the same ResNet-50 training loop fed by the per-file PIL loader and by imgpack.

The GPU run, from the repository root of a CUDA machine (H200-class GPU, 16 cores), one call:

    python scripts/gpu_proof.py --out OUT/smoke --dry-run --device cuda \
      && python scripts/gpu_proof.py --out OUT --work /tmp/gpu_proof_work

The first command is a seconds-long smoke test of every CUDA code path (tiny model);
the second is the proof: copy ceilings, a generated 100-class sample of 56,400
JPEGs packed at 224x224, then 20 warm-up + 200 measured steps of 256 images per
loader. Expected time about 3 minutes (sample ~1 min, pack ~20 s, per-file run
~1 min, imgpack run ~20 s, start-up); it is sized to stay under 8 minutes. It
writes OUT/gpu_proof.json and OUT/gpu_proof.png (the smoke test the same names
under OUT/smoke). With --work, a rerun reuses the sample. Needs torch with CUDA,
nvidia-smi on PATH (else utilisation is null with a reason), ~11 GB free under
--work, and ~1 GB of /dev/shm for the per-file baseline's DataLoader workers.
``--help`` lists the options; ``--dry-run`` alone runs on CPU in seconds (the test
suite does that).

The logic lives in scripts/workbench/gpu_proof.py; this file only starts it.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    # Works from a bare checkout too; the import stays under the guard so that
    # processes that re-import this file (spawn) do not load torch for nothing.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from workbench.gpu_proof import main

    main()
