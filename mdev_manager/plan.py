"""Decide what to change: a pure function from (inventory, layout, usage, saved state) to a Plan.

Nothing here touches the host, so every rule (in-use protection, adoption, equal-size
mode, crash recovery) is tested on plain data. The rules:

* Existing vGPUs that match the layout stay; nothing is cleared and re-created.
* An extra vGPU is removed only when nothing uses it; otherwise it stays and is reported.
* A definition is written before its device is created, and the device removed before its
  definition, so a crash at any point leaves saved state the next plan completes
  (a definition without a device is started again, or forgotten if no longer wanted).
* Steps that change what a GPU offers (driver, VFs) are structural: the reconciler runs
  them, discovers again and plans the vGPUs on the new state.

:func:`make_plan` checks the whole layout first, then hands each GPU to the planner of its mode:
which GPUs an entry selects (:mod:`.selection`), what each entry asks of its GPU
(:mod:`.layoutcheck`, over :mod:`.offers`), GPU-wide steps (:mod:`.modeplan`: passthrough, ``dra``,
the native driver), and the vGPUs: equal-size (:mod:`.equalplan`), mixed-size (:mod:`.placeplan`),
MIG-backed (:mod:`.migplan`). The names those modules offer are importable from here too.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Sequence

from mdev_manager.actions import Plan, SavePlacementRecord
from mdev_manager.config import ConfigError, GpuLayout, layout_error
from mdev_manager.equalplan import plan_mdev, plan_vendor
from mdev_manager.layoutcheck import once_per_field, validate_layout, workload_conflicts
from mdev_manager.migplan import forget_layout_instances, plan_mig, switch_mig_mode
from mdev_manager.models import Gpu, Inventory, MdevDefinition, Usage
from mdev_manager.modeplan import group_users, plan_dra, plan_passthrough, plan_passthrough_record, prepare_for_vgpu
from mdev_manager.offers import NVIDIA, gpu_label, native_driver, offered_types, resolve_type, size_mode
from mdev_manager.placeplan import plan_placed, preview, switch_mixed
from mdev_manager.selection import select_gpus, try_select, waiting_entries
from mdev_manager.vgpusteps import vgpu_users

# what callers across the repository import from here (each lives in the module named above)
__all__ = [
    "NVIDIA", "group_users", "make_plan", "native_driver", "offered_types", "resolve_type", "select_gpus",
    "size_mode", "validate_layout", "vgpu_users", "waiting_entries",
]


def make_plan(
    inv: Inventory,
    layouts: list[GpuLayout],
    usage: Usage | None = None,
    definitions: Sequence[MdevDefinition] = (),
    vendor_records: dict[str, str] | None = None,
    new_uuid: Callable[[], str] = lambda: str(uuidlib.uuid4()),
    passthrough: dict[str, str] | None = None,
    mig_records: dict[str, list[dict]] | None = None,
    placement_records: dict[str, dict] | None = None,
) -> Plan:
    """The ordered steps that take the node to ``layouts``. Raises ConfigError before any step on bad input."""
    usage = usage or Usage()
    # every problem at once: the selectors', then those of each entry that did select its GPUs
    chosen, problems, waiting = try_select(inv, layouts)
    wanted: dict[str, dict[str, int]] = {}
    gpus: dict[str, Gpu] = {}
    selects: dict[str, int] = {}  # an entry's vgpus field -> how many GPUs it selects
    for i, entry in enumerate(layouts):
        selects[entry.at(i, "vgpus")] = sum(1 for e in chosen.values() if e is entry)
        for addr, e in chosen.items():
            if e is not entry:
                continue
            gpu = inv.gpu(addr)
            assert gpu is not None  # chosen from inv.gpus
            gpus[addr] = gpu
            try:
                if e.mig_mode is not None and e.mode != "dra":
                    problems.append(f"{e.at(i, 'mig_mode')}: only dra mode takes migMode; in vgpu mode the "
                                    "MIG-backed types in vgpus put the GPU in MIG mode")
                if e.mode in ("vgpu", "dra"):
                    wanted[addr] = validate_layout(gpu, e, i)
                problems += workload_conflicts(gpu, e, usage, i)
            except ConfigError as exc:
                problems += exc.problems
    if problems:
        raise layout_error(once_per_field(problems, selects), layouts)  # named as the file writes them
    plan = Plan(waiting=waiting)
    for addr, entry in chosen.items():
        gpu = gpus[addr]
        mixed_record = (placement_records or {}).get(addr)
        if passthrough is not None:
            plan_passthrough_record(plan, gpu, entry.mode, passthrough)
        if mixed_record and not (entry.mixed_size and entry.mode in ("vgpu", "dra")):
            plan.actions.append(SavePlacementRecord(gpu=addr, mixed=False))  # restore no longer sets the mode
        if entry.mode == "passthrough":
            plan_passthrough(plan, gpu, usage, definitions, vendor_records or {}, (mig_records or {}).get(addr))
        elif entry.mode in ("vgpu", "dra"):
            if prepare_for_vgpu(plan, gpu, usage):
                plan.notes += preview(gpu, entry, offered_types(gpu), wanted.get(addr, {}))
                continue
            if entry.mode == "dra":  # the DRA bridge creates vGPUs per claim
                if isinstance(entry.mig_mode, bool) and gpu.mig is not None and gpu.mig.enabled != entry.mig_mode:
                    switch_mig_mode(plan, gpu, usage, definitions, vendor_records or {}, entry.mig_mode)
                    continue
                if entry.mixed_size and not gpu.mixed_size:
                    switch_mixed(plan, gpu, usage, definitions, vendor_records or {}, mixed_record)
                    plan.notes += preview(gpu, entry, offered_types(gpu), wanted.get(addr, {}))
                    continue
                plan_dra(plan, gpu, usage, definitions, vendor_records or {})
                forget_layout_instances(plan, gpu, (mig_records or {}).get(addr))
                if entry.mixed_size and (not mixed_record or not mixed_record.get("mixed") or mixed_record.get("vgpus")):
                    plan.actions.append(SavePlacementRecord(gpu=addr, mixed=True))  # claims' vGPUs are the plugin's
                continue
            if gpu.mig is not None and plan_mig(plan, gpu, wanted[addr], usage, definitions, vendor_records or {},
                                                (mig_records or {}).get(addr), new_uuid):
                continue
            if entry.mixed_size and not gpu.mixed_size:
                switch_mixed(plan, gpu, usage, definitions, vendor_records or {}, mixed_record)
                plan.notes += preview(gpu, entry, offered_types(gpu), wanted[addr])
                continue
            if gpu.mixed_size and gpu.placements is not None and gpu.framework != "none":
                plan_placed(plan, gpu, wanted[addr], usage, definitions, vendor_records or {}, mixed_record,
                            record=entry.mixed_size, new_uuid=new_uuid)
            elif gpu.framework in ("mdev", "mdev-sriov"):
                plan_mdev(plan, gpu, wanted[addr], usage, definitions, new_uuid)
            elif gpu.framework == "vendor-vfio":
                plan_vendor(plan, gpu, wanted[addr], usage, vendor_records or {})
            elif any(wanted[addr].values()):
                plan.notes.append(f"{gpu_label(gpu)}: offers no vGPU types with driver {gpu.driver}; nothing to create")
    return plan
