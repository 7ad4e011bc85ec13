"""Human-readable text for the CLI (JSON and YAML come straight from the models).

Admins think in type names (``T4-2Q``), the kernel in ids (``nvidia-231``, vendor-VFIO ``1152``):
steps are worded with :class:`TypeNames`, which shows the id beside the name only when asked
(``--show-ids``).
"""

from __future__ import annotations

from collections.abc import Iterable

from mdev_manager.actions import CreateMdev, Plan, SaveDefinition, SaveVendorRecord, SetPlacement, SetVgpuType
from mdev_manager.executor import Report, StepResult
from mdev_manager.models import Gpu, Inventory
from mdev_manager.plan import offered_types
from vgpuctl.output.tables import fit, fit_lines, short_model

SLOT_MAP_WIDTH = 64  # marks per GPU row: a 94 GiB GPU gets one mark per 2 GiB, and fits in 80 columns


def table(rows: list[list[str]], header: list[str]) -> str:
    """A plain table at its natural width (:func:`vgpuctl.output.tables.fit` folds to 80 columns)."""
    cols = [header, *rows]
    widths = [max(len(str(r[i])) for r in cols) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in cols)


def inventory_table(inv: Inventory, types: bool = False, wide: bool = False) -> str:
    """The node's GPUs, vGPUs and MIG instances in 80 columns (models and type names shortened, the
    vGPUs' framework left to the GPU's row); ``wide``: full names, every column."""
    model = (lambda g: g.model) if wide else (lambda g: short_model(g.model))  # noqa: E731
    rows = []
    for g in inv.gpus:
        vfs = f"{g.sriov_num_vfs}/{g.sriov_total_vfs}" if g.sriov_total_vfs else "-"
        rows.append([str(g.index), g.address, model(g), g.driver or "-", g.framework, vfs,
                     "-" if g.numa_node is None else str(g.numa_node),
                     "-" if g.iommu_group is None else str(g.iommu_group), str(len(g.vgpus))])
    out = [f"Node {inv.node}: {len(inv.gpus)} GPUs" + (f", {len(inv.gone)} off the bus" if inv.gone else "")
           + (" (iommufd)" if inv.iommufd else ""),
           fit(["GPU", "ADDRESS", "MODEL", "DRIVER", "FRAMEWORK", "VFS", "NUMA", "IOMMU", "VGPUS"], rows,
               fold=("MODEL",), wide=wide)]
    out += [fit_lines(f"GPU {inv.gone_numbers.get(a, '?')} {a}: off the bus; the layout entries naming it wait "
                      "for it (apply exits 3 until it is back)") for a in inv.gone]
    index = {g.address: g.index for g in inv.gpus}
    gpus = {g.address: g for g in inv.gpus}
    placed = any(v.placement_id is not None for v in inv.all_vgpus())

    def slots(v) -> list[str]:  # the slots a mixed-size vGPU holds
        return [_slots_of(gpus[v.gpu], v.type_id, v.placement_id)] if placed else []

    if wide:
        vgpus = [[str(index[v.gpu]), v.id, v.type_name, v.framework, v.parent,
                  "-" if v.iommu_group is None else str(v.iommu_group), *slots(v)] for v in inv.all_vgpus()]
        head = ["GPU", "VGPU", "TYPE", "FRAMEWORK", "PARENT", "IOMMU"]
    else:
        vgpus = [[str(index[v.gpu]), v.id, short_type(v.type_name), v.parent,
                  "-" if v.iommu_group is None else str(v.iommu_group), *slots(v)] for v in inv.all_vgpus()]
        head = ["GPU", "VGPU", "TYPE", "PARENT", "IOMMU"]
    if vgpus:
        out += ["", fit(head + (["SLOTS"] if placed else []), vgpus, fold=("TYPE",), wide=wide)]
    mig = [[str(g.index), str(i.id), p.name if (p := g.mig.profile(i.profile_id)) else str(i.profile_id),
            f"{i.placement.start}:{i.placement.size}",
            (i.vgpu or "-") + (f" (+{len(i.vgpus) - 1} sharing it)" if len(i.vgpus) > 1 else "")]
           for g in inv.gpus if g.mig and g.mig.enabled for i in g.mig.instances]
    modes = [f"GPU {g.index}: MIG mode {'on' if g.mig.enabled else 'off'}"
             + (f" (pending {'on' if g.mig.pending else 'off'})" if g.mig.pending != g.mig.enabled else "")
             for g in inv.gpus if g.mig]
    if modes:
        out += ["", fit_lines("; ".join(modes))]
    if mig:
        out += [fit(["GPU", "GPU INSTANCE", "PROFILE", "PLACEMENT", "VGPU"], mig, wide=wide)]
    sizes = [f"GPU {g.index}: {'mixed' if g.placements.enabled else 'equal'}-size mode" for g in inv.gpus
             if g.placements is not None]
    if sizes:
        out += ["", fit_lines("; ".join(sizes))]
    maps = [slot_map_line(g) for g in inv.gpus if g.placements is not None and g.placements.enabled]
    if maps:
        out += ["Mixed-size slots (1 GiB each unless noted; '.' free):", *maps]
    for g in inv.gpus:
        offered = [t for t in g.types if not t.mig_backed or (g.mig and g.mig.enabled)]
        if not offered:
            continue
        if types:
            rows = [[t.id, t.name, f"{t.framebuffer_mib} MiB" if t.framebuffer_mib else "-",
                     f"{t.available_instances}/{t.max_instances or '?'}", t.framework] for t in g.types]
            head = ["ID", "NAME", "FRAMEBUFFER", "AVAILABLE", "FRAMEWORK"]
            if any(t.inferred for t in g.types):  # only boards whose catalog entry infers something
                head.append("INFERRED")
                rows = [[*r, ",".join(t.inferred) or "-"] for r, t in zip(rows, g.types, strict=True)]
            out += ["", f"Types on GPU {g.index} ({g.address}):", fit(head, rows, fold=("NAME",), wide=wide)]
            for note in (inferred_note(g), placeholder_note(g)):
                if note:
                    out.append(fit_lines(note))
        else:
            free = ", ".join(f"{t.short_name} {t.available_instances}" for t in offered if t.available_instances)
            line = f"GPU {g.index} can still create: {free or 'nothing'}"
            out.append(line if wide else fit_lines(line))
    return "\n".join(out)


def inferred_note(g: Gpu) -> str | None:
    """Which of the board's facts come from vgpuctl's catalog by inference, not from a source."""
    if not g.inferred:
        return None
    return (f"GPU {g.index}: vgpuctl's catalog infers {', '.join(g.inferred)} of this board (the driver's own "
            "values win on a real host; vgpuctl nvml-probe compares them)")


def placeholder_note(g: Gpu) -> str | None:
    """Types whose id NVIDIA publishes nowhere: the catalog's id is a placeholder or a guess, so the
    type's id (and on a real host the whole type list) is the driver's, never the catalog's."""
    ids = [t.id for t in g.types if "id" in t.inferred]
    if not ids:
        return None
    return (f"GPU {g.index}: NVIDIA publishes no id for the {len(ids)} type(s) marked 'id' ({', '.join(ids[:3])}"
            f"{', ...' if len(ids) > 3 else ''}): the catalog's are placeholders; a real host's types and ids "
            "come from its driver only")


def _slots_of(g: Gpu, type_id: str, placement: int | None) -> str:
    tp = g.placements.types.get(type_id) if g.placements else None
    if placement is None:
        return "-"
    return f"{placement}-{placement + tp.size - 1}" if tp else str(placement)


def slot_map_line(g: Gpu) -> str:
    """One GPU's slots as a row of marks, each vGPU a bracket labelled with its size:
    ``GPU 0 |[24Q---------------------][8Q----][4Q][4Q][8Q----]|``. Past SLOT_MAP_WIDTH slots a mark
    stands for about k GiB, and a vGPU keeps room for its label (two 5 GiB vGPUs at 2 GiB a mark
    are ``[5C][5C]``, not ``[5][]``): the marks go to the segments by size, each at least its label's
    width, taken from the widest."""
    smap = g.placements
    n = smap.slots if smap else 0
    k = max(1, -(-n // SLOT_MAP_WIDTH))
    width = -(-n // k)
    segments: list[tuple[int, str | None]] = []  # (slots, label; None: free)
    end = 0
    for v in sorted(g.vgpus, key=lambda v: v.placement_id if v.placement_id is not None else -1):
        tp = smap.types.get(v.type_id) if smap else None
        if v.placement_id is None or tp is None or v.placement_id < end:
            continue
        if v.placement_id > end:
            segments.append((v.placement_id - end, None))
        segments.append((tp.size, short_type(v.type_name).rsplit("-", 1)[-1]))
        end = v.placement_id + tp.size
    if end < n:
        segments.append((n - end, None))
    marks = _allot_marks(segments, width, k)
    cells = []
    for (_, label), span in zip(segments, marks, strict=True):
        if label is None:
            cells.append("." * span)
        elif span >= 2:
            cells.append("[" + label[:span - 2].ljust(span - 2, "-") + "]")
        else:
            cells.append("|" * span)
    scale = f" (~{k} GiB per mark)" if k > 1 else ""
    return f"  GPU {g.index} |{''.join(cells)}|{scale}"


def _allot_marks(segments: list[tuple[int, str | None]], width: int, k: int) -> list[int]:
    """Marks per segment, ``width`` in all: its size / ``k`` (largest remainders), raised to its
    label's width ([label], or one mark free) where the row has room, the marks taken from the
    segments with the most to spare."""
    ideal = [size / k for size, _ in segments]
    marks = [int(x) for x in ideal]
    for i in sorted(range(len(segments)), key=lambda i: ideal[i] - marks[i], reverse=True)[:width - sum(marks)]:
        marks[i] += 1
    least = [1 if label is None else len(label) + 2 for _, label in segments]
    if sum(least) > width:  # no room for every label: the proportional row
        return marks
    for i, need in enumerate(least):
        while marks[i] < need:
            spare = max(range(len(marks)), key=lambda j: (marks[j] - least[j], marks[j]))
            if marks[spare] <= least[spare]:
                break
            marks[spare] -= 1
            marks[i] += 1
    return marks


def report_text(report: Report) -> str:
    return "\n".join(result_line(r.step, r) for r in report.results)


# ------------------------------------------------------------------ type names

def short_type(type_name: str) -> str:
    """``GRID T4-2Q`` -> ``T4-2Q``: the name a layout uses."""
    return type_name.split()[-1] if type_name.strip() else type_name


class TypeNames:
    """Type id -> short name, per GPU (ids are the driver's, names what the admin wrote)."""

    def __init__(self, inventories: Iterable[Inventory | None], show_ids: bool = False):
        self.show_ids = show_ids
        self._by_gpu: dict[tuple[str, str], str] = {}
        self._any: dict[str, str] = {}
        for inv in inventories:
            for g in inv.gpus if inv else []:
                # before its VFs are enabled a GPU offers nothing yet: the catalog names its types
                for t in [*g.types, *(t for p in g.parents for t in p.types), *offered_types(g)]:
                    self._by_gpu.setdefault((g.address, t.id), t.short_name)
                    self._any.setdefault(t.id, t.short_name)
                for v in g.vgpus:
                    self._by_gpu.setdefault((g.address, v.type_id), short_type(v.type_name))

    def __call__(self, gpu: str, type_id: str) -> str:
        name = self._by_gpu.get((gpu, type_id)) or self._any.get(type_id)
        if name is None:
            return type_id
        return f"{name} ({type_id})" if self.show_ids else name


def step_text(a, names: TypeNames) -> str:
    """One step as the admin reads it: type names instead of the kernel's ids."""
    if isinstance(a, CreateMdev):
        return f"create mdev {a.uuid} of type {names(a.gpu, a.type_id)} on {a.parent}"
    if isinstance(a, SaveDefinition):
        return f"persist mdev {a.uuid} of type {names(a.gpu, a.type_id)} on {a.parent}"
    if isinstance(a, SetVgpuType) and a.type_id != "0":
        return f"set VF {a.vf} to vGPU type {names(a.gpu, a.type_id)}"
    if isinstance(a, SaveVendorRecord) and a.type_id:
        return f"persist VF {a.vf} as type {names(a.gpu, a.type_id)}"
    if isinstance(a, SetPlacement):
        return (f"place {names(a.gpu, a.type_id)} {a.vgpu} at slot {a.placement} "
                f"(slots {a.placement}-{a.placement + a.size - 1})")
    return a.describe()


def steps_text(plan: Plan, names: TypeNames) -> str:
    """The numbered steps of a plan (``plan -v``)."""
    return "\n".join(f"{i + 1:3}. {step_text(a, names)}" for i, a in enumerate(plan.actions)) or "  nothing to change"


def result_line(text: str, r: StepResult) -> str:
    mark = "ok" if r.ok else ("skipped" if r.skipped else f"FAILED {r.error}")
    return f"  [{mark}] {text}" + (f": {r.message}" if r.message and not r.ok else "")


def results_text(plan: Plan, report: Report, names: TypeNames) -> str:
    """Each step with its result (``apply -v``); the steps are the plan's, one result each."""
    lines = [result_line(step_text(a, names), r) for a, r in zip(plan.actions, report.results, strict=False)]
    return "\n".join(lines) or "  nothing to change"
