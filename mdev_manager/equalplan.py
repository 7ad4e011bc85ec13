"""Time-sliced vGPUs on a GPU in equal-size mode (and on other vendors' mdev GPUs): mdevs, or
vendor-VFIO types on VFs, counted per type. Pure.

The vGPUs that match stay; new ones go where the GPU still has room and one framebuffer size;
a dormant saved vGPU is re-used for its type first, and one a libvirt domain names is re-created
as saved or kept saved (:meth:`_Room.revive`). Mixed-size GPUs are :mod:`.placeplan`'s, MIG-backed
vGPUs :mod:`.migplan`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mdev_manager.actions import (
    Action,
    CreateMdev,
    Plan,
    RemoveDefinition,
    RemoveMdev,
    SaveDefinition,
    SaveVendorRecord,
    SetVgpuType,
    Skip,
)
from mdev_manager.models import Gpu, MdevDefinition, Usage, Vgpu, VgpuType, held_types, occupancy
from mdev_manager.offers import NVIDIA
from mdev_manager.vgpusteps import clear_step, dormant_users, forget_step, split_existing


def _sizes(sizes: Iterable[int | None]) -> str:
    """``2048 MiB, 4096 MiB``; a type whose framebuffer the driver does not tell is said last."""
    return ", ".join(f"{s} MiB" if s is not None else "unknown" for s in sorted(sizes, key=lambda s: (s is None, s or 0)))


class _Room:
    """What a GPU still holds while a plan adds vGPUs to the ones it keeps (both frameworks)."""

    def __init__(self, gpu: Gpu, types: dict[str, VgpuType], kept: list[Vgpu]):
        self.gpu = gpu
        self.types = types
        self.equal_size = not gpu.mixed_size and gpu.vendor_id == NVIDIA
        held = held_types(types.values(), kept)
        self.used = occupancy((t, 1) for t in held)
        self.sizes = {t.framebuffer_mib for t in held}

    def size_allows(self, plan: Plan, t: VgpuType, need: int) -> bool:
        other = self.sizes - {t.framebuffer_mib}
        if self.equal_size and other:
            plan.skipped.append(Skip(device=self.gpu.address, reason=(
                f"{need} x {t.short_name} not created: the GPU keeps vGPUs of another framebuffer size "
                f"({_sizes(other)}) and is in equal-size mode")))
            return False
        return True

    def to_create(self, plan: Plan, wanted: dict[str, int], have: list[str]) -> Iterable[tuple[VgpuType, int]]:
        """(type, how many more) per wanted type (``have``: the type ids kept), in type order; sizes the
        GPU cannot mix are skipped."""
        for tid, want in sorted(wanted.items()):
            t = self.types.get(tid)
            need = want - have.count(tid)
            if need > 0 and t is not None and self.size_allows(plan, t, need):
                yield t, need

    def fits(self, plan: Plan, t: VgpuType) -> bool:
        if t.max_instances and self.used + occupancy([(t, 1)]) > 1:
            plan.skipped.append(Skip(device=self.gpu.address, reason=f"{t.short_name} not created: the GPU is full"))
            return False
        return True

    def add(self, t: VgpuType) -> None:
        self.used += occupancy([(t, 1)])
        self.sizes.add(t.framebuffer_mib)

    def revive(self, plan: Plan, key: str, type_id: str, parent: str, free: list[str], users: list[str],
               wanted: dict[str, int], have: list[str]) -> bool:
        """Room for a saved vGPU without a device that ``users`` name, as it was saved (type, parent):
        True when it is re-created (counted in ``have``). Otherwise, or when the layout has no room
        for it, a Skip naming them: its record stays and the node is blocked on it
        (:func:`mdev_manager.blocked.blocked_by_use`), never told it matches."""
        t = self.types.get(type_id)
        other = self.sizes - {t.framebuffer_mib} if t else set()
        if t is None:
            why = f"{parent} offers no vGPU type {type_id} now"
        elif parent not in free:
            why = f"{parent} holds another vGPU"
        elif self.equal_size and other:
            why = f"the GPU keeps vGPUs of another framebuffer size ({_sizes(other)}) and is in equal-size mode"
        elif t.max_instances and self.used + occupancy([(t, 1)]) > 1:
            why = "the GPU is full"
        else:
            self.add(t)
            have.append(type_id)
            if have.count(type_id) > wanted.get(type_id, 0):
                plan.skipped.append(Skip(device=key, gpu=self.gpu.address, held_by=users, reason=(
                    f"its removal: the layout has no room for this {t.short_name}, re-created as saved")))
            return True
        plan.skipped.append(Skip(device=key, gpu=self.gpu.address, held_by=users, reason=(
            f"re-creating it as saved ({why}): its saved record is kept, not forgotten")))
        return False


def plan_mdev(plan: Plan, gpu: Gpu, wanted: dict[str, int], usage: Usage,
               definitions: Iterable[MdevDefinition], new_uuid: Callable[[], str]) -> None:
    types = {t.id: t for t in gpu.types}
    parents = [p.address for p in gpu.parents]
    defs = {d.uuid: d for d in definitions if d.parent in parents}
    removals: list[Action] = []
    saves: list[Action] = []
    creates: list[Action] = []
    keep, busy, drop = split_existing(plan, [v for v in gpu.vgpus if v.framework == "mdev"], wanted, usage,
                                       set(defs), "removed")
    kept = keep + busy
    for v in busy:
        if v.id in defs and usage.claims_of(v.id):  # a claim's device is not the layout's to save
            removals.append(forget_step(gpu, v))
    for v in keep:
        if v.id not in defs:
            saves.append(SaveDefinition(gpu=gpu.address, parent=v.parent, uuid=v.id, type_id=v.type_id))
    for v in drop:
        removals += [clear_step(gpu, v), forget_step(gpu, v)] if v.id in defs else [clear_step(gpu, v)]
    active = {v.id for v in gpu.vgpus}
    removed = {a.uuid for a in removals if isinstance(a, RemoveMdev)}
    busy_parents = {v.parent for v in gpu.vgpus if v.id not in removed}
    per_vf = gpu.framework == "mdev-sriov"
    free = [p for p in parents if not per_vf or p not in busy_parents]
    dormant = [d for d in defs.values() if d.uuid not in active]
    room = _Room(gpu, types, kept)
    have = [v.type_id for v in keep]
    for d in [d for d in dormant if dormant_users(d.uuid, usage, mdev=True)]:
        dormant.remove(d)  # a domain's: re-created as saved, or kept saved; never forgotten or re-used
        if room.revive(plan, d.uuid, d.mdev_type, d.parent, free, dormant_users(d.uuid, usage, mdev=True),
                       wanted, have):
            creates.append(CreateMdev(gpu=gpu.address, parent=d.parent, uuid=d.uuid, type_id=d.mdev_type))
        if per_vf and d.parent in free:
            free.remove(d.parent)
    for t, need in room.to_create(plan, wanted, have):
        tid = t.id
        for _ in range(need):
            if not room.fits(plan, t):
                break
            reuse = next((d for d in dormant if d.mdev_type == tid and d.parent in free), None)
            if reuse:
                dormant.remove(reuse)
                parent, uid = reuse.parent, reuse.uuid
            else:
                if not free:
                    plan.skipped.append(Skip(device=gpu.address, reason=f"{t.short_name} not created: no free VF left"))
                    break
                parent, uid = free[0], new_uuid()
                saves.append(SaveDefinition(gpu=gpu.address, parent=parent, uuid=uid, type_id=tid))
            if per_vf:
                free.remove(parent)
            creates.append(CreateMdev(gpu=gpu.address, parent=parent, uuid=uid, type_id=tid))
            room.add(t)
    for d in dormant:
        removals.append(RemoveDefinition(gpu=gpu.address, parent=d.parent, uuid=d.uuid))
    plan.actions += removals + saves + creates


def plan_vendor(plan: Plan, gpu: Gpu, wanted: dict[str, int], usage: Usage, records: dict[str, str]) -> None:
    types = {t.id: t for t in gpu.types}
    vfs = [vf.address for vf in gpu.vfs]
    mine = {vf: tid for vf, tid in records.items() if vf in vfs}
    removals: list[Action] = []
    saves: list[Action] = []
    creates: list[Action] = []
    # a VF a DRA claim holds (or will make its vGPU on again, after a reboot) is the claim's: a
    # layout record naming it is forgotten and the VF is not the layout's to fill
    claimed_vfs = {vf for vf in vfs if usage.claims_of(vf)}
    for vf in sorted(claimed_vfs & set(mine)):
        removals.append(SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=None))
        del mine[vf]
    keep, busy, drop = split_existing(plan, gpu.vgpus, wanted, usage, set(mine), "cleared")
    kept = keep + busy
    for v in keep:
        if mine.get(v.id) != v.type_id:
            saves.append(SaveVendorRecord(gpu=gpu.address, vf=v.id, type_id=v.type_id))
    for v in drop:
        removals += [clear_step(gpu, v), forget_step(gpu, v)] if v.id in mine else [clear_step(gpu, v)]
    holding = {v.id for v in kept} | claimed_vfs
    free = [vf for vf in vfs if vf not in holding]
    dormant = {vf: tid for vf, tid in mine.items() if vf not in {v.id for v in gpu.vgpus}}
    room = _Room(gpu, types, kept)
    have = [v.type_id for v in keep]
    for vf, tid in sorted(dormant.items()):
        if users := dormant_users(vf, usage, mdev=False):
            del dormant[vf]  # a domain's: its type set again as saved, or kept saved; never another type
            if room.revive(plan, vf, tid, vf, free, users, wanted, have):
                creates.append(SetVgpuType(gpu=gpu.address, vf=vf, type_id=tid))
            if vf in free:
                free.remove(vf)
    for t, need in room.to_create(plan, wanted, have):
        tid = t.id
        for _ in range(need):
            if not room.fits(plan, t):
                break
            target = next((v for v, rt in dormant.items() if rt == tid and v in free), None) or (free[0] if free else None)
            if target is None:
                plan.skipped.append(Skip(device=gpu.address, reason=f"{t.short_name} not created: no free VF left"))
                break
            free.remove(target)
            if dormant.pop(target, None) != tid:
                saves.append(SaveVendorRecord(gpu=gpu.address, vf=target, type_id=tid))
            creates.append(SetVgpuType(gpu=gpu.address, vf=target, type_id=tid))
            room.add(t)
    for vf in dormant:
        removals.append(SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=None))
    plan.actions += removals + saves + creates
