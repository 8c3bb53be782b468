#!/usr/bin/env python3
"""The imgpack demo's Python steps (``sample``, ``train``); scripts/demo.sh runs them in order.

The logic is in imgpack/tools/demo.py.
"""

from imgpack.tools.demo import main

if __name__ == "__main__":
    main()
