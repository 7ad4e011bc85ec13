"""``python -m benchmarks [node|dra|allocator ...]``: run and print the benchmarks."""

from __future__ import annotations

import argparse
import importlib
import sys

ALL = ["cli", "kubectl-vgpu", "discovery", "agent", "prepare", "storm", "size", "race", "node", "dra", "allocator",
       "packing", "claims"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run vgpuctl's benchmarks, each beside a peer run side by side with the ratio.",
        epilog="node: discovery and apply against Debian's mdevctl on a FUSE-mounted simulated host (needs root "
               "for the mount namespace); dra: API writes per resync and prepare latency; allocator: 10,000 "
               "claims on 1,000 nodes with and without the selector cache; packing: one seeded stream of "
               "mixed-size claims on L40S and H100 fleets, mixed-size placements vs equal-size mode; kubectl-vgpu: "
               "the whole plugin process on 1 and 100 simulated nodes, CPU and wall, beside #37's bounds; claims: "
               "claim to Running on the real control plane per GPU mode (mixed-size, MIG, equal-size), beside a "
               "pod with no claim.")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"benchmarks to run, any of {', '.join(ALL)} (default: all)")
    p.add_argument("--allocator", choices=("auto", "upstream", "model"), default="auto",
                   help="the scheduler allocator race and packing measure: upstream (Kubernetes' own, "
                        "build/oracle/allocator-<minor>), model (the Python model), auto (upstream where built; "
                        "default); each prints which one ran")
    p.add_argument("--sim-kernel", choices=("process", "in-process"), default="process",
                   help="prepare and storm: run the simulated kernel in a process of its own (default: as a real "
                        "kernel is no part of the agent's process) or in-process, beside the agent under its GIL "
                        "(the figures then include the model's Python); each prints which")
    p.add_argument("--per-gpu", type=int, metavar="N",
                   help="storm: claims per GPU (default 32, or VGPUCTL_BENCH_STORM_PER_GPU): 2 for a quick run")
    p.add_argument("--claims", type=int, metavar="N",
                   help="prepare: claims per round (default 200, or VGPUCTL_BENCH_CLAIMS)")
    return p


def main(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)  # -h: help, exit 0; an unknown option: usage, exit 2
    names = args.names or ALL
    from benchmarks import common

    common.ALLOCATOR = args.allocator
    common.SIM_KERNEL = args.sim_kernel
    for key in ("per_gpu", "claims"):
        n = getattr(args, key)
        if n is not None and n < 1:
            p.error(f"--{key.replace('_', '-')} {n}: give a count of 1 or more")
        common.SIZES[key] = n
    unknown = [n for n in names if n not in ALL]
    if unknown:  # (choices= with nargs="*" rejects the empty default on Python 3.11)
        p.error(f"unknown benchmark {', '.join(map(repr, unknown))} (choose from {', '.join(ALL)})")
    for name in names:
        try:
            mod = importlib.import_module(f"benchmarks.bench_{name.replace('-', '_')}")
        except ModuleNotFoundError as exc:
            print(f"{name}: not available ({exc})", file=sys.stderr)
            continue
        print("\n".join(mod.run()))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
