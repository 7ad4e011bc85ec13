"""What "the node matches its layout" and "converging" mean, recomputed from the node alone.

The status invariants must not ask the planner under test what it thinks (a planner that says
"nothing to do" when something is left would agree with itself). This module reads the layout as
the campaign wrote it (its own dicts, not the layout parser), the node as discovery shows it, and
who holds what as the campaign knows it (its simulated VMs' vfio groups and cdevs, its libvirt
domains) and as the plugin's checkpoint on disk records it (every claim record, whatever its state):

* **vgpu** ``{T: n}``: the GPU is on a native driver, holds exactly ``n`` vGPUs of type ``T``
  that no claim holds, and no other vGPU (another type, or a claim's);
* **passthrough**: every function of its IOMMU group on vfio-pci, no VF enabled, no vGPU;
* **dra**: no vGPU that no claim holds (a layout's leftovers go), on a native driver with its VFs
  enabled (SR-IOV boards) unless a claim passes it through, in the MIG mode ``migMode`` says;
* **unmanaged**, or not in the layout: anything.

A GPU that does not match is *blocked* when what would have to change is in use: a held vGPU it
must not keep (another type, a claim's, more held than ``n``), or, when its driver, VFs or MIG
mode must change, anything held on it at all (a function of its group, a VF, a vGPU). A GPU that
does not match and is not blocked is one an apply should have fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_bridge.kubeletplugin.state import Checkpoint
from mdev_manager.models import Gpu, Inventory


@dataclass
class GpuVerdict:
    address: str
    mode: str
    matches: bool
    blocked: bool
    why: str  # what differs, and who holds what keeps it so

    def __str__(self) -> str:
        state = "matches" if self.matches else "blocked" if self.blocked else "differs"
        return f"GPU {self.address} ({self.mode}) {state}: {self.why}"


def holders(world, cp: Checkpoint) -> dict[str, list[str]]:
    """Device (mdev UUID or PCI address, lower case) -> who holds it, as the campaign and the checkpoint know."""
    out: dict[str, list[str]] = {}

    def add(key: str | None, who: str) -> None:
        if key:
            out.setdefault(key.lower(), []).append(who)

    for pid, h in sorted(world.vms.items()):
        add(h.device, f"VM pid {pid} ({h.how})")
    for name, (mdevs, pcis) in sorted(world.domains.items()):
        for d in [*mdevs, *pcis]:
            add(d, f"libvirt domain {name}")
    for uid, rec in sorted(cp.claims.items()):
        for d in rec.devices:
            add(d.vgpu_id if d.kind == "vgpu" else d.gpu, f"claim {rec.name or uid} ({rec.state})")
    return out


def _short(type_name: str) -> str:
    return type_name.split()[-1] if type_name else ""


def entries(layout: list[dict], inv: Inventory) -> dict[str, dict]:
    """GPU address -> its entry (the campaign's layouts select by ``all`` or ``pciAddress`` only)."""
    out: dict[str, dict] = {}
    for e in layout:
        if e.get("all"):
            out.update({g.address: e for g in inv.gpus})
        elif e.get("pciAddress"):
            out[e["pciAddress"]] = e
    return out


def judge(world, layout_name: str, inv: Inventory, cp: Checkpoint) -> list[GpuVerdict]:
    held = holders(world, cp)
    claimed = {(d.vgpu_id or "").lower() for rec in cp.claims.values() for d in rec.devices if d.kind == "vgpu"}
    passed = {d.gpu for rec in cp.claims.values() for d in rec.devices if d.kind == "passthrough"}
    out = []
    for address, e in sorted(entries(world.layouts[layout_name], inv).items()):
        g = inv.gpu(address)
        if g is None:
            out.append(GpuVerdict(address, e.get("mode", "?"), False, False, "the GPU is gone"))
            continue
        out.append(_judge_gpu(g, e, held, claimed, passed))
    return out


def _judge_gpu(g: Gpu, e: dict, held: dict[str, list[str]], claimed: set[str], passed: set[str]) -> GpuVerdict:
    mode = e.get("mode", "?")
    functions = set(g.iommu_group_drivers or {g.address: g.driver}) | {g.address} | {vf.address for vf in g.vfs}
    drivers = g.iommu_group_drivers or {g.address: g.driver}
    held_fns = {f: held[f] for f in sorted(functions) if f in held}
    held_v = {v.id: held[v.id.lower()] for v in g.vgpus if v.id.lower() in held}
    anything_held = {**held_fns, **held_v}

    def who(items: dict[str, list[str]]) -> str:
        return "; ".join(f"{k} held by {', '.join(v)}" for k, v in items.items())

    differs: list[str] = []
    structural = False  # driver, VFs or MIG mode must change: nothing on the GPU may be in use
    unwanted_held: dict[str, list[str]] = {}

    if mode == "vgpu":
        (want_type, want_n), = e["vgpus"].items()
        if g.driver in (None, "vfio-pci") or any(d == "vfio-pci" for d in drivers.values()):
            differs.append(f"driver {g.driver}, group {drivers}")
            structural = True
        own = [v for v in g.vgpus if v.id.lower() not in claimed]
        mine = [v for v in own if _short(v.type_name) == want_type]
        others = [v for v in g.vgpus if v not in mine]
        if others:
            differs.append(f"holds {', '.join(sorted(f'{_short(v.type_name)} {v.id}' for v in others))}")
            unwanted_held.update({v.id: held_v[v.id] for v in others if v.id in held_v})
        if len(mine) != want_n:
            differs.append(f"{len(mine)} x {want_type}, not {want_n}")
            held_mine = [v for v in mine if v.id in held_v]
            if len(held_mine) > want_n:
                unwanted_held.update({v.id: held_v[v.id] for v in held_mine})
            if not mine and not others and g.mig is not None:
                mig_type = "-" in want_type[want_type.index("-") + 1:]  # A100-3-20C: MIG-backed
                if g.mig.enabled != mig_type:
                    structural = True
            if g.sriov_total_vfs and not g.sriov_num_vfs:
                structural = True
    elif mode == "passthrough":
        if any(d != "vfio-pci" for d in drivers.values()):
            differs.append(f"group drivers {drivers}")
        if g.sriov_num_vfs:
            differs.append(f"{g.sriov_num_vfs} VFs enabled")
        if g.vgpus:
            differs.append(f"holds {len(g.vgpus)} vGPUs")
        structural = bool(differs)
    elif mode == "dra":
        own = [v for v in g.vgpus if v.id.lower() not in claimed]
        if own:
            differs.append(f"holds vGPUs no claim holds: {', '.join(sorted(v.id for v in own))}")
            unwanted_held.update({v.id: held_v[v.id] for v in own if v.id in held_v})
        if g.address not in passed:
            if g.driver in (None, "vfio-pci") or any(d == "vfio-pci" for d in drivers.values()):
                differs.append(f"group drivers {drivers} (no claim passes it through)")
                structural = True
            elif g.sriov_total_vfs and not g.sriov_num_vfs:
                differs.append("VFs disabled")
                structural = True
            mig = e.get("migMode")
            if isinstance(mig, bool) and g.mig is not None and g.mig.enabled != mig:
                differs.append(f"MIG mode {'on' if g.mig.enabled else 'off'}, migMode {mig}")
                structural = True
    else:  # unmanaged
        return GpuVerdict(g.address, mode, True, False, "unmanaged")
    if not differs:
        return GpuVerdict(g.address, mode, True, False, "matches")
    blocking = {**unwanted_held, **(anything_held if structural else {})}
    why = "; ".join(differs) + (f" — {who(blocking)}" if blocking else "")
    return GpuVerdict(g.address, mode, False, bool(blocking), why)
