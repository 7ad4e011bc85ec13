"""The vGPU steps the planners share (time-sliced in :mod:`.equalplan` and :mod:`.placeplan`, MIG-backed
in :mod:`.migplan`, GPU-wide in :mod:`.modeplan`): who uses a vGPU, the steps that remove or forget one,
and which existing vGPUs a layout keeps."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from mdev_manager.actions import Plan, RemoveDefinition, RemoveMdev, SaveVendorRecord, SetVgpuType, Skip
from mdev_manager.models import Gpu, MdevDefinition, Usage, Vgpu


def vgpu_users(v: Vgpu, usage: Usage) -> list[str]:
    if v.framework == "mdev":
        return usage.mdev_users(v.id, v.iommu_group)
    return usage.pci_users(v.id, v.iommu_group)


def dormant_users(key: str, usage: Usage, *, mdev: bool) -> list[str]:
    """Who names a saved vGPU that has no device now (a reboot, a restore that failed): a libvirt
    domain, running or merely defined, whose XML names its UUID or VF. Such a saved vGPU is the
    domain's: re-created as it was, never forgotten nor its VF given another type, or the domain
    cannot start again. A DRA claim's is left to the claim's own rules."""
    if usage.claims_of(key):
        return []
    return usage.mdev_users(key) if mdev else usage.pci_users(key)


def kept_for_its_domain(plan: Plan, gpu: Gpu, key: str, usage: Usage, *, mdev: bool) -> bool:
    """Where a planner would forget a saved vGPU that has no device: True (and a Skip naming who
    names it, so the node is blocked on it) when a domain names it; its record then stays."""
    users = dormant_users(key, usage, mdev=mdev)
    if users:
        plan.skipped.append(Skip(device=key, gpu=gpu.address, held_by=users, reason=(
            "re-creating it as saved (the layout has no room for it on this GPU): its saved record is kept, "
            "not forgotten")))
    return bool(users)


def named_dormant(gpu: Gpu, parents: set[str], definitions: Iterable[MdevDefinition], records: dict[str, str],
                  usage: Usage) -> dict[str, tuple[str, list[str]]]:
    """The saved vGPUs on ``parents`` without a device that a domain names (:func:`dormant_users`):
    definition UUID or VF -> (the parent it takes, who names it). A planner that would change the
    GPU under them (pass it through, put a new vGPU on that parent) holds them instead."""
    present = {v.id for v in gpu.vgpus}
    out: dict[str, tuple[str, list[str]]] = {}
    for d in definitions:
        if d.parent in parents and d.uuid not in present and (users := dormant_users(d.uuid, usage, mdev=True)):
            out[d.uuid] = (d.parent, users)
    for vf in sorted(records):
        if vf in parents and vf not in present and (users := dormant_users(vf, usage, mdev=False)):
            out[vf] = (vf, users)
    return out


def clear_step(gpu: Gpu, v: Vgpu) -> RemoveMdev | SetVgpuType:
    """The step that removes vGPU ``v`` from the host (an mdev, or a VF's vendor-VFIO type)."""
    if v.framework == "mdev":
        return RemoveMdev(gpu=gpu.address, parent=v.parent, uuid=v.id)
    return SetVgpuType(gpu=gpu.address, vf=v.id, type_id="0")


def forget_step(gpu: Gpu, v: Vgpu) -> RemoveDefinition | SaveVendorRecord:
    """The step that forgets the layout's saved record of vGPU ``v`` (definition or vendor record)."""
    if v.framework == "mdev":
        return RemoveDefinition(gpu=gpu.address, parent=v.parent, uuid=v.id)
    return SaveVendorRecord(gpu=gpu.address, vf=v.id, type_id=None)


def empty_gpu(plan: Plan, gpu: Gpu, usage: Usage, definitions: Iterable[MdevDefinition], records: dict[str, str],
              waits: str) -> bool:
    """Before a mode switch (MIG, mixed-size): steps removing every vGPU of ``gpu`` and forgetting the
    saved ones. When any is in use (a workload or a DRA claim) nothing is planned: each is skipped,
    and so is the GPU, with ``waits`` (``{n}``: how many are in use). True when the GPU will be empty."""
    busy = [v for v in gpu.vgpus if vgpu_users(v, usage) or usage.claims_of(v.id)]
    if busy:
        for v in busy:
            plan.skipped.append(Skip(device=v.id, reason=f"in use ({'; '.join(vgpu_users(v, usage) or usage.claims_of(v.id))})"))
        plan.skipped.append(Skip(device=gpu.address, reason=waits.format(n=len(busy))))
        return False
    parents = {gpu.address, *(vf.address for vf in gpu.vfs)}
    saved = {d.uuid for d in definitions if d.parent in parents} | {vf for vf in records if vf in parents}
    for v in gpu.vgpus:
        plan.actions += [clear_step(gpu, v)] + ([forget_step(gpu, v)] if v.id in saved else [])
    return True


def keep_order(v: Vgpu, users: list[str], saved: set[str]) -> tuple:
    """Which existing vGPUs to keep first: in use, then already persisted, then by id."""
    return (not users, v.id not in saved, v.id)


def split_existing(plan: Plan, vgpus: list[Vgpu], wanted: dict[str, int], usage: Usage, saved: set[str],
                    verb: str) -> tuple[list[Vgpu], list[Vgpu], list[Vgpu]]:
    """(kept as wanted, kept because in use, to remove) over a GPU's existing vGPUs, per type.

    Shared by both frameworks: the surplus that something uses stays and is reported.
    """
    by_type: dict[str, list[Vgpu]] = defaultdict(list)
    keep, busy, drop = [], [], []
    for v in vgpus:
        if claims := usage.claims_of(v.id):  # a DRA claim's, never the layout's: left to the claim
            busy.append(v)
            plan.skipped.append(Skip(device=v.id, reason=f"not {verb}: made for {'; '.join(claims)}, "
                                                         "not part of the layout"))
        else:
            by_type[v.type_id].append(v)
    for tid, lst in by_type.items():
        users = {v.id: vgpu_users(v, usage) for v in lst}
        lst.sort(key=lambda v: keep_order(v, users[v.id], saved))
        want = wanted.get(tid, 0)
        keep += lst[:want]
        for v in lst[want:]:
            if users[v.id]:
                busy.append(v)
                plan.skipped.append(Skip(device=v.id, reason=f"not {verb}: in use ({'; '.join(users[v.id])})"))
            else:
                drop.append(v)
    return keep, busy, drop
