"""The GPU-wide steps of a plan: a GPU passed through (vfio-pci), handed to DRA claims (``dra``), or
brought back to its native driver and VFs before vGPUs. Pure.

Nothing changes under a workload: a GPU is passed through only once nothing holds its vGPUs, its
IOMMU group, or a saved vGPU a libvirt domain names.
"""

from __future__ import annotations

from collections.abc import Sequence

from mdev_manager import catalog
from mdev_manager.actions import (
    BindDriver,
    DisableVfs,
    EnableVfs,
    Plan,
    RemoveDefinition,
    SaveMigRecord,
    SavePassthrough,
    SaveVendorRecord,
    Skip,
)
from mdev_manager.models import Gpu, MdevDefinition, Usage
from mdev_manager.offers import NVIDIA, native_driver
from mdev_manager.vgpusteps import clear_step, forget_step, kept_for_its_domain, named_dormant, vgpu_users


def group_users(gpu: Gpu, usage: Usage) -> list[str]:
    return usage.pci_users(gpu.address, gpu.iommu_group)


def prepare_for_vgpu(plan: Plan, gpu: Gpu, usage: Usage) -> bool:
    """Native driver and VFs first; True when the GPU needs another discovery before vGPUs."""
    native = native_driver(gpu)
    if gpu.driver == "vfio-pci" and group_users(gpu, usage):
        plan.skipped.append(Skip(device=gpu.address, reason=(
            f"passed through ({'; '.join(group_users(gpu, usage))}); returned to {native} when released")))
        return True
    if gpu.driver in (None, "vfio-pci") and native:
        drivers = gpu.iommu_group_drivers or {gpu.address: gpu.driver}
        for addr, driver in sorted(drivers.items()):
            if driver in (None, "vfio-pci"):
                plan.actions.append(BindDriver(gpu=gpu.address, address=addr, driver=None))
        return True
    drivers = gpu.iommu_group_drivers or {gpu.address: gpu.driver}
    # a companion function (the HDA audio) left on vfio-pci with the GPU back on its driver: a return
    # from passthrough stopped between the two rebinds (a killed agent, apply or unprepare)
    stray = sorted(a for a, d in drivers.items() if a != gpu.address and d == "vfio-pci")
    if stray and native:
        if users := group_users(gpu, usage):
            plan.skipped.append(Skip(device=stray[0], gpu=gpu.address, reason=(
                f"on vfio-pci ({'; '.join(users)}); returned to its native driver when released")))
        else:
            plan.actions += [BindDriver(gpu=gpu.address, address=a, driver=None) for a in stray]
            return True
    for addr, override in sorted(gpu.iommu_group_overrides.items()):
        if override == "vfio-pci" and drivers.get(addr) not in (None, "vfio-pci"):
            # left by an apply that stopped between driver_override and unbind: clear it, or the
            # function would go to vfio-pci at its next probe (a reboot, a driver reload)
            plan.actions.append(BindDriver(gpu=gpu.address, address=addr, driver=None))
    board = catalog.match_board(gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id)
    needs_vfs = gpu.sriov_total_vfs > 0 and (gpu.framework == "none" or (board and board.framework != "mdev"))
    if needs_vfs and gpu.sriov_num_vfs == 0 and gpu.vendor_id == NVIDIA:
        plan.actions.append(EnableVfs(gpu=gpu.address, count=gpu.sriov_total_vfs))
        return True
    return False


def plan_dra(plan: Plan, gpu: Gpu, usage: Usage, definitions: Sequence[MdevDefinition],
              records: dict[str, str]) -> None:
    """A ``dra`` GPU's vGPUs are its claims': what an earlier layout saved on it goes, so the
    layout and a claim never name one device (a dormant record would take a claim's VF back at the
    next restore) and no vGPU outside the DRA accounting takes the GPU's capacity. Unused saved
    vGPUs are removed with their definitions or records, dormant ones forgotten; one in use stays
    (blocked) until released; a claim's is never touched."""
    parents = {gpu.address, *(vf.address for vf in gpu.vfs)}
    defs = {d.uuid: d for d in definitions if d.parent in parents}
    recs = {vf: t for vf, t in records.items() if vf in parents}
    present = {v.id for v in gpu.vgpus}
    for v in gpu.vgpus:
        if v.id not in (defs if v.framework == "mdev" else recs):
            continue  # not the layout's: a claim's, or nobody's to touch
        if usage.claims_of(v.id):  # the claim's device: only the layout's record of it goes
            plan.actions.append(forget_step(gpu, v))
        elif users := vgpu_users(v, usage):
            plan.skipped.append(Skip(device=v.id, reason=f"not removed: in use ({'; '.join(users)})"))
        else:
            plan.actions += [clear_step(gpu, v), forget_step(gpu, v)]
    for d in defs.values():
        if d.uuid not in present and not kept_for_its_domain(plan, gpu, d.uuid, usage, mdev=True):
            plan.actions.append(RemoveDefinition(gpu=gpu.address, parent=d.parent, uuid=d.uuid))
    for vf in sorted(recs):
        if vf not in present and not kept_for_its_domain(plan, gpu, vf, usage, mdev=False):
            plan.actions.append(SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=None))


def plan_passthrough_record(plan: Plan, gpu: Gpu, mode: str, saved: dict[str, str]) -> None:
    """What ``restore`` rebinds after a reboot: a passthrough GPU's functions already on vfio-pci
    (a bind step records the others itself), and nothing of a GPU the layout hands back (unmanaged;
    other modes rebind it to its native driver, which forgets it)."""
    drivers = gpu.iommu_group_drivers or {gpu.address: gpu.driver}
    if mode == "passthrough":
        for fn, driver in sorted(drivers.items()):
            if driver == "vfio-pci" and saved.get(fn) != gpu.address:
                plan.actions.append(SavePassthrough(gpu=gpu.address, address=fn, keep=True))
    elif mode == "unmanaged":
        for fn in sorted(f for f, g in saved.items() if g == gpu.address):
            plan.actions.append(SavePassthrough(gpu=gpu.address, address=fn, keep=False))


def plan_passthrough(plan: Plan, gpu: Gpu, usage: Usage, definitions: Sequence[MdevDefinition],
                      records: dict[str, str], mig_record: list[dict] | None = None) -> None:
    """Everything of the GPU's vGPUs goes (definitions, records, the record of their GPU instances:
    ``mig_record``), then its VFs, then it is bound to vfio-pci; nothing while any of it is held."""
    parents = {gpu.address, *(vf.address for vf in gpu.vfs)}
    if gpu.sriov_total_vfs and not gpu.vfs:
        # VFs gone (a reboot): their saved vGPUs sit on the PF's bus, as restore assumes; forget
        # them too, or restore would enable VFs on the passed-through GPU and re-create them
        bus = gpu.address.rsplit(":", 1)[0]
        parents |= {p for p in [d.parent for d in definitions] + list(records) if p.rsplit(":", 1)[0] == bus}
    busy = [v for v in gpu.vgpus if vgpu_users(v, usage)]
    # a saved vGPU without a device that a domain names is the domain's: kept saved, and the GPU not
    # rebound under it (the domain could never start again)
    named = named_dormant(gpu, parents, definitions, records, usage)
    if busy or named:  # nothing changes under a workload: the GPU is passed through once they are released
        for v in busy:
            plan.skipped.append(Skip(device=v.id, reason=f"in use ({'; '.join(vgpu_users(v, usage))})"))
        for key, (_, users) in named.items():
            plan.skipped.append(Skip(device=key, gpu=gpu.address, held_by=users, reason=(
                f"passing GPU {gpu.address} through: the layout wants the whole GPU; this saved vGPU stays saved, "
                "not forgotten")))
        held = [f"{len(busy)} vGPU(s) in use"] * bool(busy) + [f"{len(named)} saved vGPU(s) a domain names"] * bool(named)
        plan.skipped.append(Skip(device=gpu.address, reason=f"passed through once its {' and '.join(held)} are released"))
        return
    drivers = gpu.iommu_group_drivers or {gpu.address: gpu.driver}
    if any(d != "vfio-pci" for d in drivers.values()) and (users := group_users(gpu, usage)):
        # a VF or a companion function of its group is held (vfio: one owner per group): the
        # kernel would refuse the VF disable or the unbind, so nothing is tried under it
        plan.skipped.append(Skip(device=gpu.address, reason=f"passed through once released ({'; '.join(users)})"))
        return
    plan.actions += [clear_step(gpu, v) for v in gpu.vgpus]
    for d in definitions:
        if d.parent in parents:
            plan.actions.append(RemoveDefinition(gpu=gpu.address, parent=d.parent, uuid=d.uuid))
    for vf in sorted(set(records) & parents):
        plan.actions.append(SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=None))
    if mig_record:
        # the GPU instances held the vGPUs just forgotten: nothing wants them back. Kept, restore
        # found them missing for good (exit 3): NVML is the nvidia driver's library and lists no GPU
        # bound to vfio-pci (discovery asks it about GPUs on nvidia only), so no MIG state is seen
        plan.actions.append(SaveMigRecord(gpu=gpu.address, instances=[]))
    if gpu.sriov_num_vfs:
        plan.actions.append(DisableVfs(gpu=gpu.address))
    drivers = gpu.iommu_group_drivers or {gpu.address: gpu.driver}
    for addr, driver in sorted(drivers.items()):
        if driver != "vfio-pci":
            plan.actions.append(BindDriver(gpu=gpu.address, address=addr, driver="vfio-pci"))
