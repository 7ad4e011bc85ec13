"""Bring back saved vGPUs after a reboot or crash, without a layout (``vgpuctl restore``).

mdevctl-format definitions with ``start: auto`` and saved vendor-VFIO records are
re-created where their device is missing. A parent that is a VF of a PF whose VFs are
not enabled (they vanish on reboot) gets its PF's VFs enabled first: the VF is taken to
sit on its PF's bus, as NVIDIA's boards place them (offset 4, stride 1).

A device a prepared DRA claim holds (``usage``: the kubelet plugin's checkpoint) is the
claim's: restore leaves its id and its VF to the kubelet plugin, which re-creates it.
"""

from __future__ import annotations

from mdev_manager import persist
from mdev_manager.actions import CreateMdev, EnableVfs, Plan, SetVgpuType
from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.executor import Executor, Report
from mdev_manager.host.io import HostIO
from mdev_manager.models import Inventory, MdevDefinition, Usage


def _bus(addr: str) -> str:
    return addr.rsplit(":", 1)[0]


def plan_restore(inv: Inventory, defs: list[MdevDefinition], records: dict[str, str],
                 usage: Usage | None = None) -> Plan:
    plan = Plan()
    usage = usage or Usage()
    defs, records = _not_claimed(plan, defs, records, usage)
    present = {p.address for g in inv.gpus for p in g.parents} | {vf.address for g in inv.gpus for vf in g.vfs}
    active = {v.id for v in inv.all_vgpus()}
    vendor_active = {v.id: v.type_id for v in inv.all_vgpus() if v.framework == "vendor-vfio"}
    missing_parents = {d.parent for d in defs if d.start == "auto" and d.parent not in present}
    missing_parents |= {vf for vf in records if vf not in present}
    for g in inv.gpus:
        if (g.sriov_total_vfs and not g.sriov_num_vfs and g.driver not in (None, "vfio-pci")  # not a passed-through GPU
                and any(_bus(p) == _bus(g.address) for p in missing_parents)):
            plan.actions.append(EnableVfs(gpu=g.address, count=g.sriov_total_vfs))
    if plan.actions:
        return plan
    gpu_of = {p.address: g.address for g in inv.gpus for p in g.parents}
    gpu_of |= {vf.address: g.address for g in inv.gpus for vf in g.vfs}
    for d in defs:
        if d.start == "auto" and d.uuid not in active and d.parent in present:
            plan.actions.append(CreateMdev(gpu=gpu_of[d.parent], parent=d.parent, uuid=d.uuid, type_id=d.mdev_type))
        elif d.start == "auto" and d.parent not in present:
            plan.notes.append(f"definition {d.uuid}: parent {d.parent} is not on this node")
    for vf, tid in sorted(records.items()):
        if vf in present and vendor_active.get(vf) is None:
            plan.actions.append(SetVgpuType(gpu=gpu_of[vf], vf=vf, type_id=tid))
    return plan


def _not_claimed(plan: Plan, defs: list[MdevDefinition], records: dict[str, str],
                 usage: Usage) -> tuple[list[MdevDefinition], dict[str, str]]:
    """The definitions and records whose device (or VF) no prepared claim holds; the others noted."""
    kept_defs = []
    for d in defs:
        users = usage.mdev_users(d.uuid) + usage.pci_users(d.parent)
        if users:
            plan.notes.append(f"definition {d.uuid} on {d.parent} not restored: {'; '.join(users)}")
        else:
            kept_defs.append(d)
    kept_records = {}
    for vf, tid in records.items():
        users = usage.pci_users(vf)
        if users:
            plan.notes.append(f"VF {vf} (type {tid}) not restored: {'; '.join(users)}")
        else:
            kept_records[vf] = tid
    return kept_defs, kept_records


def restore(env: HostEnv, io: HostIO, usage: Usage | None = None) -> list[Report]:
    """Re-create what is saved and missing; ``usage`` (prepared DRA claims) names devices not to touch."""
    reports = []
    for _ in range(3):
        defs, _problems = persist.load_definitions(env, io)
        plan = plan_restore(discover(env, io), defs, persist.load_vendor_vfio(env, io), usage)
        if not plan.actions:
            break
        reports.append(Executor(env, io).run(plan))
        if not plan.structural():
            break
    return reports
