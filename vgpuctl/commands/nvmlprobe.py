"""``vgpuctl nvml-probe``: what NVIDIA's driver reports for each GPU, read-only (a recording to check
the catalog against: tests/mdev_manager/test_nvml_probe.py)."""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import TYPE_CHECKING

from vgpuctl.cli import options

if TYPE_CHECKING:  # loaded where used: a command's -h stays light
    from mdev_manager.nvmlprobe import ProbeRecord


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.add_output(p)
    p.epilog = ("read-only: NVML's name, memory, MIG mode and GPU-instance profiles with their placements, the "
                "vGPU types with their mixed-size placements; it never sets MIG or mixed-size mode nor resets a GPU")


def run(args: argparse.Namespace) -> int:
    import yaml

    from mdev_manager import catalog
    from mdev_manager.discovery import read_function
    from mdev_manager.nvmlprobe import differences, probe
    from vgpuctl.cli.host import open_host

    host = open_host(args)
    rec = probe(host.io.nvml())
    for g in rec.gpus:  # beside each GPU, what the catalog says of its board (matched by PCI ids)
        fields = read_function(host.env, host.io, g.bus_id[-12:].lower())
        board = catalog.match_board(fields["vendor_id"], fields["device_id"], fields["subsystem_device_id"])
        if board is not None:
            g.catalog_board, g.catalog_differences = board.key, differences(g, board)
    if args.output in ("json", "yaml"):
        data = rec.model_dump(mode="json")
        print(json.dumps(data, indent=2) if args.output == "json" else yaml.safe_dump(data, sort_keys=False).rstrip())
    else:
        print(table(rec))
    return 0 if rec.gpus or not rec.errors else 1


def table(rec: ProbeRecord) -> str:
    lines = [f"driver {rec.driver_version or '?'}: {len(rec.gpus)} GPU(s)"]
    lines += [f"  {k}: {v}" for k, v in rec.errors.items()]
    for g in rec.gpus:
        mig = "no MIG" if g.mig is None else f"MIG {'on' if g.mig.current else 'off'} ({len(g.mig.profiles)} profiles)"
        mixed = {None: "no mixed-size", 0: "mixed-size off", 1: "mixed-size on"}.get(g.heterogeneous_mode, "?")
        head = f"{g.bus_id}  {g.name or '?'}  {g.memory_mib or '?'} MiB  {mig}, {mixed}, {len(g.vgpu_types)} vGPU types"
        lines += textwrap.wrap(head, 80, subsequent_indent=" " * 4, break_long_words=False, break_on_hyphens=False)
        if g.catalog_board:
            lines.append(f"    catalog board {g.catalog_board}: "
                         + (f"{len(g.catalog_differences)} difference(s), the driver's values are used"
                            if g.catalog_differences else "agrees with the driver"))
            for d in g.catalog_differences:
                lines += textwrap.wrap(f"      {d}", 80, subsequent_indent=" " * 8, break_long_words=False)
        placed = [t for t in g.vgpu_types if t.placements]
        for t in placed:
            at = f"    {t.name}: size {t.placement_size}, at {', '.join(map(str, t.placements or []))}"
            lines += textwrap.wrap(at, 80, subsequent_indent=" " * 8, break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines)
