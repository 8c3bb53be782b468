"""Fuzz the pack index, manifest and journal readers: python scripts/fuzz.py --cases 100000.

Prints counts by outcome (opened and read, refused by error class) and every failure
with its reproducer (``--seed S --case K``). Exits 1 if any case failed.
"""

from __future__ import annotations

import sys

from workbench.fuzz import main

if __name__ == "__main__":
    sys.exit(main())
