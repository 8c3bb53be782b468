"""Time opening a pack of N records: python scripts/bench_open.py [--records 1000000]."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from workbench.bench_open import make_tiny_pack, time_open


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pack = make_tiny_pack(Path(tmp) / "tiny.bin", args.records)
        print(json.dumps(time_open(pack, repeats=args.repeats)))


if __name__ == "__main__":
    main()
