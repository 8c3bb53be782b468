#!/usr/bin/env bash
# The imgpack demo, end to end on a fresh machine (only PyPI needs to be reachable):
#   1. install what is needed (reuses an installed torch; else torch==2.13.0),
#   2. make an ImageNet-like sample folder (10 classes x 100 JPEGs) cut from photographs
#      (scikit-image's sample photos, installed here for that alone; nothing else is
#      downloaded),
#   3. pack it with pack-images,
#   4. run the same simulated training twice, per-file PIL decoding through the usual
#      DataLoader template, then imgpack, and print images/s and the data wait side by side.
#
# Usage: bash scripts/demo.sh [WORK_DIR]    (default ./demo-data; it is gitignored)
# PYTHON picks the interpreter (default python3); DEMO_STEP_MS the simulated step (20 ms).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}

echo "== installing"
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install -q "torch==2.13.0"
fi
# imgpack itself, editable, unless this interpreter already imports this very checkout
if ! (cd / && "$PY" -c "import imgpack, sys; sys.exit(not imgpack.__file__.startswith('$ROOT/'))") 2>/dev/null; then
    "$PY" -m pip install -q -e .
fi
# scikit-image only for the photographs its wheel ships as files (never imported); without
# it the sample is cut from matplotlib's sample photo or from procedural images
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('skimage') is None)"; then
    "$PY" -m pip install -q --no-deps "scikit-image>=0.24" \
        || echo "scikit-image not installed: the sample is cut from fallback images"
fi

"$PY" scripts/demo.py "${1:-demo-data}" --step-ms "${DEMO_STEP_MS:-20}"
