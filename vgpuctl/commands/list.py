"""``vgpuctl list``: the node's vGPUs as mdevctl users know them, with who holds each.

As ``mdevctl list`` shows the active (existing) devices and ``mdevctl list --defined`` the
defined (persisted) ones, active or not: here the active vGPUs (mdevs and vendor-VFIO vGPUs on
VFs), and with ``--defined`` those vgpuctl persisted (mdevctl definitions under the mdevctl root,
vendor-VFIO records), each marked active or defined. Holders are what the node manager counts as
in use: processes holding the vGPU's ``/dev/vfio`` group or vfio cdev (``/proc`` scan), libvirt
domains (``--libvirt-uri``) and DRA claims the kubelet plugin prepared (its checkpoint under
``--kubelet-root``), so ``list`` shows why ``apply`` would keep a device. Read-only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from vgpuctl.cli import options
from vgpuctl.output.tables import fit, fit_lines

if TYPE_CHECKING:  # loaded where used: a command's -h stays light
    from mdev_manager.models import Inventory, Usage


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-d", "--defined", action="store_true",
                   help="the defined (persisted) vGPUs, active or not, as mdevctl list --defined")
    p.add_argument("-u", "--uuid", help="only this vGPU (mdev UUID, or the VF of a vendor-VFIO vGPU)")
    p.add_argument("-p", "--parent", help="only vGPUs on this parent device (PF or VF PCI address)")
    p.add_argument("--gpu", help="only vGPUs of this GPU (index or PCI address)")
    options.add_output(p, wide=True)
    options.add_kubelet_root(p, "claims its DRA driver prepared are holders")
    options.add_driver(p, "DRA driver whose prepared claims are holders")


@dataclass
class VgpuRow:
    id: str  # mdev UUID, or the VF of a vendor-VFIO vGPU
    gpu: str  # PCI address of the physical GPU
    index: int | None
    parent: str
    type_id: str
    type: str
    framework: str
    active: bool
    defined: bool
    start: str | None = None  # auto | manual (mdevctl definitions); vendor-VFIO records: auto
    iommu_group: int | None = None
    gpu_instance: int | None = None
    holders: list[str] = field(default_factory=list)


def rows(inv: Inventory, definitions, records: dict[str, str], usage: Usage) -> list[VgpuRow]:
    """Every active and every defined vGPU, once each, in GPU and id order."""
    from vgpuctl.output.text import TypeNames

    names = TypeNames([inv])
    gpu_of = {g.address: g for g in inv.gpus}
    gpu_of |= {x: g for g in inv.gpus for x in [*(p.address for p in g.parents), *(v.address for v in g.vfs)]}
    out: dict[str, VgpuRow] = {}
    for v in inv.all_vgpus():
        g = gpu_of.get(v.gpu)
        held = usage.mdev_users(v.id, v.iommu_group) if v.framework == "mdev" else usage.pci_users(v.id, v.iommu_group)
        out[v.id.lower()] = VgpuRow(id=v.id, gpu=v.gpu, index=g.index if g else None, parent=v.parent,
                                    type_id=v.type_id, type=names(v.gpu, v.type_id), framework=v.framework,
                                    active=True, defined=False, iommu_group=v.iommu_group,
                                    gpu_instance=v.gpu_instance, holders=[_short(h) for h in held])
    for d in definitions:
        _defined(out, d.uuid, d.parent, d.mdev_type, d.start, "mdev", gpu_of, names)
    for vf, type_id in records.items():
        _defined(out, vf, vf, type_id, "auto", "vendor-vfio", gpu_of, names)
    return sorted(out.values(), key=lambda r: (r.index if r.index is not None else 1 << 30, r.parent, r.id))


def _defined(out: dict, vid: str, parent: str, type_id: str, start: str, framework: str, gpu_of, names) -> None:
    row = out.get(vid.lower())
    if row is not None:
        row.defined, row.start = True, start
        return
    g = gpu_of.get(parent)
    gpu = g.address if g else parent
    out[vid.lower()] = VgpuRow(id=vid, gpu=gpu, index=g.index if g else None, parent=parent, type_id=type_id,
                               type=names(gpu, type_id), framework=framework, active=False, defined=True, start=start)


def _short(holder: str) -> str:
    """``pid 4242 (qemu-kvm) holds /dev/vfio/12`` -> ``qemu-kvm[4242]``; ``ResourceClaim ns/n references
    it`` -> ``claim ns/n``; ``libvirt domain vm1 references it`` -> ``libvirt vm1``."""
    if m := re.match(r"pid (\d+) \(([^)]*)\) holds", holder):
        return f"{m.group(2)}[{m.group(1)}]"
    holder = holder.removesuffix(" references it")
    return holder.replace("ResourceClaim ", "claim ", 1).replace("libvirt domain ", "libvirt ", 1)


def _wanted(r: VgpuRow, args, gpu: str | None) -> bool:
    if args.defined and not r.defined or not args.defined and not r.active:
        return False
    if args.uuid and r.id.lower() != args.uuid.lower():
        return False
    if args.parent and r.parent.lower() != args.parent.lower():
        return False
    return gpu is None or r.gpu == gpu


def state(r: VgpuRow) -> str:
    return "active+def" if r.active and r.defined else "active" if r.active else "defined"


def table(found: list[VgpuRow], *, wide: bool) -> str:
    if wide:
        header = ["GPU", "ADDRESS", "VGPU", "PARENT", "TYPE", "TYPE ID", "FRAMEWORK", "IOMMU", "GI", "STATE", "START",
                  "HOLDERS"]
        body = [["-" if r.index is None else str(r.index), r.gpu, r.id, r.parent, r.type, r.type_id, r.framework,
                 "-" if r.iommu_group is None else str(r.iommu_group),
                 "-" if r.gpu_instance is None else str(r.gpu_instance), state(r), r.start or "-",
                 "; ".join(r.holders) or "-"] for r in found]
        return fit(header, body, wide=True)
    header = ["GPU", "VGPU", "TYPE", "STATE", "HOLDERS"]
    body = [["-" if r.index is None else str(r.index), r.id, r.type, state(r), ", ".join(r.holders) or "-"]
            for r in found]
    return fit(header, body, fold=("TYPE", "HOLDERS"))


def run(args) -> int:
    import yaml

    from mdev_manager import persist
    from mdev_manager.discovery import discover
    from mdev_manager.usage import collect_usage
    from vgpuctl.cli.host import open_host, prepared_usage
    from vgpuctl.cli.scope import gpu_address

    host = open_host(args)
    inv = discover(host.env, host.io, node=host.node)
    definitions, problems = persist.load_definitions(host.env, host.io)
    records = persist.load_vendor_vfio(host.env, host.io)
    usage = collect_usage(host.env, host.io, prepared_usage(host, args.driver))
    gpu = gpu_address(inv, args.gpu) if args.gpu is not None else None
    found = [r for r in rows(inv, definitions, records, usage) if _wanted(r, args, gpu)]
    if args.output in ("json", "yaml"):
        data = [asdict(r) for r in found]
        print(json.dumps(data, indent=2) if args.output == "json" else yaml.safe_dump(data, sort_keys=False).rstrip())
    elif found:
        print(table(found, wide=args.output == "wide"))
    else:
        print("no defined vGPUs" if args.defined else "no active vGPUs (--defined lists the persisted ones)")
    for w in [*usage.warnings, *problems]:
        print(fit_lines(f"warning: {w}"), file=sys.stderr)
    return 0
