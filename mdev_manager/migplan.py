"""MIG-backed vGPUs in a layout: MIG mode, GPU instances at placements, one vGPU on each. Pure.

NVIDIA's vGPU user guide ("MIG-backed vGPUs"): a MIG-backed type (``A100-3-20C``) takes one GPU
instance of its profile (``3g.20gb``) whole; MIG mode is switched while the GPU holds nothing;
the GPU instances are created (``nvidia-smi mig -cgi``, NVML's
``nvmlDeviceCreateGpuInstanceWithPlacement``) before the vGPUs on the VFs. Time-sliced and
MIG-backed vGPUs never share a GPU. The rules kept here, as in :mod:`.plan`:

* vGPUs the layout wants stay, with their GPU instances; a vGPU or GPU instance in use is never
  removed; a free GPU instance of a wanted profile is reused before a new one is placed;
* new GPU instances go where they fit beside the kept ones (a search over NVML's possible
  placements, so fragmentation is worked around where a placement exists at all);
* creating or destroying a GPU instance is structural: the node is discovered again (the new
  instance's id, and the types it makes creatable) before the vGPUs are planned;
* the GPU instances holding the layout's vGPUs are recorded (:class:`SaveMigRecord`), so
  ``restore`` re-creates them at the same placements after a reboot.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Iterable

from mdev_manager.actions import (
    CreateGpuInstance,
    CreateMdev,
    DestroyGpuInstance,
    Plan,
    RemoveDefinition,
    RemoveMdev,
    SaveDefinition,
    SaveMigRecord,
    SaveVendorRecord,
    SetMigMode,
    SetVgpuType,
    Skip,
)
from mdev_manager.models import Gpu, GpuInstanceProfile, MdevDefinition, MigPlacement, MigState, Usage, Vgpu, VgpuType
from mdev_manager.names import mig_profile_of
from mdev_manager.vgpusteps import (
    clear_step,
    empty_gpu,
    forget_step,
    kept_for_its_domain,
    named_dormant,
    split_existing,
)

ENGINES = ("multiprocessors", "copy_engines", "decoders", "encoders", "jpeg_engines", "ofa_engines")


def profile_of(mig: MigState | None, t: VgpuType) -> GpuInstanceProfile | None:
    """The GPU-instance profile a MIG-backed type takes, as the GPU's NVML lists it."""
    name = t.gpu_instance_profile or mig_profile_of(t.name)
    return mig.profile(name) if mig and name else None


def instances_for(t: VgpuType, n: int) -> int:
    """GPU instances ``n`` vGPUs of ``t`` need: one each, or (MIG time-slicing, GB20x) one per
    ``max_per_instance`` of them."""
    share = t.max_per_instance or 1
    return -(-n // share)


def full_profile(mig: MigState) -> GpuInstanceProfile:
    """The profile spanning the whole GPU: its engines are the GPU's (NVIDIA's DRA driver takes
    each counter's total as the maximum over the profiles, which is this one)."""
    return max(mig.profiles, key=lambda p: (p.slices, p.memory_mib, p.multiprocessors))


def engines_fit(mig: MigState, profiles: Iterable[GpuInstanceProfile]) -> bool:
    chosen = list(profiles)
    full = full_profile(mig)
    return all(sum(getattr(p, e) for p in chosen) <= getattr(full, e) for e in ENGINES)


def place(mig: MigState, taken: list[tuple[GpuInstanceProfile, MigPlacement]],
          need: list[GpuInstanceProfile]) -> list[MigPlacement] | None:
    """A placement for each of ``need`` beside ``taken`` (in ``need``'s order), or None.

    Backtracking over each profile's possible placements, widest profiles first, lowest start
    first: at most 7 instances over 8 slices, so the search is tiny and exact.
    """
    if not engines_fit(mig, [p for p, _ in taken] + need):
        return None
    used: set[int] = {s for _, pl in taken for s in pl.slices}
    count: dict[int, int] = {}
    for p, _ in taken:
        count[p.id] = count.get(p.id, 0) + 1
    order = sorted(range(len(need)), key=lambda i: (-max(pl.size for pl in need[i].placements), need[i].id))
    chosen: dict[int, MigPlacement] = {}

    def search(k: int) -> bool:
        if k == len(order):
            return True
        i = order[k]
        p = need[i]
        if count.get(p.id, 0) >= p.instances:
            return False
        for pl in p.placements:
            slices = set(pl.slices)
            if used & slices:
                continue
            used.update(slices)
            count[p.id] = count.get(p.id, 0) + 1
            chosen[i] = pl
            if search(k + 1):
                return True
            used.difference_update(slices)
            count[p.id] -= 1
        return False

    return [chosen[i] for i in range(len(need))] if search(0) else None


def check_mig_layout(gpu: Gpu, wanted: list[tuple[VgpuType, int]], where: str, label: str) -> list[str]:
    """Problems with a layout's MIG-backed types on ``gpu`` (each naming ``where``)."""
    mig_types = [(t, n) for t, n in wanted if t.mig_backed and n > 0]
    if not mig_types:
        return []
    if gpu.mig is None and gpu.driver in (None, "vfio-pci"):
        # Off its native driver (passed through, or unbound) NVML does not see the GPU: its MIG state is
        # known once the plan has returned it to that driver, and checked in that round. Found by the
        # fault campaign: rejecting here kept a passed-through A100 from ever getting MIG vGPUs back.
        return []
    if gpu.mig is None:
        return [f"{where}: {mig_types[0][0].name} is MIG-backed; {label} has no MIG (NVML reports none for it)"]
    if any(not t.mig_backed and n > 0 for t, n in wanted):
        return [f"{where}: {label} holds MIG-backed or time-sliced vGPUs, never both; list only one kind"]
    need: list[GpuInstanceProfile] = []
    named: list[str] = []
    for t, n in mig_types:
        prof = profile_of(gpu.mig, t)
        if prof is None:
            profile_name = t.gpu_instance_profile or mig_profile_of(t.name)
            return [f"{where}.{t.short_name}: {label} has no GPU-instance profile {profile_name!r} "
                    f"for it; its profiles are {', '.join(p.name for p in gpu.mig.profiles)}"]
        need += [prof] * instances_for(t, n)
        named.append(f"{n} x {t.short_name} ({prof.name})")
    if place(gpu.mig, [], need) is None:
        detail = " + ".join(named)
        return [f"{where}: {detail} do not fit on {label}: no placement of these GPU instances exists "
                f"(NVML's placements, {gpu.mig.memory_slices} memory slices); see `nvidia-smi mig -lgipp`"]
    return []


def same_record(a: list[dict], b: list[dict]) -> bool:
    """Two records of one GPU's instances that keep the same placements per profile and the same vGPUs
    on each profile's instances. Which of a profile's instances holds which mdev is a guess of
    discovery (an mdev does not name its GPU instance; :func:`.discovery._mig_state`), and equal
    instances are interchangeable for restore: comparing that pairing made the plan save the record
    again at every resync, each discovery guessing another way (found by the fault campaign)."""
    def canon(r: list[dict]) -> list[tuple]:
        profiles = sorted({e["profile"] for e in r})
        return [(p, sorted((e["start"], e["size"]) for e in r if e["profile"] == p),
                 sorted(str(sorted(e.get("vgpus") or [e.get("vgpu")], key=str)) for e in r if e["profile"] == p))
                for p in profiles]
    return canon(a) == canon(b)


def _record(gpu: Gpu, mig: MigState, holders: dict[int, list[str]]) -> list[dict]:
    """The record of the instances kept: each names its vGPU (``vgpu``), and with MIG time-slicing
    every vGPU sharing it (``vgpus``), so restore puts each back on it."""
    by_id = {g.id: g for g in mig.instances}
    out = []
    for i, vs in holders.items():
        if i in by_id and vs:
            e = {"profile": by_id[i].profile_id, "start": by_id[i].placement.start, "size": by_id[i].placement.size,
                 "vgpu": vs[0]}
            out.append({**e, "vgpus": sorted(vs)} if len(vs) > 1 else e)
    return sorted(out, key=lambda e: e["start"])


def plan_mig(plan: Plan, gpu: Gpu, wanted: dict[str, int], usage: Usage, definitions: Iterable[MdevDefinition],
             records: dict[str, str], saved_mig: list[dict] | None,
             new_uuid: Callable[[], str] = lambda: str(uuidlib.uuid4())) -> bool:
    """Steps taking a MIG-capable GPU to ``wanted`` (type id -> count): MIG-backed types put it in
    MIG mode; time-sliced ones take it out (both only while nothing is in use). False when the GPU
    stays out of MIG mode: its time-sliced vGPUs are
    :mod:`.equalplan`'s or :mod:`.placeplan`'s."""
    mig = gpu.mig
    assert mig is not None
    types = {t.id: t for t in gpu.types}
    want_mig = any(types[tid].mig_backed for tid, n in wanted.items() if n > 0 and tid in types)
    if want_mig != mig.enabled and (want_mig or any(n > 0 for n in wanted.values())):
        switch_mig_mode(plan, gpu, usage, definitions, records, want_mig)
        return True
    if not mig.enabled:
        return False
    parents = {gpu.address, *(vf.address for vf in gpu.vfs)}
    saved_ids = {d.uuid for d in definitions if d.parent in parents} | {vf for vf in records if vf in parents}
    keep, busy, drop = split_existing(plan, gpu.vgpus, wanted, usage, saved_ids, "removed")
    for v in drop:
        plan.actions += [clear_step(gpu, v)] + ([forget_step(gpu, v)] if v.id in saved_ids else [])
    holding: dict[int, list[Vgpu]] = {}
    for v in keep + busy:
        if v.gpu_instance is not None:
            holding.setdefault(v.gpu_instance, []).append(v)
    # saved vGPUs without a device that a domain names (a reboot whose restore failed): their VFs and
    # the placements their GPU instances are recorded at take nothing new, so restore brings them back
    named = named_dormant(gpu, parents, definitions, records, usage)
    held = _held_entries(mig, saved_mig or [], set(named), holding)
    held_ids = {g.id for g in mig.instances for e in held if (g.profile_id, g.placement.start) == (e["profile"], e["start"])}
    free = [g for g in mig.instances if g.id not in holding and g.id not in held_ids]
    # what each wanted type still needs: room in the instances its kept vGPUs share (MIG time-slicing),
    # then whole instances (each with up to max_per_instance vGPUs), served first by free ones of its profile
    fill: dict[int, tuple[VgpuType, int]] = {}
    need: list[tuple[VgpuType, GpuInstanceProfile, int]] = []
    for tid, n in sorted(wanted.items()):
        t = types.get(tid)
        prof = profile_of(mig, t) if t else None
        if t is None or prof is None:
            continue
        missing, share = n - sum(1 for v in keep if v.type_id == tid), t.max_per_instance or 1
        for gi_id, vs in sorted(holding.items()):
            if missing > 0 and share > len(vs) and all(v.type_id == tid for v in vs):
                add = min(share - len(vs), missing)
                fill[gi_id], missing = (t, add), missing - add
        while missing > 0:
            need.append((t, prof, min(share, missing)))
            missing -= share
    reuse: dict[int, tuple[VgpuType, int]] = {}
    fresh: list[tuple[VgpuType, GpuInstanceProfile, int]] = []
    for t, prof, count in need:
        gi = next((g for g in free if g.profile_id == prof.id and g.id not in reuse), None)
        if gi is None:
            fresh.append((t, prof, count))
        else:
            reuse[gi.id] = (t, count)
    structural = False
    for g in free:
        if g.id not in reuse:
            prof = mig.profile(g.profile_id)
            plan.actions.append(DestroyGpuInstance(gpu=gpu.address, gpu_instance=g.id, start=g.placement.start,
                                                   profile=prof.name if prof else str(g.profile_id)))
            structural = True
    if fresh:
        kept = [(mig.profile(g.profile_id), g.placement) for g in mig.instances
                if g.id in holding or g.id in reuse or g.id in held_ids]
        kept += [(mig.profile(e["profile"]), MigPlacement(start=e["start"], size=e["size"])) for e in held
                 if not any((g.profile_id, g.placement.start) == (e["profile"], e["start"]) for g in mig.instances)]
        taken = [(p, pl) for p, pl in kept if p is not None]
        # a kept instance of a profile NVML did not list: its engines are unknown, so nothing is placed beside it
        spots = place(mig, taken, [p for _, p, _ in fresh]) if len(taken) == len(kept) else None
        if spots is None:
            plan.skipped.append(Skip(device=gpu.address, reason=(
                f"{len(fresh)} GPU instance(s) ({', '.join(p.name for _, p, _ in fresh)}) not created: no placement "
                "left beside the GPU instances kept (in use or wanted); they are created once those are released")))
        else:
            for (_, prof, _), pl in zip(fresh, spots, strict=False):
                plan.actions.append(CreateGpuInstance(gpu=gpu.address, profile_id=prof.id, profile=prof.name,
                                                      start=pl.start, size=pl.size))
            structural = True
    if structural:
        return True  # discovered again: the vGPUs are planned on the instances as they are then
    creates = Plan()
    created = _create_vgpus(creates, gpu, {**fill, **reuse}, keep + busy, records, new_uuid,
                            {parent for parent, _ in named.values()})
    kept_ids = {v.id for v in keep}
    # a vGPU kept because it is in use (a VM, a libvirt domain) keeps its definition or record, so it
    # keeps its GPU instance's record too: restore re-creates the instance before the vGPU after a
    # reboot (without it the vGPU is not re-created, and the next apply replaced the definition a
    # defined libvirt domain names; found by the fault campaign, issue 29)
    recorded = kept_ids | {v.id for v in busy if v.id in saved_ids}
    holders = {i: [v.id for v in vs if v.id in recorded] for i, vs in holding.items()}
    for i, made in created.items():
        holders[i] = holders.get(i, []) + made
    record = sorted(_record(gpu, mig, holders) + held, key=lambda e: e["start"])
    if not same_record(record, saved_mig or []):  # before the vGPUs: a crash between leaves a record restore completes
        plan.actions.append(SaveMigRecord(gpu=gpu.address, instances=record))
    plan.actions += creates.actions
    plan.skipped += creates.skipped
    # saved vGPUs the layout no longer has (dormant after a reboot, or replaced): forgotten
    live = kept_ids | {m for made in created.values() for m in made} | {v.id for v in busy} | {v.id for v in drop}
    for vf in sorted(vf for vf in records if vf in parents and vf not in live):
        if not kept_for_its_domain(plan, gpu, vf, usage, mdev=False):
            plan.actions.append(SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=None))
    for d in definitions:
        if d.parent in parents and d.uuid not in live and not kept_for_its_domain(plan, gpu, d.uuid, usage, mdev=True):
            plan.actions.append(RemoveDefinition(gpu=gpu.address, parent=d.parent, uuid=d.uuid))
    return True


def _held_entries(mig: MigState, saved: list[dict], named: set[str], holding: dict[int, list[Vgpu]]) -> list[dict]:
    """The saved record's instances of the dormant vGPUs ``named`` (see :func:`plan_mig`), kept in the
    record and their placements held; one whose placement an instance holding a kept vGPU now overlaps
    cannot come back there and is not held."""
    busy = {s for g in mig.instances if g.id in holding for s in g.placement.slices}
    return [e for e in saved if named & set(e.get("vgpus") or [e.get("vgpu")])
            and not busy & set(range(e["start"], e["start"] + e["size"]))]


def _create_vgpus(plan: Plan, gpu: Gpu, reuse: dict[int, tuple[VgpuType, int]], kept: list, records: dict[str, str],
                  new_uuid: Callable[[], str], held_vfs: Iterable[str] = ()) -> dict[int, list[str]]:
    """``count`` vGPUs on each reused GPU instance (one, but with MIG time-slicing), each on a free
    VF (not one of ``held_vfs``: a saved vGPU a domain names takes it); returns GPU instance -> the
    vGPU ids made on it."""
    holding_vfs = {v.parent for v in kept} | set(held_vfs)
    free_vfs = [vf.address for vf in gpu.vfs if vf.address not in holding_vfs]
    created: dict[int, list[str]] = {}
    for gi_id, (t, count) in sorted(reuse.items()):
        for _ in range(count):
            if not free_vfs:
                plan.skipped.append(Skip(device=gpu.address, reason=f"{t.short_name} not created: no free VF left"))
                return created
            vf = free_vfs.pop(0)
            if t.framework == "vendor-vfio":
                if records.get(vf) != t.id:
                    plan.actions.append(SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=t.id))
                plan.actions.append(SetVgpuType(gpu=gpu.address, vf=vf, type_id=t.id, gpu_instance=gi_id))
                created.setdefault(gi_id, []).append(vf)
            else:
                uid = new_uuid()
                plan.actions += [SaveDefinition(gpu=gpu.address, parent=vf, uuid=uid, type_id=t.id),
                                 CreateMdev(gpu=gpu.address, parent=vf, uuid=uid, type_id=t.id)]
                created.setdefault(gi_id, []).append(uid)
    return created


def switch_mig_mode(plan: Plan, gpu: Gpu, usage: Usage, definitions: Iterable[MdevDefinition], records: dict[str, str],
                    enable: bool) -> None:
    """Everything on the GPU goes (nothing of it in use), then the mode switches."""
    waits = f"MIG mode {'enabled' if enable else 'disabled'} once its {{n}} vGPU(s) in use are released"
    if not empty_gpu(plan, gpu, usage, definitions, records, waits):
        return
    if gpu.mig and gpu.mig.enabled:
        for g in gpu.mig.instances:
            prof = gpu.mig.profile(g.profile_id)
            plan.actions.append(DestroyGpuInstance(gpu=gpu.address, gpu_instance=g.id, start=g.placement.start,
                                                   profile=prof.name if prof else str(g.profile_id)))
        plan.actions.append(SaveMigRecord(gpu=gpu.address, instances=[]))
    plan.actions.append(SetMigMode(gpu=gpu.address, enabled=enable))


def forget_layout_instances(plan: Plan, gpu: Gpu, saved: list[dict] | None) -> None:
    """A GPU handed to DRA: the GPU instances an earlier layout made go once their vGPUs do (this
    plan removes the unused ones), so claims find the placements free and restore no longer
    re-creates them; one whose vGPU stays (in use) stays, and so does its record."""
    if not saved or gpu.mig is None or not gpu.mig.enabled:
        return
    removed = {a.uuid for a in plan.actions if isinstance(a, RemoveMdev) and a.gpu == gpu.address}
    removed |= {a.vf for a in plan.actions if isinstance(a, SetVgpuType) and a.gpu == gpu.address and a.type_id == "0"}
    kept = []
    for e in saved:
        gi = next((i for i in gpu.mig.instances if i.profile_id == e["profile"] and i.placement.start == e["start"]), None)
        if gi is None:
            continue
        if gi.vgpu is None or set(gi.vgpus or [gi.vgpu]) <= removed:
            prof = gpu.mig.profile(gi.profile_id)
            plan.actions.append(DestroyGpuInstance(gpu=gpu.address, gpu_instance=gi.id, start=gi.placement.start,
                                                   profile=prof.name if prof else str(gi.profile_id)))
        else:
            kept.append(e)
    if kept != saved:
        plan.actions.append(SaveMigRecord(gpu=gpu.address, instances=kept))
