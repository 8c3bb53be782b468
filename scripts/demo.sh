#!/usr/bin/env bash
# The imgpack demo, end to end on a fresh machine:
#   1. install what is needed (reuses an installed torch),
#   2. make an ImageNet-like sample folder (10 classes x 100 JPEGs) from photographs
#      already on disk -- nothing is downloaded,
#   3. pack it with pack-images (progress bar),
#   4. run the same simulated training twice -- per-file PIL decoding through the usual
#      DataLoader template, then imgpack -- with the starvation meter on, and print
#      images/s and data-wait fraction side by side.
#
# Usage: bash scripts/demo.sh [WORK_DIR]    (default ./demo-data; it is gitignored)
# The simulated step sleeps 20 ms per batch of 64, like a GPU leaving the CPU free;
# change it with DEMO_STEP_MS. PYTHON picks the interpreter (default python3).
# DEMO_CLASSES, DEMO_PER_CLASS and DEMO_BATCH (10, 100, 64) size the run; the test suite
# runs this script with them small (tests/scripts/test_demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
WORK=${1:-demo-data}
STEP_MS=${DEMO_STEP_MS:-20}
CLASSES=${DEMO_CLASSES:-10}
PER_CLASS=${DEMO_PER_CLASS:-100}
BATCH=${DEMO_BATCH:-64}

echo "== 1/4 installing"
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install -q "torch==2.13.0"
fi
# imgpack itself, editable, unless this interpreter already imports this very checkout
# (asked from / so that the repository folder itself is not on the path)
if ! (cd / && "$PY" -c "import imgpack, sys; sys.exit(not imgpack.__file__.startswith('$ROOT/'))") 2>/dev/null; then
    "$PY" -m pip install -q -e .
fi
# Only for the sample photographs scikit-image ships as files (never imported);
# without it, matplotlib's sample photo or a procedural image is used instead.
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('skimage') is None)"; then
    "$PY" -m pip install -q --no-deps scikit-image \
        || echo "scikit-image not installed: sample images come from fallback photos"
fi

echo "== 2/4 making a sample folder"
"$PY" scripts/demo.py sample "$WORK/images" --classes "$CLASSES" --per-class "$PER_CLASS"

echo "== 3/4 packing"
"$PY" -c 'from imgpack.packer.cli import main; main(prog_name="pack-images")' \
    "$WORK/images" "$WORK/train.bin" --size 224 --force

echo "== 4/4 training: per-file decoding vs imgpack"
"$PY" scripts/demo.py train "$WORK/images" "$WORK/train.bin" \
    --size 224 --batch-size "$BATCH" --step-ms "$STEP_MS" --epochs 2
