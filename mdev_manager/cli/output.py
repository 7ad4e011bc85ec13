"""Human-readable tables for the CLI (JSON and YAML come straight from the models)."""

from __future__ import annotations

from mdev_manager.actions import Plan
from mdev_manager.executor import Report
from mdev_manager.models import Blocked, Inventory


def table(rows: list[list[str]], header: list[str]) -> str:
    cols = [header, *rows]
    widths = [max(len(str(r[i])) for r in cols) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in cols)


def inventory_table(inv: Inventory, types: bool = False) -> str:
    rows = []
    for g in inv.gpus:
        vfs = f"{g.sriov_num_vfs}/{g.sriov_total_vfs}" if g.sriov_total_vfs else "-"
        rows.append([str(g.index), g.address, g.model, g.driver or "-", g.framework, vfs,
                     "-" if g.numa_node is None else str(g.numa_node),
                     "-" if g.iommu_group is None else str(g.iommu_group), str(len(g.vgpus))])
    out = [f"Node {inv.node}: {len(inv.gpus)} GPUs" + (" (iommufd)" if inv.iommufd else ""),
           table(rows, ["GPU", "ADDRESS", "MODEL", "DRIVER", "FRAMEWORK", "VFS", "NUMA", "IOMMU", "VGPUS"])]
    vgpus = [[str(next(g.index for g in inv.gpus if g.address == v.gpu)), v.id, v.type_name, v.framework, v.parent,
              "-" if v.iommu_group is None else str(v.iommu_group)] for v in inv.all_vgpus()]
    if vgpus:
        out += ["", table(vgpus, ["GPU", "VGPU", "TYPE", "FRAMEWORK", "PARENT", "IOMMU"])]
    for g in inv.gpus:
        offered = [t for t in g.types if not t.mig_backed]
        if not offered:
            continue
        if types:
            rows = [[t.id, t.name, f"{t.framebuffer_mib} MiB" if t.framebuffer_mib else "-",
                     f"{t.available_instances}/{t.max_instances or '?'}", t.framework] for t in g.types]
            out += ["", f"Types on GPU {g.index} ({g.address}):",
                    table(rows, ["ID", "NAME", "FRAMEBUFFER", "AVAILABLE", "FRAMEWORK"])]
        else:
            free = ", ".join(f"{t.short_name} {t.available_instances}" for t in offered if t.available_instances)
            out.append(f"GPU {g.index} can still create: {free or 'nothing'}")
    return "\n".join(out)


def plan_text(plan: Plan) -> str:
    lines = [f"{i + 1:3}. {a.describe()}" for i, a in enumerate(plan.actions)] or ["nothing to change"]
    lines += [f"  skipped {s.device}: {s.reason}" for s in plan.skipped]
    lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)


def report_text(report: Report) -> str:
    lines = []
    for r in report.results:
        mark = "ok" if r.ok else ("skipped" if r.skipped else f"FAILED {r.error}")
        lines.append(f"  [{mark}] {r.step}" + (f": {r.message}" if r.message and not r.ok else ""))
    return "\n".join(lines)


def blocked_text(blocked: list[Blocked]) -> str:
    """Which devices in use keep the node from the layout, held by whom, blocking what."""
    lines = ["Blocked by devices in use:"]
    for b in blocked:
        lines.append(f"  {b.device} on GPU {b.gpu}: held by {'; '.join(b.held_by)}")
        lines.append(f"    blocks {b.blocks}")
    return "\n".join(lines)
