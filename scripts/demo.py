#!/usr/bin/env python3
"""The imgpack demo's Python steps (``sample``, ``train``); scripts/demo.sh runs them in order.

The logic is in scripts/workbench/demo.py.
"""

from workbench.demo import main

if __name__ == "__main__":
    main()
