#!/usr/bin/env bash
# Install imgpack with its test extras and run the whole test suite.
# Reuses a torch that is already installed; otherwise pins one known release
# (on our CI machines that is a CPU build kept on local disk).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[dev]"
"$PY" -m pytest -q "$@"
