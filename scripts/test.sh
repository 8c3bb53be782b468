#!/usr/bin/env bash
# Install imgpack with its test extra and run the test suite (arguments go to pytest).
# Reuses a torch that is already installed; otherwise installs torch==2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[dev]"
"$PY" -m pytest -q -n auto "$@"
