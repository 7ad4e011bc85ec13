"""``python -m benchmarks [node|dra|allocator ...]``: run and print the benchmarks."""

from __future__ import annotations

import importlib
import sys

ALL = ["node", "dra", "allocator"]


def main(argv: list[str]) -> int:
    names = argv or ALL
    for name in names:
        try:
            mod = importlib.import_module(f"benchmarks.bench_{name}")
        except ModuleNotFoundError as exc:
            print(f"{name}: not available ({exc})", file=sys.stderr)
            continue
        print("\n".join(mod.run()))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
